"""One actor connection, for every transport: hello, connect, welcome, steps and replies, refusal, close.

``serve_connection`` is the whole conversation; a transport supplies only its ``Framing``: how a hello
and a step arrive, how a welcome, a reply and the end are put on its wire, how a refusal is told. It
is an async generator of the messages to send, so that a stream API (gRPC's async generator of
replies, cheaper per message than ``context.write``) yields them on unchanged; ``send_connection``
serves a framing that sends its own messages (shared memory, in-process).

Every connection ends the same way: a refused hello or step is logged once per peer and kind
(``RefusalLog``) and told to the peer with its status code, and the session, once there is one, is
closed whatever ended the connection (the actor gone, a refusal, training over, an error).

Whose fault: this loop is the one place that decides. What the peer sent is checked by the framing and
the handler, which raise ``Refused`` (or ``CodecError``): that peer is refused, and the learner goes on.
Any other exception raised while the learner's own code serves the connection (the handler's ``connect``
and ``step``: inference, the books; encoding the reply) is a learner failure: ``handler.fail`` ends the run
with it, and this peer, every other one, and every hello from then on are refused with INTERNAL and the
learner's error, so that actors stop instead of reconnecting to a learner that fails the same way each
time. What the framing itself raises (an in-process actor's env, a peer gone mid-send) stays the framing's.

Deadlines: a peer that has not said hello within ``hello_timeout_s`` is refused with DEADLINE_EXCEEDED.
From the welcome on, the loop stamps the session's ``owed_since`` whenever the learner has answered and
waits for the peer (cleared when its next step arrives): the learner's step deadline evicts a session
that owes a step for too long, and its connection ends here with DEADLINE_EXCEEDED and the reason.

Open files: ``reserve_descriptors`` raises the process's soft RLIMIT_NOFILE so that a server's
connection cap fits beside the learner's own files (checkpoints, logs, the libraries' descriptors).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

from lockstep.transport.codec import CodecError
from lockstep.transport.messages import HelloInfo, StepData
from lockstep.transport.protocol import (
    DEADLINE_EXCEEDED,
    INTERNAL,
    INVALID_ARGUMENT,
    ActorHandler,
    RefusalLog,
    Refused,
    Reply,
    Welcome,
)

log = logging.getLogger(__name__)

DEFAULT_HELLO_TIMEOUT_S = 30.0
DEFAULT_MAX_CONNECTIONS = 1024  # on each of the gRPC port and the unix socket (learner.max_connections)
FILES_MARGIN = 256  # descriptors kept free beside the connections: checkpoints, logs, event files, libraries


class Framing(Protocol):
    """One connection's wire. Messages arrive through ``hello`` and iterating ``incoming``; what
    ``welcome``, ``reply`` and ``over`` return is yielded by ``serve_connection`` (or passed to ``send``).
    A problem with what the peer sent is a ``Refused`` (or a ``CodecError``: INVALID_ARGUMENT)."""

    peer: str  # who is on the other end, for the log, until its hello names the actor

    async def hello(self) -> HelloInfo | None:
        """The peer's hello, decoded; None: the peer left before sending one."""

    def welcome(self, hello: HelloInfo, welcome: Welcome) -> Any:
        """The accepted hello's answer, as this wire sends it."""

    @property
    def incoming(self) -> AsyncIterator[Any]:
        """The messages after the hello, as they arrive; it ends when the peer does."""

    def decode(self, message: Any, hello: HelloInfo) -> StepData:
        """One arrived message as a step, validated against ``hello`` (timed as codec work)."""

    def reply(self, reply: Reply) -> Any:
        """A step's answer (actions, or retry when ``reply.actions`` is None) on this wire (timed as codec work)."""

    def over(self) -> Any | None:
        """What tells the peer that training is over; None: ending the connection says it."""

    async def refuse(self, code: str, message: str) -> None:
        """Tell the peer why its connection ends (a protocol.py code name)."""

    def close(self) -> None:
        """Release what the connection holds; called once, however it ended."""


class CodecClock:
    """Seconds a transport spent decoding steps and encoding replies (summary.json's time split)."""

    def __init__(self) -> None:
        self.seconds = 0.0


async def serve_connection(framing: Framing, handler: ActorHandler, refusals: RefusalLog, codec: CodecClock,
                           hello_timeout_s: float = DEFAULT_HELLO_TIMEOUT_S) -> AsyncIterator[Any]:
    """Serve one actor through ``framing`` for ``handler``; yield each message to send, in order."""
    who = framing.peer
    hello = session = None
    ours = False  # the learner's own code runs: what it raises (but a Refused) is a learner failure
    try:
        try:
            try:
                async with asyncio.timeout(hello_timeout_s):
                    hello = await framing.hello()
            except TimeoutError:
                raise Refused(DEADLINE_EXCEEDED, f"no hello within {hello_timeout_s:g} s "
                              "(learner.hello_timeout_s)") from None
            if hello is None:
                return
            who = f"actor {hello.actor_id}"
            if handler.failure is not None:
                raise Refused(INTERNAL, handler.failure)
            ours = True
            session, welcome = handler.connect(hello)
            ours = False
            decode, encode, step, clock = framing.decode, framing.reply, session.step, time.perf_counter  # per step
            session.owed_since = clock()
            yield framing.welcome(hello, welcome)
            async for message in framing.incoming:
                start = clock()
                session.owed_since = None
                data = decode(message, hello)
                codec.seconds += clock() - start
                ours = True
                reply = await step(data)
                if reply is None:
                    if handler.failure is not None:  # the learner failed while this request was held
                        raise Refused(INTERNAL, handler.failure)
                    over = framing.over()
                    if over is not None:
                        yield over
                    return
                start = clock()
                message = encode(reply)
                ours = False
                session.owed_since = end = clock()  # from here the peer owes the next step (sending counts too)
                codec.seconds += end - start
                yield message
            return  # the peer left
        except Refused as err:
            refusal = err.code, str(err)
        except CodecError as err:
            refusal = INVALID_ARGUMENT, f"hello: {err}" if hello is None else f"{who}: {err}"
        except asyncio.CancelledError:
            if session is None or session.evicted is None:
                raise
            asyncio.current_task().uncancel()  # the step deadline ended it: tell the peer why
            refusal = DEADLINE_EXCEEDED, session.evicted
        except Exception as err:
            if not ours:
                raise
            refusal = INTERNAL, handler.fail(err)  # logged there, once for the run
        if refusal[0] != INTERNAL:  # a learner failure is logged once, not once per peer
            refusals(who, *refusal)
        await framing.refuse(*refusal)
    finally:
        if session is not None:
            session.close()
        framing.close()


class SendingFraming(Framing, Protocol):
    async def send(self, message: Any) -> None:
        """Put one message that ``serve_connection`` yielded on the wire."""


async def send_connection(framing: SendingFraming, handler: ActorHandler, refusals: RefusalLog,
                          codec: CodecClock, hello_timeout_s: float = DEFAULT_HELLO_TIMEOUT_S) -> None:
    """``serve_connection`` for a framing that sends its own messages; the session is closed before this returns."""
    async with contextlib.aclosing(serve_connection(framing, handler, refusals, codec, hello_timeout_s)) as messages:
        async for message in messages:
            await framing.send(message)


_reserved = 0  # descriptors the running servers of this process have reserved for their connections


def reserve_descriptors(count: int, what: str) -> None:
    """Make room for ``count`` more open files (``what``'s connection cap): raise the soft RLIMIT_NOFILE to
    the files open now, plus every reservation, plus ``FILES_MARGIN``; warn when the hard limit is lower.
    ``release_descriptors`` gives the reservation back (the limit stays where it is)."""
    global _reserved
    _reserved += count
    try:
        import resource
    except ImportError:  # not a POSIX system: nothing to raise
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = _open_files() + _reserved + FILES_MARGIN
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        log.info("raised the open-file limit from %d to %d for %s", soft, target, what)
    if target < need:
        log.warning("the open-file limit's hard limit (%d) is below the %d that %s and the learner's own files may "
                    "need; lower learner.max_connections or raise the hard limit (ulimit -Hn)", hard, need, what)


def release_descriptors(count: int) -> None:
    global _reserved
    _reserved = max(0, _reserved - count)


def _open_files() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 64  # no /proc: a guess at a fresh interpreter's descriptors
