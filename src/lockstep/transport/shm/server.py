"""The learner's same-host transport: shared memory for the arrays, a unix socket for wake-ups.

For actors on the learner's machine. Each actor's observations, outcomes and actions live in a
region of shared memory that the learner allocates at the hello (``shm_layout``: the layout, the
frames, and who writes which field when); the socket carries the hello, the welcome with the
region's file descriptor, and one 12-byte frame per step and per reply. Arrays are never
serialized, and nothing is polled: the event loop wakes on the socket.

It serves the same ``ActorHandler`` as the gRPC server, through the same connection loop
(``connection.serve_connection``; this module is its framing, ``ShmFraming``), with the same checks:
the hello and its protocol version, every step validated by ``messages.check_step`` after it has
been copied out of the region, refusals with the same codes. A connection's end (EOF, reset, the actor
killed) ends its session at once, also while its request is held, as a cancelled gRPC stream does.

Bounds: at most ``max_connections`` connections at once (one more is sent a RESOURCE_EXHAUSTED refusal
and closed); a client that has not said hello within ``hello_timeout_s`` is refused (the connection loop's
deadline). Replies are written without waiting: a real actor reads each reply before it sends its next
step, so a full socket buffer means a peer that does not read, and its connection is dropped (a refusal
to such a peer is dropped too); the event loop never waits on a peer.

Access: the socket lives in a fresh private directory (mode 0700; the socket 0600), so only the
learner's user can connect, and no token is asked for. The directory goes when the server stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import logging
import os
import shutil
import socket
import tempfile
import time

from google.protobuf.message import DecodeError

from lockstep.envs import from_leaves
from lockstep.transport import DEFAULT_MAX_MESSAGE_BYTES
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.codec import CodecError
from lockstep.transport.connection import (
    DEFAULT_HELLO_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    CodecClock,
    release_descriptors,
    reserve_descriptors,
    send_connection,
)
from lockstep.transport.messages import (
    DEFAULT_BOUNDS,
    DEFAULT_HELLO_LIMITS,
    HelloInfo,
    HelloLimits,
    StepBounds,
    StepData,
    check_step,
    hello_from_proto,
)
from lockstep.transport.protocol import (
    FAILED_PRECONDITION,
    INVALID_ARGUMENT,
    RESOURCE_EXHAUSTED,
    UNAVAILABLE,
    ActorHandler,
    RefusalLog,
    Refused,
    Reply,
    Welcome,
)
from lockstep.transport.shm import layout as wire

log = logging.getLogger(__name__)

SOCKET_NAME = "learner.sock"
DIR_PREFIX = "lockstep-"
MAX_PATH = 100  # a unix socket path must fit in sun_path (108 bytes with its NUL, less on some systems)
_NOSIGNAL = getattr(socket, "MSG_NOSIGNAL", 0)  # a vanished peer is an error, not a SIGPIPE
MAX_UNREAD = 1024  # frames a closing connection reads and drops at most (more than its socket buffer holds)


class LocalServer:
    """Serves actors on this host for an ``ActorHandler``; ``start()`` returns the ``unix:/path`` address.

    A bad hello or step ends only its own connection, with a REFUSED frame that names the problem
    (logged once per client and kind); the learner and its other actors go on.
    """

    def __init__(self, handler: ActorHandler, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 bounds: StepBounds = DEFAULT_BOUNDS, hello_timeout_s: float = DEFAULT_HELLO_TIMEOUT_S,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS, hello_limits: HelloLimits = DEFAULT_HELLO_LIMITS
                 ) -> None:
        self._handler = handler
        self._hello_limits = hello_limits
        self._max_bytes = max_message_bytes
        self._bounds = bounds  # of every step's values (messages.check_step)
        self._hello_timeout_s, self._max_connections = hello_timeout_s, max_connections
        self._reserved = 0
        self._dir: str | None = None
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._refusals = RefusalLog(log)
        self._codec = CodecClock()
        self.address: str | None = None

    @property
    def codec_s(self) -> float:
        """Copying steps out, validating them, writing actions: for the learner's time split."""
        return self._codec.seconds

    async def start(self) -> str | None:
        """Listen in a fresh private directory; return the ``unix:/path`` address.

        None (and a warning) where this host cannot: no unix SEQPACKET sockets, no writable temporary
        directory. Actors on this host then connect over gRPC like any other.
        """
        path = listener = None
        try:
            self._dir = _private_dir()
            path = os.path.join(self._dir, SOCKET_NAME)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            listener.bind(path)
        except (AttributeError, OSError) as err:
            if listener is not None:
                listener.close()
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None
            log.warning("no same-host transport (cannot listen on a unix socket at %s: %s); actors on this host "
                        "connect over gRPC", path or "a temporary directory", err)
            return None
        os.chmod(path, 0o600)  # the 0700 directory already keeps others out; this says so on the file too
        reserve_descriptors(self._max_connections, "the unix socket's learner.max_connections")
        self._reserved = self._max_connections
        listener.listen(128)
        listener.setblocking(False)
        self._listener = listener
        self._accepting = asyncio.create_task(self._accept())
        self.address = wire.SCHEME + path
        return self.address

    async def stop(self, grace: float | None = 1.0) -> None:
        """Stop accepting, remove the socket's directory, give open connections ``grace`` seconds, end them."""
        if self._accepting is not None:
            self._accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._accepting
        if self._listener is not None:
            self._listener.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        tasks = set(self._tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=grace)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        release_descriptors(self._reserved)
        self._reserved = 0

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(self._listener)
            except OSError as err:  # out of file descriptors, say: the listener stays readable, so wait a little
                log.warning("same-host transport: cannot accept a connection (%s); trying again in 1 s", err)
                await asyncio.sleep(1.0)
                continue
            sock.setblocking(False)
            if len(self._tasks) >= self._max_connections:
                self._refuse_over_cap(sock)
                continue
            task = asyncio.create_task(self._serve(sock))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _refuse_over_cap(self, sock: socket.socket) -> None:
        message = (f"the learner serves at most {self._max_connections} connections on its unix socket at once "
                   "(learner.max_connections)")
        self._refusals("local clients", RESOURCE_EXHAUSTED, message)  # logged once, not per client
        with contextlib.suppress(OSError):
            sock.send(wire.refusal(RESOURCE_EXHAUSTED, message), _NOSIGNAL)
        sock.close()

    async def _serve(self, sock: socket.socket) -> None:
        """One actor's connection: the hello, then one step and one reply at a time until either side ends."""
        framing = ShmFraming(_Peer(sock), self._max_bytes, self._bounds, self._hello_limits)
        try:
            await send_connection(framing, self._handler, self._refusals, self._codec, self._hello_timeout_s)
        except NotReading as err:
            log.warning("same-host transport: dropped the connection of %s: %s", framing.who, err)
        except ConnectionError:
            pass  # the actor went away while a reply was on its way: its end, as a closed stream
        except Exception:  # a fault of the learner's: end this connection (the actor reconnects), keep the rest
            log.exception("same-host transport: the connection of %s failed", framing.who)


class ShmFraming:
    """One actor's connection as a ``connection.Framing``: frames on the socket, arrays in the actor's region.

    ``welcome`` allocates the region (sized at the hello, before the handler sees it) and returns the
    WELCOME frame, which ``send`` sends with the region's descriptor.
    """

    def __init__(self, peer: _Peer, max_bytes: int, bounds: StepBounds,
                 limits: HelloLimits = DEFAULT_HELLO_LIMITS) -> None:
        self.peer = self.who = "a local client"
        self._limits = limits
        self._peer, self._max_bytes, self._bounds = peer, max_bytes, bounds
        self._layout: wire.Layout | None = None
        self._region: wire.Region | None = None
        self._fd: int | None = None  # the region's descriptor, until the welcome carries it to the actor

    async def hello(self) -> HelloInfo | None:
        hello = await self._hello()
        if hello is not None:
            self.who = f"actor {hello.actor_id}"
            self._layout = self._sized(hello)
        return hello

    async def _hello(self) -> HelloInfo | None:
        """Read and check the hello: the header frame, then the ``pb.Hello`` bytes in chunks (None: the client left)."""
        peer = self._peer
        head = await peer.frame(wire.HELLO.size + 1)
        if not head:
            return None
        if len(head) != wire.HELLO.size or not head.startswith(wire.HELLO_MAGIC):
            raise Refused(FAILED_PRECONDITION,
                          f"the first message must be a hello header ({wire.HELLO.size} bytes starting with "
                          f"{wire.HELLO_MAGIC!r}), got {len(head)} bytes starting with {head[:8]!r}; connect with "
                          "`lockstep actor --learner unix:PATH` of the learner's lockstep version")
        _, size = wire.HELLO.unpack(head)
        if size > self._max_bytes:
            raise Refused(RESOURCE_EXHAUSTED, f"a hello of {size} bytes is over the limit of {self._max_bytes} "
                          "(learner.max_message_mb)")
        body = bytearray()
        while len(body) < size:
            chunk = await peer.frame(wire.CHUNK + 1)
            if not chunk:
                return None
            due = min(wire.CHUNK, size - len(body))
            if len(chunk) > due:
                raise Refused(INVALID_ARGUMENT, f"hello: a chunk of {len(chunk)} bytes where at most {due} were due")
            body += chunk
        try:
            msg = pb.Hello.FromString(bytes(body))
        except DecodeError:
            raise Refused(FAILED_PRECONDITION, "the first message must be a hello, got bytes that are not a "
                          "protobuf Hello message") from None
        return hello_from_proto(msg, self._limits)

    def _sized(self, hello: HelloInfo) -> wire.Layout | None:
        """The actor's region, sized before the handler sees the hello (None: ``connect`` refuses num_envs < 1)."""
        if hello.num_envs < 1:
            return None
        try:
            layout = wire.Layout(hello.num_envs, hello.observation, hello.action)
        except (CodecError, TypeError, ValueError) as err:
            raise Refused(INVALID_ARGUMENT, f"{self.who}: {err}") from None
        if layout.size > self._max_bytes:
            raise Refused(INVALID_ARGUMENT, f"{self.who}: {hello.num_envs} env(s) of {hello.observation.describe()} "
                          f"need {layout.size} bytes of shared memory, over the limit of {self._max_bytes} "
                          "(learner.max_message_mb); give the actor fewer envs or raise the limit")
        return layout

    def welcome(self, hello: HelloInfo, welcome: Welcome) -> bytes:
        self._fd, self._region = _allocate(self._layout, self.who)
        reply = pb.Welcome(seed=welcome.seed, learner_run=welcome.learner_run).SerializeToString()
        return wire.REPLY.pack(wire.WELCOME, 0) + reply

    @property
    def incoming(self) -> _Peer:
        return self._peer

    def decode(self, frame: bytes, hello: HelloInfo) -> StepData:
        """Copy one step out of the region (the actor could change the region at any time, not the copies)
        and validate the copies as a gRPC step is validated."""
        if len(frame) != wire.STEP.size:
            raise Refused(INVALID_ARGUMENT, f"{self.who}: a step frame of {len(frame)} bytes; expected "
                          f"{wire.STEP.size} (kind, final observations, finished episodes)")
        kind, m, e = wire.STEP.unpack(frame)
        if kind != wire.STEP_KIND:
            raise Refused(FAILED_PRECONDITION, f"{self.who}: expected a step frame, got kind {kind:#x}")
        k = hello.num_envs
        if m > k or e > k:
            raise Refused(INVALID_ARGUMENT, f"{self.who}: step frame: {m} final observation(s) and {e} finished "
                          f"episode(s) in one step of {k} env(s); at most one of each per env")
        memory, spec = self._region, hello.observation
        if spec.tree:  # copied out leaf by leaf into records
            obs = from_leaves(memory.leaves("obs"), spec)
            final_obs = from_leaves([view[:m] for view in memory.leaves("final_obs")], spec)
        else:
            obs, final_obs = memory.obs.copy(), memory.final_obs[:m].copy()
        data = StepData(
            obs=obs, reward=memory.reward.copy(),
            terminated=memory.terminated.copy(), truncated=memory.truncated.copy(),
            final_index=memory.final_index[:m].copy(), final_obs=final_obs,
            episode_return=memory.episode_return[:e].copy(), episode_length=memory.episode_length[:e].copy(),
        )
        return check_step(data, k, hello.observation, self._bounds)

    def reply(self, reply: Reply) -> bytes:
        if reply.actions is None:
            return wire.REPLY.pack(wire.RETRY, reply.version)
        self._region.actions[...] = reply.actions  # before the frame: the actor reads them after it
        return wire.REPLY.pack(wire.ACTION, reply.version)

    def over(self) -> bytes:
        return wire.REPLY.pack(wire.OVER, 0)

    async def send(self, frame: bytes) -> None:
        if self._fd is None:
            self._peer.send(frame)
            return
        try:
            self._peer.send_with_fd(frame, self._fd)
        finally:
            os.close(self._fd)  # the actor has its own descriptor now; the mapping keeps the memory
            self._fd = None

    async def refuse(self, code: str, message: str) -> None:
        with contextlib.suppress(OSError):  # a peer that is gone, or does not read: it goes without the reason
            self._peer.send(wire.refusal(code, message))

    def close(self) -> None:
        self._peer.close()
        if self._fd is not None:
            os.close(self._fd)
        if self._region is not None:
            self._region.close()


def _allocate(layout: wire.Layout, who: str) -> tuple[int, wire.Region]:
    """The actor's shared memory: its file descriptor (to send) and the learner's mapping of it."""
    try:
        fd = wire.create_memory(layout.size)
    except OSError as err:
        raise Refused(UNAVAILABLE, f"{who}: cannot allocate {layout.size} bytes of shared memory ({err}); "
                      "free memory on the learner's host, or connect over gRPC") from None
    try:
        return fd, wire.Region(fd, layout)
    except (OSError, ValueError) as err:
        os.close(fd)
        raise Refused(UNAVAILABLE, f"{who}: cannot map {layout.size} bytes of shared memory ({err})") from None


def _private_dir() -> str:
    """A fresh directory only this user can enter (``mkdtemp`` makes it 0700), short enough for a socket path."""
    _remove_stale_dirs()
    path = tempfile.mkdtemp(prefix=DIR_PREFIX)
    if len(os.path.join(path, SOCKET_NAME).encode()) > MAX_PATH:  # a deep $TMPDIR: fall back to /tmp
        os.rmdir(path)
        path = tempfile.mkdtemp(prefix=DIR_PREFIX, dir="/tmp")
    return path


def _remove_stale_dirs() -> None:
    """Remove this user's socket directories that no learner listens on any more (a learner killed
    with SIGKILL cannot remove its own). A socket younger than a minute is left alone: its learner
    may be between ``bind`` and ``listen``."""
    for parent in {tempfile.gettempdir(), "/tmp"}:
        for folder in glob.glob(os.path.join(parent, DIR_PREFIX + "*")):
            path = os.path.join(folder, SOCKET_NAME)
            try:
                info = os.lstat(path)
                if (info.st_uid != os.getuid() or time.time() - info.st_mtime < 60
                        or os.listdir(folder) != [SOCKET_NAME]):
                    continue
                with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as probe:
                    probe.settimeout(1.0)
                    probe.connect(path)  # a live learner accepts (and drops a client that says nothing)
            except ConnectionRefusedError:
                shutil.rmtree(folder, ignore_errors=True)
                log.info("removed %s: its learner is gone", folder)
            except OSError:
                continue


class NotReading(ConnectionError):
    """The peer's socket buffer is full: it does not read its replies."""


class _Peer:
    """One accepted connection, read by a callback registered on the event loop.

    A frame is read when one is due (the hello, the next step). In between, while the learner
    serves a step (possibly holding it until the next version), the callback only peeks: when the
    actor has gone (EOF, reset), it cancels the connection's task, which ends the session at once,
    as grpc.aio cancels the handler of a stream whose client went away. A frame that comes before
    its reply pauses the callback; it stays in the socket and is read in its turn.
    """

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self._waiter: asyncio.Future | None = None
        self._size = 0
        self._watching = False

    async def frame(self, size: int) -> bytes:
        """The next frame, at most ``size`` bytes (pass one more than allowed to see an oversized one); b"": the end."""
        self._watch()  # from the first frame on, and again after a frame that came before its reply
        try:
            return self.sock.recv(size)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            return b""
        self._waiter, self._size = self._loop.create_future(), size
        try:
            return await self._waiter
        finally:
            self._waiter = None

    def __aiter__(self) -> _Peer:
        return self

    async def __anext__(self) -> bytes:
        """The next step frame (one byte more than a step's size is read, so an oversized one shows)."""
        frame = await self.frame(wire.STEP.size + 1)
        if not frame:
            raise StopAsyncIteration
        return frame

    def _readable(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            if waiter.done():
                return  # answered; the task has not resumed yet
            try:
                data = self.sock.recv(self._size)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            waiter.set_result(data)
            return
        try:
            data = self.sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        self._unwatch()  # until the next frame is due
        if not data and self._task is not None:
            self._task.cancel()  # the actor is gone while its step is served

    def _watch(self) -> None:
        if not self._watching:
            self._loop.add_reader(self.sock.fileno(), self._readable)
            self._watching = True

    def _unwatch(self) -> None:
        if self._watching:
            self._loop.remove_reader(self.sock.fileno())
            self._watching = False

    def send(self, frame: bytes) -> None:
        """Send one frame (whole, or not at all: SEQPACKET) without waiting; ConnectionError when the actor is
        gone or its socket buffer is full (it does not read its replies: a real actor never has more than one
        unread)."""
        try:
            self.sock.send(frame, _NOSIGNAL)
        except InterruptedError:
            self.sock.send(frame, _NOSIGNAL)
        except BlockingIOError as err:
            raise NotReading("it does not read its replies (its socket buffer is full)") from err

    def send_with_fd(self, frame: bytes, fd: int) -> None:
        """The welcome and the region's descriptor: the connection's first message, so the buffer has room."""
        try:
            socket.send_fds(self.sock, [frame], [fd], _NOSIGNAL)
        except BlockingIOError as err:
            raise ConnectionError("the actor's socket buffer is full before the welcome") from err

    def close(self) -> None:
        """Close the connection, reading first what the peer sent and no one read: a unix socket closed with
        unread frames resets its peer, whose next read then fails instead of returning the refusal (or OVER)
        sent just before."""
        self._unwatch()
        for _ in range(MAX_UNREAD):  # a peer that keeps sending cannot keep the event loop here
            try:
                if not self.sock.recv(wire.MAX_REPLY):
                    break
            except OSError:  # nothing more to read (BlockingIOError), or the peer is gone
                break
        self.sock.close()
