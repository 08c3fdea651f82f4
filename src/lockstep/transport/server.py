"""The learner's gRPC server (grpc.aio): one bidirectional stream per actor.

A held request is an awaited future inside the stream's coroutine, so holding
any number of requests costs no thread. The server only decodes and validates;
what to do with a step is the ``ActorHandler``'s business.
"""

from __future__ import annotations

import logging
from typing import Protocol

import grpc
import numpy as np

from lockstep.transport import DEFAULT_MAX_MESSAGE_BYTES, PROTOCOL, SERVICE
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.codec import CodecError, encode
from lockstep.transport.messages import HelloInfo, StepData, hello_from_proto, step_from_proto

log = logging.getLogger(__name__)


class HandshakeError(Exception):
    """The learner refuses an actor; ``code`` is a grpc.StatusCode."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class ActorSession(Protocol):
    async def step(self, data: StepData) -> tuple[np.ndarray, int] | None:
        """Actions [k, *act] and the version that produced them, or None when training is over."""

    def close(self) -> None:
        """The stream ended (actor gone, error, or training over)."""


class ActorHandler(Protocol):
    def connect(self, hello: HelloInfo) -> tuple[ActorSession, pb.Welcome]:
        """Accept an actor or raise HandshakeError."""


def server_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 5_000),
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.so_reuseport", 0),
    ]


class LearnerServer:
    def __init__(self, handler: ActorHandler, listen: str,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self._handler = handler
        self._listen = listen
        self._server = grpc.aio.server(options=server_options(max_message_bytes))
        rpc = grpc.stream_stream_rpc_method_handler(
            self._connect,
            request_deserializer=pb.ActorMessage.FromString,
            response_serializer=pb.LearnerMessage.SerializeToString,
        )
        self._server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, {"Connect": rpc})])
        self.port: int | None = None

    async def start(self) -> int:
        self.port = self._server.add_insecure_port(self._listen)
        if not self.port:
            raise OSError(f"cannot listen on {self._listen}")
        await self._server.start()
        return self.port

    async def stop(self, grace: float | None = 1.0) -> None:
        await self._server.stop(grace)

    async def _connect(self, requests, context: grpc.aio.ServicerContext):
        first = await context.read()
        if first is grpc.aio.EOF:
            return
        if first.WhichOneof("kind") != "hello":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"the first message must be a hello, got {first.WhichOneof('kind') or 'an empty message'}")
        try:
            hello = hello_from_proto(first.hello)
            if hello.protocol != PROTOCOL:
                raise HandshakeError(grpc.StatusCode.FAILED_PRECONDITION,
                                     f"actor speaks protocol {hello.protocol}, the learner {PROTOCOL}; "
                                     "run the same lockstep version on both")
            session, welcome = self._handler.connect(hello)
        except CodecError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"hello: {err}")
        except HandshakeError as err:
            await context.abort(err.code, str(err))
        try:
            await context.write(pb.LearnerMessage(welcome=welcome))
            while True:
                msg = await context.read()
                if msg is grpc.aio.EOF:
                    return
                if msg.WhichOneof("kind") != "step":
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                        f"actor {hello.actor_id}: expected a step, got {msg.WhichOneof('kind')}")
                try:
                    data = step_from_proto(msg.step, hello.num_envs, hello.observation)
                except CodecError as err:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"actor {hello.actor_id}: {err}")
                reply = await session.step(data)
                if reply is None:
                    return
                actions, version = reply
                await context.write(pb.LearnerMessage(action=pb.Action(action=encode(actions), policy_version=version)))
        finally:
            session.close()
