"""The learner's gRPC server (grpc.aio): one bidirectional stream per actor.

A held request is an awaited future inside the stream's coroutine, so holding
any number of requests costs no thread. The server only decodes and validates
(``GrpcFraming``, served by ``connection.serve_connection``); what to do with a
step is the ``ActorHandler``'s business.

Connections are bounded: at most ``max_connections`` TCP connections (gRPC core closes more at once)
and as many open streams (more are refused with RESOURCE_EXHAUSTED); a connection that has not
finished its HTTP/2 handshake, or has had no open stream, for ``hello_timeout_s`` is closed, and a
stream that has not said hello in that time is refused with DEADLINE_EXCEEDED.
"""

from __future__ import annotations

import logging

import grpc
from google.protobuf.message import DecodeError

from lockstep.transport import DEFAULT_MAX_MESSAGE_BYTES, SERVICE
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.codec import encode
from lockstep.transport.connection import (
    DEFAULT_HELLO_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    CodecClock,
    release_descriptors,
    reserve_descriptors,
    serve_connection,
)
from lockstep.transport.grpc import security
from lockstep.transport.messages import (
    DEFAULT_BOUNDS,
    DEFAULT_HELLO_LIMITS,
    HelloInfo,
    HelloLimits,
    StepBounds,
    StepData,
    hello_from_proto,
    step_from_proto,
)
from lockstep.transport.protocol import (
    FAILED_PRECONDITION,
    INVALID_ARGUMENT,
    RESOURCE_EXHAUSTED,
    UNAUTHENTICATED,
    ActorHandler,
    RefusalLog,
    Refused,
    Reply,
    Welcome,
)

log = logging.getLogger(__name__)



def server_options(max_message_bytes: int, hello_timeout_s: float = DEFAULT_HELLO_TIMEOUT_S,
                   max_connections: int = DEFAULT_MAX_CONNECTIONS) -> list[tuple[str, int]]:
    idle_ms = max(1, round(hello_timeout_s * 1000))
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 10_000),  # ping idle actors every 10 s ...
        ("grpc.keepalive_timeout_ms", 5_000),  # ... and drop a stream whose actor does not answer in 5 s
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1),
        # ... also while no data flows (a held request, an actor between steps): gRPC stops pinging after
        # 2 pings without data unless this is 0, and a ping's own timeout (60 s) would replace keepalive's
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.ping_timeout_ms", 5_000),
        ("grpc.so_reuseport", 0),
        ("grpc.server_handshake_timeout_ms", idle_ms),  # a TCP connection that never speaks HTTP/2 ...
        ("grpc.max_connection_idle_ms", idle_ms),  # ... or opens no stream is closed, so it holds no descriptor
        ("grpc.max_allowed_incoming_connections", max_connections),
    ]


class _Malformed:
    """What the deserializer returns for bytes that are not an ActorMessage (so the stream can say so)."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _deserialize(data: bytes) -> pb.ActorMessage | _Malformed:
    try:
        return pb.ActorMessage.FromString(data)
    except DecodeError as err:
        return _Malformed(err)


def _kind(msg) -> str | None:
    return None if isinstance(msg, _Malformed) else msg.WhichOneof("kind")


class GrpcFraming:
    """One actor's stream as a ``connection.Framing``: protobuf messages in, ``pb.LearnerMessage`` out."""

    def __init__(self, requests, context: grpc.aio.ServicerContext, token: str | None, bounds: StepBounds,
                 limits: HelloLimits = DEFAULT_HELLO_LIMITS) -> None:
        self.peer = context.peer()
        self.incoming = requests
        self._context, self._token, self._bounds, self._limits = context, token, bounds, limits
        self._who = self.peer

    async def hello(self) -> HelloInfo | None:
        if self._token is not None:
            problem = security.authorized(self._context.invocation_metadata(), self._token)
            if problem:
                raise Refused(UNAUTHENTICATED, problem)
        first = await anext(self.incoming, None)
        if first is None:
            return None
        if _kind(first) != "hello":
            got = "bytes that are not a protobuf message" if isinstance(first, _Malformed) else (
                _kind(first) or "an empty message")
            raise Refused(FAILED_PRECONDITION, f"the first message must be a hello, got {got}")
        hello = hello_from_proto(first.hello, self._limits, self.peer)
        self._who = f"actor {hello.actor_id}"
        return hello

    def welcome(self, hello: HelloInfo, welcome: Welcome) -> pb.LearnerMessage:
        return pb.LearnerMessage(welcome=pb.Welcome(seed=welcome.seed, learner_run=welcome.learner_run))

    def decode(self, msg, hello: HelloInfo) -> StepData:
        if isinstance(msg, _Malformed):
            raise Refused(INVALID_ARGUMENT,
                          f"{self._who}: a message that is not a valid ActorMessage protobuf ({msg.error})")
        if msg.WhichOneof("kind") != "step":
            raise Refused(FAILED_PRECONDITION,
                          f"{self._who}: expected a step, got {msg.WhichOneof('kind') or 'an empty message'}")
        return step_from_proto(msg.step, hello.num_envs, hello.observation, self._bounds)

    def reply(self, reply: Reply) -> pb.LearnerMessage:
        if reply.actions is None:
            return pb.LearnerMessage(action=pb.Action(policy_version=reply.version, retry=True))
        return pb.LearnerMessage(action=pb.Action(action=encode(reply.actions), policy_version=reply.version))

    def over(self) -> None:
        return None  # the stream ends with OK

    async def refuse(self, code: str, message: str) -> None:
        await self._context.abort(grpc.StatusCode[code], message)

    def close(self) -> None:
        pass  # grpc.aio owns the stream


class LearnerServer:
    """Serves actor streams for an ``ActorHandler``.

    Every stream is checked for the token (when one is set) before its hello is
    read; every message is decoded and validated before the handler sees it; a
    bad message ends only its own stream, with a status that names the problem.
    """

    def __init__(self, handler: ActorHandler, listen: str, *, token: str | None = None,
                 tls: tuple[str, str] | None = None, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 bounds: StepBounds = DEFAULT_BOUNDS, hello_timeout_s: float = DEFAULT_HELLO_TIMEOUT_S,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS, hello_limits: HelloLimits = DEFAULT_HELLO_LIMITS
                 ) -> None:
        security.check_server(listen, token, *(tls or (None, None)))
        self._hello_limits = hello_limits
        self._handler = handler
        self._listen = listen
        self._token = token
        self._credentials = security.server_credentials(*tls) if tls else None
        self._bounds = bounds  # of every step's values (messages.check_step)
        self._hello_timeout_s, self._max_connections = hello_timeout_s, max_connections
        self._streams = 0  # open actor streams, at most max_connections
        self._reserved = 0
        self._server = grpc.aio.server(options=server_options(max_message_bytes, hello_timeout_s, max_connections))
        rpc = grpc.stream_stream_rpc_method_handler(
            self._connect, request_deserializer=_deserialize,
            response_serializer=pb.LearnerMessage.SerializeToString,
        )
        self._server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {"Connect": rpc})])
        self._refusals = RefusalLog(log)
        self._codec = CodecClock()
        self.port: int | None = None

    @property
    def codec_s(self) -> float:
        """Decoding steps and encoding actions, for the learner's time split."""
        return self._codec.seconds

    async def start(self) -> int:
        reserve_descriptors(self._max_connections, "the gRPC server's learner.max_connections")
        self._reserved = self._max_connections
        if self._credentials is not None:
            self.port = self._server.add_secure_port(self._listen, self._credentials)
        else:
            self.port = self._server.add_insecure_port(self._listen)
        if not self.port:
            raise OSError(f"cannot listen on {self._listen}")
        await self._server.start()
        return self.port

    async def stop(self, grace: float | None = 1.0) -> None:
        await self._server.stop(grace)
        release_descriptors(self._reserved)
        self._reserved = 0

    async def _connect(self, requests, context: grpc.aio.ServicerContext):
        """One actor's stream, as an async generator of replies (grpc.aio serves only a generator
        function's stream this way)."""
        if self._streams >= self._max_connections:
            message = (f"the learner serves at most {self._max_connections} actor streams at once "
                       "(learner.max_connections)")
            self._refusals("gRPC clients", RESOURCE_EXHAUSTED, message)  # logged once, not per peer
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)
        self._streams += 1
        try:
            framing = GrpcFraming(requests, context, self._token, self._bounds, self._hello_limits)
            async for message in serve_connection(framing, self._handler, self._refusals, self._codec,
                                                  self._hello_timeout_s):
                yield message
        finally:
            self._streams -= 1
