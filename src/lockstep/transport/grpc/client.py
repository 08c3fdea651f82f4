"""The actor's end of the stream: a synchronous, one-request-one-reply connection to the learner.

Also what every actor-side connection (this one, ``shm_client.LocalConnection``) has in common:
``act(step) -> (actions, version)`` and the exceptions it raises, so the actor's loop does not
know which transport it speaks.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator

import grpc
import numpy as np

from lockstep.transport import DEFAULT_MAX_MESSAGE_BYTES, METHOD
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.codec import decode
from lockstep.transport.grpc import security
from lockstep.transport.messages import StepData, space_from_proto, step_message

_END = object()

# Refusals after which reconnecting cannot help (status names, as in ``protocol.Refused``).
FATAL_CODES = frozenset({"INVALID_ARGUMENT", "FAILED_PRECONDITION", "ALREADY_EXISTS", "UNAUTHENTICATED",
                         "PERMISSION_DENIED", "UNIMPLEMENTED"})


class LearnerClosed(Exception):
    """The learner ended the stream normally: training is over."""


class LearnerRefused(Exception):
    """The learner refused this actor for good (``code`` in ``FATAL_CODES``); the actor exits with code 2."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


class LearnerFailed(ConnectionError):
    """The learner's own code failed (status INTERNAL; the message names its error): its run has ended. A
    ``ConnectionError``, for a restarted learner may serve again; the actor gives up after ``actor.LEARNER_FAILURES``
    of them without an action in between."""


class Misconfigured(ConnectionError):
    """The actor's connection settings cannot work with this learner (TLS on one end only, the wrong CA or
    server name): retrying cannot help, and the message names the flag that fixes it. The actor exits with code 2.
    A ``ConnectionError``, so that callers who only care that no connection came up need not know it."""


def translate(err: grpc.RpcError) -> Exception:
    """A gRPC error as the transport-agnostic exception the actor handles: refused for good, or lost."""
    code = err.code()
    if code is not None and code.name in FATAL_CODES:
        return LearnerRefused(code.name, err.details() or "")
    if code is grpc.StatusCode.INTERNAL:
        return LearnerFailed(err.details() or "the learner failed")
    return ConnectionError(f"lost the learner ({code.name if code is not None else 'no status'}: {err.details()})")


class Connection:
    """One stream to the learner. ``step`` sends a Step and waits for its Action.

    ``token``: the learner's token, or a function that returns it, called once the learner listens
    (``security.local_token``: a learner on this host publishes a generated token when it starts)."""

    def __init__(self, address: str, hello: pb.Hello, connect_timeout: float = 30.0, *,
                 token: str | Callable[[], str | None] | None = None, tls_ca: str | None = None,
                 tls_server_name: str | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.keepalive_time_ms", 10_000),  # notice a vanished learner within ~15 s ...
            ("grpc.keepalive_timeout_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1),
            # ... also while a request is held: no data flows then, and gRPC stops pinging after 2 pings
            # without data unless this is 0 (the server permits a ping every 5 s without data) ...
            ("grpc.http2.max_pings_without_data", 0),
            ("grpc.http2.ping_timeout_ms", 5_000),  # ... and a ping's own timeout (60 s) would replace keepalive's
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
            self._wait_ready(address, connect_timeout, tls_ca, tls_server_name)
        except BaseException:
            self._channel.close()
            raise
        if callable(token):  # read once the learner listens: it may have published its token only now
            token = token()
        call = self._channel.stream_stream(
            METHOD, request_serializer=pb.ActorMessage.SerializeToString,
            response_deserializer=pb.LearnerMessage.FromString,
        )
        self._outbox.put(pb.ActorMessage(hello=hello))
        self._call = call(self._requests(), metadata=security.metadata(token), wait_for_ready=True)
        try:
            reply = self._next()
            if reply.WhichOneof("kind") != "welcome":
                raise ConnectionError(f"the learner answered the hello with {reply.WhichOneof('kind')}, not a welcome")
        except BaseException:
            self.close()  # a refused hello: nothing else would close the channel
            raise
        self.welcome: pb.Welcome = reply.welcome
        action = space_from_proto(hello.action_space, "hello.action_space")  # welcomed: the learner accepted it
        self._action_dtype, self._action_shape = action.action_dtype, action.element_shape

    def _wait_ready(self, address: str, timeout: float, tls_ca: str | None, tls_server_name: str | None) -> None:
        """Wait for the channel to come up. Each time an attempt fails, ask whether the TLS settings are the
        cause (``security.diagnose_tls``) and raise ``Misconfigured`` if so, instead of retrying for nothing."""
        states: queue.SimpleQueue = queue.SimpleQueue()
        watch = states.put
        self._channel.subscribe(watch, try_to_connect=True)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    state = states.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    raise ConnectionError(f"no learner answered at {address} within {timeout:.0f} s") from None
                if state is grpc.ChannelConnectivity.READY:
                    return
                if state is grpc.ChannelConnectivity.TRANSIENT_FAILURE:
                    problem = security.diagnose_tls(address, tls_ca, tls_server_name)
                    if problem:
                        raise Misconfigured(problem)
        finally:
            self._channel.unsubscribe(watch)

    @classmethod
    def open(cls, address: str, hello: pb.Hello, connect_timeout: float = 30.0, **kwargs) -> Connection:
        """Connect as the actor does: a refused hello raises ``LearnerRefused`` or ``ConnectionError``."""
        try:
            return cls(address, hello, connect_timeout, **kwargs)
        except grpc.RpcError as err:
            raise translate(err) from err

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

    def act(self, step: StepData) -> tuple[np.ndarray, int]:
        """``step`` for the actor's loop, with the action space of the hello: raises ``LearnerClosed``,
        ``LearnerRefused`` or ``ConnectionError``."""
        try:
            return self.step(step_message(step), self._action_dtype, self._action_shape)
        except grpc.RpcError as err:
            raise translate(err) from err

    def interrupt(self) -> None:
        """End the stream from another thread: a ``step`` or ``act`` waiting on it, or called later, raises
        ``ConnectionError``; ``close`` still releases the channel."""
        self._call.cancel()

    def close(self) -> None:
        self._outbox.put(_END)
        self._call.cancel()
        self._channel.close()
