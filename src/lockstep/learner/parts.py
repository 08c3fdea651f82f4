"""The learner's replaceable parts: what may be put into a ``Learner`` from outside.

The benchmarks use them (a trainer that only counts, adversarial delays around the backend:
``lockstep_bench.hooks``); ``lockstep train`` runs with ``DEFAULT_PARTS``, the learner as it trains.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lockstep.learner.backends import InferenceBackend
from lockstep.learner.trainer import Trainer


@dataclass(frozen=True)
class Parts:
    """``trainer``: the class the learner builds (with ``Trainer``'s constructor); ``wrap_backend(backend,
    trainer)``: the backend the learner uses instead of ``backend`` (None: ``backend`` itself)."""

    trainer: type[Trainer] = Trainer
    wrap_backend: Callable[[InferenceBackend, Trainer], InferenceBackend] | None = None


DEFAULT_PARTS = Parts()
