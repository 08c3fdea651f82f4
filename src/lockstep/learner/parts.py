"""The learner's replaceable parts: what may be put into a ``Learner`` from outside.

The benchmarks use them (a trainer that only counts, adversarial delays around the backend, the reference
synchronization designs that ``lockstep bench sync`` measures: ``lockstep_bench.hooks``); ``lockstep train``
runs with ``DEFAULT_PARTS``, the learner as it trains.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lockstep.config import Config
from lockstep.learner.audit_trail import AuditWriter
from lockstep.learner.backends import InferenceBackend, SnapshotBackend
from lockstep.learner.trainer import Trainer
from lockstep.sync import Strategy

# builds the inference backend around the trainer: (trainer, config, expected requests per pass, audit writer)
BackendFactory = Callable[[Trainer, Config, Callable[[], int], "AuditWriter | None"], InferenceBackend]
# builds the audit trail's writer: (directory, config, trainer, fresh)
AuditFactory = Callable[[Path, Config, Trainer, bool], AuditWriter]


def own_audit(directory: Path, config: Config, trainer: Trainer, fresh: bool) -> AuditWriter:
    """The audit trail of one policy (``AuditWriter``)."""
    return AuditWriter(directory, config, fresh=fresh)


@dataclass(frozen=True)
class Parts:
    """``trainer``: the class the learner builds (with ``Trainer``'s constructor); ``backend``: what builds the
    inference backend (``SnapshotBackend``'s constructor); ``strategy``: the synchronization the learner runs
    instead of ``sync.strategy``'s (its name is the one the run records; None: the config's), which must match
    the backend (``lockstep.sync.in_place`` for a backend that serves the live model); ``wrap_backend(backend,
    trainer)``: the backend the learner uses instead of ``backend`` (None: ``backend`` itself); ``audit``: what writes
    the audit trail (a run of several policies: ``learner.team``'s ``PARTS``)."""

    trainer: type[Trainer] = Trainer
    backend: BackendFactory = SnapshotBackend
    audit: AuditFactory = own_audit
    strategy: Strategy | None = None
    wrap_backend: Callable[[InferenceBackend, Trainer], InferenceBackend] | None = None


DEFAULT_PARTS = Parts()
