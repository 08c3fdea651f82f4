"""What a transport asks of the learner, and what it gets back: the same for every transport.

A transport (gRPC, shared memory, in-process) decodes and validates an actor's messages,
then hands them to the learner through these two protocols (``connection.serve_connection``). Refusals are named with
gRPC-style status names so every transport can report them the same way.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from lockstep.transport.messages import HelloInfo, StepData

# Why a connection is refused (the names of the matching gRPC status codes).
INVALID_ARGUMENT = "INVALID_ARGUMENT"  # the actor sent something the learner cannot use
FAILED_PRECONDITION = "FAILED_PRECONDITION"  # the request is well-formed but not allowed now
ALREADY_EXISTS = "ALREADY_EXISTS"
UNAVAILABLE = "UNAVAILABLE"  # training is over
RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"  # a message over the size limit
UNAUTHENTICATED = "UNAUTHENTICATED"  # no token, or the wrong one
DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"  # no hello, or no step, in time: the actor may reconnect
INTERNAL = "INTERNAL"  # the learner itself failed (not the actor's doing): the run ends, its actors stop


class Refused(Exception):
    """The learner refuses an actor (at its hello) or ends its connection; ``code`` says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class RefusalLog:
    """Logs each kind of refusal (its message up to the first colon) once per client, so that a
    client refused in a retry loop cannot flood the learner's log."""

    def __init__(self, log: logging.Logger) -> None:
        self._log = log
        self._seen: set[tuple[str, str]] = set()

    def __call__(self, who: str, code: str, message: str) -> None:
        key = (who, message.split(":", 1)[0])
        if key not in self._seen:
            self._seen.add(key)
            self._log.warning("refused %s: %s %s", who, code, message)


@dataclass(frozen=True)
class Welcome:
    """The learner's answer to an accepted hello."""

    seed: int  # the run seed: the actor seeds its envs from it
    learner_run: str  # the run directory's name, for the actor's log


@dataclass(frozen=True)
class Reply:
    """The answer to one Step: actions [k, *act] and the version that produced them,
    or ``actions=None``: no action, the actor sends the same Step again."""

    actions: np.ndarray | None
    version: int


class ActorSession(Protocol):
    # Since when (time.perf_counter) the learner waits for the peer's next step: the connection loop sets it
    # when an answer goes out and clears it when a step arrives; the learner's step deadline reads it.
    owed_since: float | None
    evicted: str | None  # why the learner ended the session (the step deadline): the connection ends saying so

    async def step(self, data: StepData) -> Reply | None:
        """The reply to a step, or None when training is over; raises Refused to end the connection."""

    def close(self) -> None:
        """The connection ended (actor gone, error, or training over)."""


class ActorHandler(Protocol):
    failure: str | None  # why the learner failed (``fail``): every connection is then refused with INTERNAL

    def connect(self, hello: HelloInfo) -> tuple[ActorSession, Welcome]:
        """Accept an actor or raise Refused."""

    def fail(self, error: BaseException) -> str:
        """The learner's own code raised ``error`` while serving a connection (not a ``Refused``: nothing the
        peer sent): the run ends with it. Returns ``failure``, what every peer is told from then on."""
