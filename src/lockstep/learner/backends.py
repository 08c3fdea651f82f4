"""Inference backends: what a synchronization strategy is, on the learner.

The learner builds its backend (``SnapshotBackend``, or the one ``learner.parts`` puts in) and then
only calls the protocol below, never asking which strategy it runs.

    snapshot   strict and pipelined. Inference runs on immutable versioned snapshots
               through the dynamic batcher; the admission gate decides which version
               may act when. ``publish`` builds the next snapshot and swaps one reference.

The benchmarks' reference designs (``lockstep bench sync``) are backends of this protocol too: one
model that the trainer updates in place, guarded by the design's flags
(``dev/lockstep_bench/reference.py``). What they count that a snapshot cannot produce (wasted
passes, rejected requests, torn reads) has its fields in ``InferenceStats``, and their "no action,
send the step again" is ``Retry``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from lockstep.config import Config
from lockstep.learner.audit_trail import AuditWriter
from lockstep.learner.inference import Batcher, InferenceResult, PolicySnapshot
from lockstep.learner.trainer import Trainer

T = TypeVar("T")


@dataclass
class InferenceStats:
    """Totals over the run, for the metrics and the summary."""

    forward_passes: int = 0
    rows_inferred: int = 0
    busy_s: float = 0.0  # seconds spent in forward passes
    wasted_forward_passes: int = 0  # passes whose result was thrown away
    rejected_rpcs: int = 0  # requests answered with "no action, retry"
    torn_reads: int = 0  # passes that read parameters mid-update, used or thrown away
    torn_reads_used: int = 0  # ... of which the result was sent to an actor


class Retry(Exception):
    """Raised by a backend's ``infer`` to answer "no action": the actor sends the same step again, and the
    session serves it with the admission it already holds. Snapshot backends never raise it."""


class InferenceBackend(Protocol):
    state_size: int  # state per env slot that sessions keep and pass in (0: a feedforward policy)

    async def infer(self, member: int, obs: np.ndarray, keys: np.ndarray, counters: np.ndarray,
                    state: np.ndarray) -> InferenceResult:
        """Actions for one actor's request; raises ``Retry`` for "no action, send the step again".

        ``state`` [k, S]: the slots' state, reset where an episode starts; the result carries the
        state after the step."""

    def check_join(self, member: int, num_envs: int) -> None:
        """Raise ``Refused`` naming the problem if an actor with ``num_envs`` slots cannot join; changes nothing.
        ``Sessions.connect`` calls it before anything changes, so that a refused hello leaves no trace."""

    def join(self, member: int, num_envs: int) -> None:
        """An actor with ``num_envs`` slots connected (``check_join`` let it); called before any of its requests.
        Never refuses."""

    def leave(self, member: int) -> None:
        """The actor's connection ended."""

    def train(self, update: Callable[[], T]) -> T:
        """Run one PPO update (``update``) under the backend's guard and return its result."""

    def publish(self) -> None:
        """After an update: make the trainer's current version the one inference serves.

        Called before the gate admits any request for that version."""

    def stats(self) -> InferenceStats: ...

    def close(self) -> None: ...


class SnapshotBackend:
    """Immutable snapshots behind the batcher: no torn reads, no lock on the inference path.

    Every connected actor's slots have fixed rows in the batcher's forward passes (``join`` places
    them, actors in id order), so a slot's numbers do not depend on which requests share a pass.
    """

    def __init__(self, trainer: Trainer, config: Config, expected: Callable[[], int],
                 audit: AuditWriter | None) -> None:
        self._trainer, self._audit = trainer, audit
        self._snapshot = self._build()
        self.state_size = self._snapshot.state_size
        self.batcher = Batcher(lambda: self._snapshot, config.learner.max_batch,
                               config.learner.max_wait_ms / 1000.0, expected)

    def _build(self) -> PolicySnapshot:
        snapshot = self._trainer.snapshot()
        if self._audit is not None:
            self._audit.policy(snapshot.version, snapshot.model.state_dict(), snapshot.obs_mean, snapshot.obs_var)
        return snapshot

    def current(self) -> PolicySnapshot:
        """The snapshot that serves now (self-play's opponents play it and its predecessors)."""
        return self._snapshot

    def check_join(self, member: int, num_envs: int) -> None:
        pass  # any number of slots has its rows

    def join(self, member: int, num_envs: int) -> None:
        self.batcher.place(member, num_envs)

    def leave(self, member: int) -> None:
        self.batcher.remove(member)

    def infer(self, member, obs, keys, counters, state):
        return self.batcher.infer(obs, keys, counters, state, member=member)  # the batcher's own awaitable

    def train(self, update):
        return update()

    def publish(self) -> None:
        self._snapshot = self._build()

    def stats(self) -> InferenceStats:
        b = self.batcher
        return InferenceStats(b.forward_passes, b.rows_inferred, b.busy_s)

    def close(self) -> None:
        pass
