"""When a dead actor is restarted: the one restart policy of every launcher, and the supervision loop
of the launchers that restart actors themselves (local processes, in-process env loops).

An actor that ended is restarted unless a restart cannot help (it finished: training is over; the
learner refused it: it would be refused again; the learner failed), training is over, or it has used its
``max_restarts``; otherwise after an exponential backoff (1 s, 2 s, 4 s, ... capped), counted per
actor. Ray restarts its workers itself (``launch.ray``) and asks the same policy whether, and when,
to run the actor loop again.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from lockstep.common.backoff import Backoff

if TYPE_CHECKING:
    from lockstep.learner.wiring import Learner

log = logging.getLogger("lockstep.train")

# actor exit codes (``lockstep.actor.run``); a restart cannot help but after FAILED
FINISHED, FAILED, REFUSED, LEARNER_FAILED = 0, 1, 2, 3


class RestartPolicy:
    """Decides whether and when each dead actor is restarted, and counts the restarts."""

    def __init__(self, max_restarts: int, backoff_s: float = 1.0, max_backoff_s: float = 30.0) -> None:
        self.max_restarts, self.backoff_s, self.max_backoff_s = max_restarts, backoff_s, max_backoff_s
        self._backoffs: dict[int, Backoff] = {}
        self._counts: dict[int, int] = {}

    @property
    def restarts(self) -> int:
        """Restarts of all actors so far (summary.json: ``actor_restarts``)."""
        return sum(self._counts.values())

    def restarts_of(self, actor_id: int) -> int:
        return self._counts.get(actor_id, 0)

    def delay(self, actor_id: int, exit_code: int | None, cause: str, training: bool) -> float | None:
        """Seconds until actor ``actor_id``, which ended with ``exit_code`` (None: a worker that died without
        one) as ``cause`` says ("died (exit code -9)"), is restarted; None: it stays down. Logs the decision."""
        if not training or exit_code in (FINISHED, REFUSED, LEARNER_FAILED):
            return None
        if self.restarts_of(actor_id) >= self.max_restarts:
            log.error("actor %d %s and has used its %d restarts; not restarting", actor_id, cause, self.max_restarts)
            return None
        backoff = self._backoffs.setdefault(actor_id, Backoff(self.backoff_s, self.max_backoff_s, jitter=False))
        delay = backoff.delay()
        log.warning("actor %d %s; restarting in %.1f s", actor_id, cause, delay)
        return delay

    def restarted(self, actor_id: int) -> int:
        """Count one restart of ``actor_id``; returns its restarts so far."""
        self._counts[actor_id] = self.restarts_of(actor_id) + 1
        return self._counts[actor_id]


H = TypeVar("H")  # what a launcher holds of a running actor: a process, a future


@dataclass
class Supervised(Generic[H]):
    actor_id: int
    handle: H | None = None  # None: not started, or gone for good
    restart_at: float | None = None  # when a dead actor is due to be restarted


class Supervisor(ABC, Generic[H]):
    """Actors that this process starts and restarts itself, as the ``RestartPolicy`` says; a ``Launcher``
    once ``start`` has been given the learner. Subclasses say how an actor is started, ended and read."""

    def __init__(self, actor_ids: list[int], policy: RestartPolicy) -> None:
        self.actors: list[Supervised[H]] = [Supervised(i) for i in actor_ids]
        self.policy = policy

    @property
    def restarts(self) -> int:
        return self.policy.restarts

    def prepare(self) -> None:
        """Nothing to do before the learner serves."""

    def start(self, learner: Learner) -> None:
        for actor in self.actors:
            actor.handle = self._spawn(actor.actor_id)

    def check(self, training: bool) -> None:
        """Restart actors that died while training runs, once their backoff has passed."""
        now = time.monotonic()
        for actor in self.actors:
            if actor.restart_at is not None:
                if now >= actor.restart_at:
                    actor.restart_at = None
                    count = self.policy.restarted(actor.actor_id)
                    log.warning("restarting actor %d (restart %d of at most %d)",
                                actor.actor_id, count, self.policy.max_restarts)
                    actor.handle = self._spawn(actor.actor_id)
                continue
            if actor.handle is None or not training:
                continue
            code = self._exit_code(actor.handle)
            if code is None:
                continue
            delay = self.policy.delay(actor.actor_id, code, self._cause(code), training)
            if delay is not None:
                actor.restart_at = now + delay
            elif code not in (FINISHED, REFUSED, LEARNER_FAILED):
                actor.handle = None  # dead for good

    def all_exited(self) -> bool:
        return not any(a.restart_at is not None or (a.handle is not None and self._exit_code(a.handle) is None)
                       for a in self.actors)

    def stop(self, grace_s: float = 5.0) -> None:
        for actor in self.actors:
            actor.restart_at = None
        self._end([a.handle for a in self.actors if a.handle is not None], grace_s)

    @abstractmethod
    def _spawn(self, actor_id: int) -> H:
        """Start actor ``actor_id``."""

    @abstractmethod
    def _exit_code(self, handle: H) -> int | None:
        """The actor's exit code; None while it runs."""

    @abstractmethod
    def _cause(self, code: int) -> str:
        """How an actor that ended with ``code`` ended, for the log ("died (exit code -9)")."""

    @abstractmethod
    def _end(self, handles: list[H], grace_s: float) -> None:
        """Wait up to ``grace_s`` for these actors to end on their own, then end the rest."""
