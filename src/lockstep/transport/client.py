"""The actor's end of the stream: a synchronous, one-request-one-reply connection to the learner."""

from __future__ import annotations

import queue
from collections.abc import Iterator

import grpc
import numpy as np

from lockstep.transport import DEFAULT_MAX_MESSAGE_BYTES, METHOD, security
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.codec import decode

_END = object()


class LearnerClosed(Exception):
    """The learner ended the stream normally: training is over."""


class Connection:
    """One stream to the learner. ``step`` sends a Step and waits for its Action."""

    def __init__(self, address: str, hello: pb.Hello, connect_timeout: float = 30.0, *,
                 token: str | None = None, tls_ca: str | None = None, tls_server_name: str | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.keepalive_time_ms", 10_000),  # notice a vanished learner within ~15 s
            ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1),
        ]
        if tls_server_name:
            options.append(("grpc.ssl_target_name_override", tls_server_name))
        if tls_ca:
            self._channel = grpc.secure_channel(address, security.channel_credentials(tls_ca), options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self.retries = 0
        try:
            grpc.channel_ready_future(self._channel).result(timeout=connect_timeout)
        except grpc.FutureTimeoutError:
            self._channel.close()
            raise ConnectionError(f"no learner answered at {address} within {connect_timeout:.0f} s") from None
        call = self._channel.stream_stream(
            METHOD, request_serializer=pb.ActorMessage.SerializeToString,
            response_deserializer=pb.LearnerMessage.FromString,
        )
        self._outbox.put(pb.ActorMessage(hello=hello))
        self._call = call(self._requests(), metadata=security.metadata(token), wait_for_ready=True)
        reply = self._next()
        if reply.WhichOneof("kind") != "welcome":
            raise ConnectionError(f"the learner answered the hello with {reply.WhichOneof('kind')}, not a welcome")
        self.welcome: pb.Welcome = reply.welcome

    def _requests(self) -> Iterator[pb.ActorMessage]:
        while True:
            msg = self._outbox.get()
            if msg is _END:
                return
            yield msg

    def _next(self) -> pb.LearnerMessage:
        try:
            return next(self._call)
        except StopIteration:
            raise LearnerClosed() from None

    def step(self, step: pb.Step, action_dtype: np.dtype, action_shape: tuple) -> tuple[np.ndarray, int]:
        """Send a step; return the actions for it and the version that produced them.

        A "no action, retry" answer (reference synchronizations only) is retried here,
        with the same message, until actions come back; ``retries`` counts them.
        """
        message = pb.ActorMessage(step=step)
        while True:
            self._outbox.put(message)
            reply = self._next()
            if reply.WhichOneof("kind") != "action":
                raise ConnectionError(f"expected an action from the learner, got {reply.WhichOneof('kind')}")
            if not reply.action.retry:
                break
            self.retries += 1
        actions = decode(reply.action.action, "action", action_dtype, (None, *action_shape))
        return actions, int(reply.action.policy_version)

    def close(self) -> None:
        self._outbox.put(_END)
        self._call.cancel()
        self._channel.close()
