"""The reference synchronizations: the flag-based designs users of SEED-style systems propose.

Implemented faithfully, spins and all, so that ``lockstep bench sync`` can measure them against the
admission gate on the real learner. They are not ways to train (``sync.strategy`` offers strict and
pipelined); they go into the learner as its parts (``lockstep_bench.hooks``: ``backend`` and ``strategy``
below). Each guards two operations on one policy whose parameters the trainer updates *in place*:

    infer(actor, forward)  run ``forward`` (one forward pass) for an actor's request;
                           return its result, or None for "no action, retry"
    train(update)          run ``update`` (a whole PPO update) and return its result

Between a check and the action it guards, each calls ``self.pause()``: a no-op
normally, a random sleep under ``--adversarial``, standing for the preemption that
can happen there in any real scheduler.

What goes wrong, by design (see docs/synchronization.md for the measurements):
    spin-flags    busy-waits on both sides; check-then-set on both sides is not
                  atomic, so an inference can start just after the trainer checked
                  the flags and read parameters mid-update (a torn read).
    spin-redo     busy-waits; a training that starts and ends within one forward
                  pass goes unnoticed (torn read); every redo wastes a forward pass.
    reject-retry  no spinning on the learner, but rejected RPCs and wasted forward
                  passes; the same blind spot as spin-redo.
    seqlock       the sound form of reject-retry: a counter that is odd while
                  training and changes with every update detects any overlap.
No reference strategy bounds how far a fast actor runs ahead, so samples collected
with version v can be trained by version v+1 or later (off-policy samples): their
strategy (``lockstep.sync.in_place``) has no lag bound, and the gate never holds.

``InPlaceBackend`` serves them on the learner: the live model, the design's flags around every pass and
every update, forward passes on a small thread pool (their spin loops must not block the event loop),
and optimizer hooks that detect torn reads (``ParameterStamps``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import torch

from lockstep import sync
from lockstep.algo import noise
from lockstep.config import Config
from lockstep.learner.audit_trail import AuditWriter
from lockstep.learner.backends import InferenceStats, Retry
from lockstep.learner.inference import InferenceResult, act
from lockstep.learner.trainer import Trainer

T = TypeVar("T")
log = logging.getLogger(__name__)


class ReferenceSync:
    name = ""

    def __init__(self, pause: Callable[[], None] | None = None) -> None:
        self.pause = pause or (lambda: None)
        self.spins = 0  # iterations of busy-wait loops
        self.wasted_forward_passes = 0  # forward passes whose result was thrown away
        self.rejected_rpcs = 0  # requests answered with "no action, retry"
        self._count_lock = threading.Lock()

    def _count(self, attr: str) -> None:
        with self._count_lock:
            setattr(self, attr, getattr(self, attr) + 1)

    def infer(self, actor: int, forward: Callable[[], T]) -> T | None:
        raise NotImplementedError

    def train(self, update: Callable[[], T]) -> T:
        raise NotImplementedError


class SpinFlags(ReferenceSync):
    """A ``training`` flag and an ``inferring[actor]`` flag per actor; both sides spin."""

    name = "spin-flags"

    def __init__(self, pause=None) -> None:
        super().__init__(pause)
        self.training = False
        self.inferring: dict[int, bool] = {}

    def infer(self, actor, forward):
        while self.training:
            self.spins += 1
        self.pause()
        self.inferring[actor] = True
        try:
            return forward()
        finally:
            self.inferring[actor] = False

    def train(self, update):
        self.training = True
        self.pause()
        while any(self.inferring.values()):
            self.spins += 1
        try:
            return update()
        finally:
            self.training = False


class _TrainingFlag(ReferenceSync):
    """One ``training`` flag, set for the whole update; how inference reads it is the subclass's design."""

    def __init__(self, pause=None) -> None:
        super().__init__(pause)
        self.training = False

    def train(self, update):
        self.training = True
        try:
            return update()
        finally:
            self.training = False


class SpinRedo(_TrainingFlag):
    """One ``training`` flag; inference spins while it is set and redoes a pass it saw set afterwards."""

    name = "spin-redo"

    def infer(self, actor, forward):
        while True:
            while self.training:
                self.spins += 1
            self.pause()
            result = forward()
            if not self.training:
                return result
            self._count("wasted_forward_passes")


class RejectRetry(_TrainingFlag):
    """One ``training`` flag, checked before and after the pass; if set, answer "no action" and the actor retries."""

    name = "reject-retry"

    def infer(self, actor, forward):
        if self.training:
            self._count("rejected_rpcs")
            return None
        self.pause()
        result = forward()
        if self.training:
            self._count("wasted_forward_passes")
            self._count("rejected_rpcs")
            return None
        return result


class SeqLock(ReferenceSync):
    """A sequence counter, odd while the parameters are being written; read before and after the pass."""

    name = "seqlock"

    def __init__(self, pause=None) -> None:
        super().__init__(pause)
        self.sequence = 0

    def infer(self, actor, forward):
        before = self.sequence
        if before & 1:
            self._count("rejected_rpcs")
            return None
        self.pause()
        result = forward()
        if self.sequence != before:
            self._count("wasted_forward_passes")
            self._count("rejected_rpcs")
            return None
        return result

    def train(self, update):
        self.sequence += 1  # odd: writing
        try:
            return update()
        finally:
            self.sequence += 1  # even again, and different from any value a reader saw before


DESIGNS: dict[str, type[ReferenceSync]] = {cls.name: cls for cls in (SpinFlags, SpinRedo, RejectRetry, SeqLock)}
NAMES = (*sync.NAMES, *DESIGNS)  # what ``lockstep bench sync`` compares: the strategies, then the designs


def strategy(name: str) -> sync.Strategy:
    """The strategy a run of design ``name`` runs and records: no lag bound, no snapshots."""
    return sync.in_place(name, (DESIGNS[name].__doc__ or "").strip().splitlines()[0])


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
    """A reference design on the learner: one live model, the design's flags around every pass and every update.

    Feedforward policies only: a recurrent policy's state per slot needs the snapshots' fixed rows."""

    def __init__(self, trainer: Trainer, audit: AuditWriter | None, reference: ReferenceSync, threads: int) -> None:
        if trainer.model.state_size:
            raise ValueError(f"the reference design {reference.name} serves feedforward policies only; "
                             "set model.lstm_size 0")
        log.warning("sync strategy %s is a reference design kept for comparison: it does not keep PPO on-policy "
                    "and can read half-updated parameters; use strict or pipelined to train", reference.name)
        self._trainer, self._audit, self.reference = trainer, audit, reference
        self.stamps = ParameterStamps(trainer.optimizer)
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="lockstep-infer")
        self._stats = InferenceStats()
        self._lock = threading.Lock()
        self.state_size = trainer.model.state_size
        self.publish()

    def check_join(self, member: int, num_envs: int) -> None:
        pass  # any number of slots: every request is its own pass

    def join(self, member: int, num_envs: int) -> None:
        pass  # every request is its own pass: its shape is its actor's slot count already

    def leave(self, member: int) -> None:
        pass

    async def infer(self, member, obs, keys, counters, state):
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self._pool, self._guarded_pass, member, obs, keys, counters, state)
        if result is None:  # the design answered "no action": the actor sends the step again
            raise Retry
        return result

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


def backend(name: str, threads: int = 2) -> Callable[[Trainer, Config, Callable[[], int], AuditWriter | None],
                                                         InPlaceBackend]:
    """What builds the learner's backend for design ``name`` (``Parts.backend``); ``threads``: the pool that runs
    its forward passes, one per request, as in the designs."""

    def build(trainer: Trainer, config: Config, expected: Callable[[], int],
              audit: AuditWriter | None) -> InPlaceBackend:
        return InPlaceBackend(trainer, audit, DESIGNS[name](), threads)

    return build
