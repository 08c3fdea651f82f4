"""Inference backends: what a synchronization strategy is, on the learner.

The strategy registry (``lockstep.sync``) names a backend family; the learner
builds it with ``make_backend`` and then only calls the protocol below, never
asking which strategy it runs.

    snapshot   strict and pipelined. Inference runs on immutable versioned snapshots
               through the dynamic batcher; the admission gate decides which version
               may act when. ``publish`` builds the next snapshot and swaps one reference.
    in-place   the reference designs (spin-flags, spin-redo, reject-retry, seqlock).
               One model that the trainer updates in place, guarded by the strategy's
               flags; forward passes run on a small thread pool (their spin loops must
               not block the event loop), and optimizer hooks detect torn reads.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
import torch

from lockstep.algo import noise
from lockstep.config import Config
from lockstep.learner.audit_trail import AuditWriter
from lockstep.learner.inference import Batcher, InferenceResult, PolicySnapshot, act
from lockstep.learner.trainer import Trainer
from lockstep.sync import ReferenceSync, Strategy

T = TypeVar("T")
log = logging.getLogger(__name__)


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


class InferenceBackend(Protocol):
    state_size: int  # state per env slot that sessions keep and pass in (0: a feedforward policy)

    async def infer(self, member: int, obs: np.ndarray, keys: np.ndarray, counters: np.ndarray,
                    state: np.ndarray) -> InferenceResult | None:
        """Actions for one actor's request; None means "no action, send the step again".

        ``state`` [k, S]: the slots' state, reset where an episode starts; the result carries the
        state after the step."""

    def join(self, member: int, num_envs: int) -> None:
        """An actor with ``num_envs`` slots connected; called before any of its requests."""

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

    def __init__(self, trainer: Trainer, config: Config, expected: Callable[[], int], audit: AuditWriter | None,
                 reference: ReferenceSync | None = None) -> None:
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


class ParameterStamps:
    """Detects torn reads of parameters that the optimizer updates in place.

    The optimizer's pre- and post-step hooks advance a sequence number (odd while
    it writes). Every parameter is written by each step, so a forward pass during
    which the number was odd or changed read parameters of two versions.
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.sequence = 0
        optimizer.register_step_pre_hook(self._advance)
        optimizer.register_step_post_hook(self._advance)

    def _advance(self, *_: Any) -> None:
        self.sequence += 1

    def torn(self, before: int, after: int) -> bool:
        return bool(before & 1) or before != after


class InPlaceBackend:
    """The reference designs: one live model, the strategy's flags around every pass and every update.

    Feedforward policies only (the config refuses an LSTM with these strategies)."""

    def __init__(self, trainer: Trainer, config: Config, expected: Callable[[], int], audit: AuditWriter | None,
                 reference: ReferenceSync | None = None) -> None:
        if reference is None:
            raise ValueError("the in-place backend needs a reference strategy")
        log.warning("sync strategy %s is a reference design kept for comparison: it does not keep PPO on-policy "
                    "and can read half-updated parameters; use strict or pipelined to train", reference.name)
        self._trainer, self._audit, self.reference = trainer, audit, reference
        self.stamps = ParameterStamps(trainer.optimizer)
        self._pool = ThreadPoolExecutor(config.debug.inference_threads, thread_name_prefix="lockstep-infer")
        self._stats = InferenceStats()
        self._lock = threading.Lock()
        self.state_size = trainer.model.state_size
        self.publish()

    def join(self, member: int, num_envs: int) -> None:
        pass  # every request is its own pass: its shape is its actor's slot count already

    def leave(self, member: int) -> None:
        pass

    async def infer(self, member, obs, keys, counters, state):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._guarded_pass, member, obs, keys, counters, state)

    def _guarded_pass(self, member: int, obs: np.ndarray, keys: np.ndarray, counters: np.ndarray,
                      state: np.ndarray) -> InferenceResult | None:
        result = self.reference.infer(member, lambda: self._forward(obs, keys, counters, state))
        if result is not None and result.torn:
            with self._lock:
                self._stats.torn_reads_used += 1
        return result

    def _forward(self, obs: np.ndarray, keys: np.ndarray, counters: np.ndarray,
                 state: np.ndarray) -> InferenceResult:
        """One forward pass on the live model, stamped torn if an update overlapped it."""
        trainer, stats = self._trainer, self._stats
        start = time.perf_counter()
        version, before = trainer.version, self.stamps.sequence
        model = trainer.model
        actions, logprobs, values, after = act(model, trainer.normalizer(), np.array(obs),
                                               noise.uniform(keys, counters, model.noise_width), state,
                                               trainer.device)
        result = InferenceResult(actions, logprobs, values, version, after,
                                 torn=self.stamps.torn(before, self.stamps.sequence))
        with self._lock:  # several pool threads count
            stats.torn_reads += result.torn
            stats.forward_passes += 1
            stats.rows_inferred += len(obs)
            stats.busy_s += time.perf_counter() - start
        return result

    def train(self, update):
        return self.reference.train(update)

    def publish(self) -> None:
        if self._audit is not None:
            trainer, rms = self._trainer, self._trainer.obs_rms
            self._audit.policy(trainer.version, trainer.model.state_dict(),
                               None if rms is None else rms.mean, None if rms is None else rms.var)

    def stats(self) -> InferenceStats:
        s = self._stats
        return InferenceStats(s.forward_passes, s.rows_inferred, s.busy_s, self.reference.wasted_forward_passes,
                              self.reference.rejected_rpcs, s.torn_reads, s.torn_reads_used)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


BACKENDS: dict[str, type] = {"snapshot": SnapshotBackend, "in-place": InPlaceBackend}


def make_backend(strategy: Strategy, trainer: Trainer, config: Config, expected: Callable[[], int],
                 audit: AuditWriter | None) -> InferenceBackend:
    """The backend of ``strategy``'s family, built around ``trainer``."""
    return BACKENDS[strategy.backend](trainer, config, expected, audit, reference=strategy.reference())
