"""What the benchmarks put into the learner from outside (``learner.parts``): adversarial delays wrapped
around the inference backend, a trainer that checks and counts batches without training on them, and the
reference synchronization designs (``lockstep_bench.reference``) as the backend and the strategy the run records.

Adversarial delays (``--jitter-ms``) fall where a real scheduler could preempt a thread:

    before each forward pass         ``JitteredBackend.infer``, awaited on the event loop
    before each update               ``JitteredBackend.train``, on the trainer thread
    after each publish               ``JitteredBackend.publish``: the snapshot is swapped, the gate not yet told
    in the reference strategies'     ``ReferenceSync.pause``, between each check and the action it guards
    guards (in-place backends only)
    between the policy's networks    a forward hook on the live model's ``actor`` network, in inference passes
    (in-place backends only)         only: a torn read mixes versions across the actor and the critic
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import torch

from lockstep.algo import ppo
from lockstep.learner.backends import InferenceBackend, InferenceStats, SnapshotBackend
from lockstep.learner.parts import DEFAULT_PARTS, Parts
from lockstep.learner.rollout import Batch
from lockstep.learner.trainer import Trainer, TrainStats
from lockstep_bench import reference
from lockstep_bench.runs import Knobs


class Jitter:
    """Random delays up to ``max_ms``; free when ``max_ms`` is 0.

    Thread-safe; ``seconds()`` draws a delay for code that waits its own way (an
    event loop awaits it), calling the object sleeps it.
    """

    def __init__(self, max_ms: float, seed: int) -> None:
        self.max_s = max_ms / 1000.0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def seconds(self) -> float:
        if not self.max_s:
            return 0.0
        with self._lock:
            return self._rng.uniform(0.0, self.max_s)

    def __call__(self) -> None:
        delay = self.seconds()
        if delay:
            time.sleep(delay)


class JitteredBackend:
    """``inner`` with the delays of the module docstring; otherwise ``inner`` itself."""

    def __init__(self, inner: InferenceBackend, trainer: Trainer, jitter: Jitter) -> None:
        self._inner, self._jitter = inner, jitter
        self.state_size = inner.state_size
        design = getattr(inner, "reference", None)  # an in-place backend's design
        if design is not None:
            design.pause = jitter
            actor = getattr(trainer.model, "actor", None)  # in-place backends serve the trainer's own model
            if actor is not None:
                actor.register_forward_hook(self._between_networks)

    def _between_networks(self, *_: Any) -> None:
        if torch.is_inference_mode_enabled():  # serving an actor, not training (which runs under no_grad)
            self._jitter()

    def infer(self, member, obs, keys, counters, state=None):
        delay = self._jitter.seconds()
        if delay:
            return self._infer_later(delay, member, obs, keys, counters, state)
        return self._inner.infer(member, obs, keys, counters, state)

    async def _infer_later(self, delay, member, obs, keys, counters, state):
        await asyncio.sleep(delay)
        return await self._inner.infer(member, obs, keys, counters, state)

    def check_join(self, member: int, num_envs: int) -> None:
        self._inner.check_join(member, num_envs)

    def join(self, member: int, num_envs: int) -> None:
        self._inner.join(member, num_envs)

    def leave(self, member: int) -> None:
        self._inner.leave(member)

    def train(self, update):
        self._jitter()
        return self._inner.train(update)

    def publish(self) -> None:
        self._inner.publish()
        self._jitter()

    def stats(self) -> InferenceStats:
        return self._inner.stats()

    def close(self) -> None:
        self._inner.close()


class CollectOnlyTrainer(Trainer):
    """Checks every batch's version stamps and counts it like ``Trainer.train``, and never updates the policy:
    what collection costs without training (``lockstep bench throughput``'s collect mode, the round trip)."""

    def train(self, batch: Batch) -> TrainStats:
        start = time.perf_counter()
        return self._advance(batch, self._lag(batch), start, 0.0, ppo.UpdateStats(0.0, 0.0, 0.0, 0.0, 0.0, 0))


def parts(knobs: Knobs) -> Parts:
    """The learner's parts for ``knobs``; the jitter draws from the run's seed."""
    if knobs == Knobs():
        return DEFAULT_PARTS

    def wrap(backend: InferenceBackend, trainer: Trainer) -> InferenceBackend:
        return JitteredBackend(backend, trainer, Jitter(knobs.jitter_ms, trainer.config.run.seed))

    return Parts(trainer=CollectOnlyTrainer if knobs.collect_only else Trainer,
                 backend=reference.backend(knobs.design, knobs.inference_threads) if knobs.design else SnapshotBackend,
                 strategy=reference.strategy(knobs.design) if knobs.design else None,
                 wrap_backend=wrap if knobs.jitter_ms else None)
