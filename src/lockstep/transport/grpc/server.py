"""The learner's gRPC server (grpc.aio): one bidirectional stream per actor.

A held request is an awaited future inside the stream's coroutine, so holding
any number of requests costs no thread. The server only decodes and validates;
what to do with a step is the ``ActorHandler``'s business.
"""

from __future__ import annotations

import logging
import time

import grpc
from google.protobuf.message import DecodeError

from lockstep.transport import DEFAULT_MAX_MESSAGE_BYTES, SERVICE
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.codec import CodecError, encode
from lockstep.transport.grpc import security
from lockstep.transport.messages import hello_from_proto, step_from_proto
from lockstep.transport.protocol import ActorHandler, RefusalLog, Refused

log = logging.getLogger(__name__)


def server_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 10_000),  # ping idle actors every 10 s ...
        ("grpc.keepalive_timeout_ms", 5_000),  # ... and drop a stream whose actor does not answer in 5 s
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.so_reuseport", 0),
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


class LearnerServer:
    """Serves actor streams for an ``ActorHandler``.

    Every stream is checked for the token (when one is set) before its hello is
    read; every message is decoded and validated before the handler sees it; a
    bad message ends only its own stream, with a status that names the problem.
    """

    def __init__(self, handler: ActorHandler, listen: str, *, token: str | None = None,
                 tls: tuple[str, str] | None = None, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 sanitize: bool = False) -> None:
        security.check_server(listen, token, *(tls or (None, None)))
        self._handler = handler
        self._listen = listen
        self._token = token
        self._credentials = security.server_credentials(*tls) if tls else None
        self._sanitize = sanitize
        self._server = grpc.aio.server(options=server_options(max_message_bytes))
        rpc = grpc.stream_stream_rpc_method_handler(
            self._connect, request_deserializer=_deserialize,
            response_serializer=pb.LearnerMessage.SerializeToString,
        )
        self._server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {"Connect": rpc})])
        self._log_refusal = RefusalLog(log)
        self.port: int | None = None
        self.codec_s = 0.0  # decoding steps and encoding actions, for the learner's time split

    async def start(self) -> int:
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

    async def _refuse(self, context, code: grpc.StatusCode, message: str, who: str) -> None:
        """End the stream with ``code``; log each kind of refusal once per peer."""
        self._log_refusal(who, code.name, message)
        await context.abort(code, message)

    async def _connect(self, requests, context: grpc.aio.ServicerContext):
        """One actor's stream, as an async generator of replies (cheaper per message than context.write)."""
        peer = context.peer()
        if self._token is not None:
            problem = security.authorized(context.invocation_metadata(), self._token)
            if problem:
                await self._refuse(context, grpc.StatusCode.UNAUTHENTICATED, problem, peer)
        first = await anext(requests, None)
        if first is None:
            return
        if _kind(first) != "hello":
            got = "bytes that are not a protobuf message" if isinstance(first, _Malformed) else (
                _kind(first) or "an empty message")
            await self._refuse(context, grpc.StatusCode.FAILED_PRECONDITION,
                               f"the first message must be a hello, got {got}", peer)
        try:
            hello = hello_from_proto(first.hello)
            session, welcome = self._handler.connect(hello)
        except CodecError as err:
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, f"hello: {err}", peer)
        except Refused as err:
            await self._refuse(context, grpc.StatusCode[err.code], str(err), peer)
        who = f"actor {hello.actor_id}"
        try:
            yield pb.LearnerMessage(welcome=pb.Welcome(seed=welcome.seed, learner_run=welcome.learner_run))
            async for msg in requests:
                if isinstance(msg, _Malformed):
                    await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT,
                                       f"{who}: a message that is not a valid ActorMessage protobuf ({msg.error})", who)
                if msg.WhichOneof("kind") != "step":
                    await self._refuse(context, grpc.StatusCode.FAILED_PRECONDITION,
                                       f"{who}: expected a step, got {msg.WhichOneof('kind') or 'an empty message'}",
                                       who)
                start = time.perf_counter()
                try:
                    data = step_from_proto(msg.step, hello.num_envs, hello.observation, self._sanitize)
                except CodecError as err:
                    await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, f"{who}: {err}", who)
                self.codec_s += time.perf_counter() - start
                try:
                    reply = await session.step(data)
                except Refused as err:
                    await self._refuse(context, grpc.StatusCode[err.code], str(err), who)
                if reply is None:
                    return
                start = time.perf_counter()
                if reply.actions is None:
                    action = pb.Action(policy_version=reply.version, retry=True)
                else:
                    action = pb.Action(action=encode(reply.actions), policy_version=reply.version)
                message = pb.LearnerMessage(action=action)
                self.codec_s += time.perf_counter() - start
                yield message
        finally:
            session.close()
