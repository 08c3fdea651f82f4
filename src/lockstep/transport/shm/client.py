"""The actor's end of the same-host transport: a synchronous, one-request-one-reply connection.

``LocalConnection(address, hello)`` connects to a learner's ``unix:/path`` address, says hello and
maps the shared memory the learner sends with its welcome; ``act(step)`` writes one step into that
memory, wakes the learner with a 12-byte frame and returns the actions the learner wrote back.
The wire and who writes what when: ``shm_layout``. No torch; numpy and the standard library.

It raises what the gRPC ``Connection.act`` raises: ``LearnerClosed`` when training is over,
``LearnerRefused`` when the learner refused this actor for good, ``LearnerFailed`` when the learner's
own code failed, ``ConnectionError`` when the learner is gone or refused it for now (reconnecting may help).
"""

from __future__ import annotations

import os
import socket

import numpy as np

from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.grpc.client import FATAL_CODES, LearnerClosed, LearnerFailed, LearnerRefused
from lockstep.transport.messages import StepData, space_from_proto
from lockstep.transport.protocol import INTERNAL, INVALID_ARGUMENT
from lockstep.transport.shm import layout as wire


class LocalConnection:
    """One connection to a learner on this host."""

    def __init__(self, address: str, hello: pb.Hello, connect_timeout: float = 30.0) -> None:
        if not wire.is_local(address):
            raise ValueError(f"{address!r} is not a same-host address; expected {wire.SCHEME}/path/to/socket")
        self.address = address
        self.retries = 0
        self._k = int(hello.num_envs)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._region: wire.Region | None = None
        try:
            self._sock.settimeout(connect_timeout)  # connecting and the welcome; a held request has no deadline
            try:
                self._sock.connect(address[len(wire.SCHEME):])
            except OSError as err:
                raise ConnectionError(f"no learner at {address} ({err.strerror or err}); is the learner "
                                      "running on this host, and is this its address?") from err
            body = hello.SerializeToString()
            self._send(wire.HELLO.pack(wire.HELLO_MAGIC, len(body)))
            for start in range(0, len(body), wire.CHUNK):
                self._send(body[start:start + wire.CHUNK])
            frame, fds = self._recv(with_fd=True)
            try:
                kind, _ = wire.REPLY.unpack_from(frame)
                if kind != wire.WELCOME or len(fds) != 1:
                    raise ConnectionError(f"the learner at {address} answered the hello with reply kind {kind} "
                                          f"and {len(fds)} descriptor(s), not a welcome with its shared memory")
                self.welcome = pb.Welcome.FromString(frame[wire.REPLY.size:])
                layout = wire.Layout(self._k, space_from_proto(hello.observation_space, "observation"),
                                     space_from_proto(hello.action_space, "action"))
                try:
                    self._region = wire.Region(fds[0], layout)
                except ValueError as err:
                    raise ConnectionError(f"the learner at {address}: {err}") from None
            finally:
                for fd in fds:
                    os.close(fd)  # the mapping keeps the memory
            self._sock.settimeout(None)
        except BaseException:
            self.close()
            raise

    def _send(self, frame: bytes) -> None:
        try:
            self._sock.send(frame)
        except OSError as err:
            raise ConnectionError(f"lost the learner at {self.address} ({err.strerror or err})") from err

    def _recv(self, with_fd: bool = False) -> tuple[bytes, list[int]]:
        """One reply (and any descriptors passed with it); refusals and the end of the connection raise."""
        try:
            if with_fd:
                frame, fds, _, _ = socket.recv_fds(self._sock, wire.MAX_REPLY, 1)
            else:
                frame, fds = self._sock.recv(wire.MAX_REPLY), []
        except TimeoutError:
            raise ConnectionError(f"the learner at {self.address} did not answer the hello in time") from None
        except OSError as err:
            raise ConnectionError(f"lost the learner at {self.address} ({err.strerror or err})") from err
        if not frame:
            raise ConnectionError(f"lost the learner at {self.address} (the connection closed)")
        if len(frame) < wire.REPLY.size:
            raise ConnectionError(f"the learner at {self.address} sent a reply of {len(frame)} bytes")
        if wire.REPLY.unpack_from(frame)[0] == wire.REFUSED:
            for fd in fds:
                os.close(fd)
            code, message = wire.parse_refusal(frame[wire.REPLY.size:])
            if code in FATAL_CODES:
                raise LearnerRefused(code, message)
            if code == INTERNAL:
                raise LearnerFailed(message)
            raise ConnectionError(f"the learner at {self.address} ended the connection ({code}: {message})")
        return frame, fds

    def act(self, step: StepData) -> tuple[np.ndarray, int]:
        """Send ``step`` (an ``EnvLoop.outcome()``); return the actions for it and the version that produced them.

        A "no action, retry" reply (reference synchronizations only) is answered by sending the same
        frame again: the step is still in the region. ``retries`` counts them.
        """
        region = self._region
        m, e = len(step.final_index), len(step.episode_return)
        _put_observation("step.observation", region.leaves("obs"), step.obs)
        _put("step.reward", region.reward, step.reward)
        _put("step.terminated", region.terminated, step.terminated)
        _put("step.truncated", region.truncated, step.truncated)
        if m > self._k or e > self._k:
            raise LearnerRefused(INVALID_ARGUMENT, f"step frame: {m} final observation(s) and {e} finished "
                                 f"episode(s) in one step of {self._k} env(s); at most one of each per env")
        _put("step.final_index", region.final_index[:m], step.final_index)
        _put_observation("step.final_observation", [view[:m] for view in region.leaves("final_obs")], step.final_obs)
        _put("step.episode_return", region.episode_return[:e], step.episode_return)
        _put("step.episode_length", region.episode_length[:e], step.episode_length)
        frame = wire.STEP.pack(wire.STEP_KIND, m, e)
        while True:
            self._send(frame)
            reply, _ = self._recv()
            kind, version = wire.REPLY.unpack_from(reply)
            if kind == wire.ACTION:
                return region.actions.copy(), version  # a copy: the region is the learner's again at the next step
            if kind == wire.RETRY:
                self.retries += 1
                continue
            if kind == wire.OVER:
                raise LearnerClosed()
            raise ConnectionError(f"expected an action from the learner at {self.address}, got reply kind {kind}")

    def interrupt(self) -> None:
        """End the connection from another thread: an ``act`` waiting on it, or called later, raises
        ``ConnectionError``. The shared memory stays mapped (an ``act`` may be writing into it) until ``close``."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:  # already closed or never connected
            pass

    def close(self) -> None:
        if self._region is not None:
            self._region.close()
            self._region = None
        self._sock.close()


def _put_observation(name: str, into: list[np.ndarray], value: np.ndarray) -> None:
    """Write observations into their field, or the records of a Dict or Tuple space leaf by leaf into theirs."""
    if not value.dtype.names:
        _put(name, into[0], value)
        return
    if len(value.dtype.names) != len(into):
        raise LearnerRefused(INVALID_ARGUMENT, f"{name}: {len(value.dtype.names)} leaves, the layout has "
                             f"{len(into)} (checked by the actor before writing it into shared memory)")
    for leaf, view in zip(value.dtype.names, into):
        _put(f"{name} leaf {leaf!r}", view, value[leaf])


def _put(name: str, into: np.ndarray, value: np.ndarray) -> None:
    """Write ``value`` into the region as it is, or refuse as the learner would (no silent cast or broadcast)."""
    value = np.asarray(value)
    if value.dtype != into.dtype or value.shape != into.shape:
        raise LearnerRefused(INVALID_ARGUMENT, f"{name}: {value.dtype.name}{list(value.shape)} does not match "
                             f"the expected {into.dtype.name}{list(into.shape)} (checked by the actor before "
                             "writing it into shared memory)")
    into[...] = value
