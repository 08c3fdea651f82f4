"""One actor connection, for every transport: hello, connect, welcome, steps and replies, refusal, close.

``serve_connection`` is the whole conversation; a transport supplies only its ``Framing``: how a hello
and a step arrive, how a welcome, a reply and the end are put on its wire, how a refusal is told. It
is an async generator of the messages to send, so that a stream API (gRPC's async generator of
replies, cheaper per message than ``context.write``) yields them on unchanged; ``send_connection``
serves a framing that sends its own messages (shared memory, in-process).

Every connection ends the same way: a refused hello or step is logged once per peer and kind
(``RefusalLog``) and told to the peer with its status code, and the session, once there is one, is
closed whatever ended the connection (the actor gone, a refusal, training over, an error).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

from lockstep.transport.codec import CodecError
from lockstep.transport.messages import HelloInfo, StepData
from lockstep.transport.protocol import INVALID_ARGUMENT, ActorHandler, RefusalLog, Refused, Reply, Welcome


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


async def serve_connection(framing: Framing, handler: ActorHandler, refusals: RefusalLog,
                           codec: CodecClock) -> AsyncIterator[Any]:
    """Serve one actor through ``framing`` for ``handler``; yield each message to send, in order."""
    who = framing.peer
    hello = session = None
    try:
        try:
            hello = await framing.hello()
            if hello is None:
                return
            who = f"actor {hello.actor_id}"
            session, welcome = handler.connect(hello)
            yield framing.welcome(hello, welcome)
            decode, encode, step, clock = framing.decode, framing.reply, session.step, time.perf_counter  # per step
            async for message in framing.incoming:
                start = clock()
                data = decode(message, hello)
                codec.seconds += clock() - start
                reply = await step(data)
                if reply is None:
                    over = framing.over()
                    if over is not None:
                        yield over
                    return
                start = clock()
                message = encode(reply)
                codec.seconds += clock() - start
                yield message
            return  # the peer left
        except Refused as err:
            refusal = err.code, str(err)
        except CodecError as err:
            refusal = INVALID_ARGUMENT, f"hello: {err}" if hello is None else f"{who}: {err}"
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
                          codec: CodecClock) -> None:
    """``serve_connection`` for a framing that sends its own messages; the session is closed before this returns."""
    async with contextlib.aclosing(serve_connection(framing, handler, refusals, codec)) as messages:
        async for message in messages:
            await framing.send(message)
