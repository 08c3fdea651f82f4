"""Synchronization between inference and training, chosen by name (``--sync NAME``).

``strict`` and ``pipelined`` use the admission gate (``gate.py``) and immutable
policy snapshots; the reference strategies (``reference.py``) guard one policy
that the trainer updates in place, as the designs they reproduce do. Nothing in
this package imports gRPC or torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lockstep.sync.gate import Admission, AdmissionGate, ClosedPhase, GateError, RequestResult
from lockstep.sync.reference import REFERENCE, ReferenceSync


@dataclass(frozen=True)
class Strategy:
    name: str
    max_lag: int | None  # the gate's bound on policy lag; None: unbounded
    snapshots: bool  # inference on immutable versioned snapshots (else on the live, in-place-updated model)
    summary: str

    @property
    def backend(self) -> str:
        """The inference backend family: "snapshot" (immutable versions behind the gate) or "in-place"."""
        return "snapshot" if self.snapshots else "in-place"

    def gate(self, steps_per_phase: int, min_members: int, **options) -> AdmissionGate:
        """The admission gate for this strategy (options: start_version, cutoff, min_unroll)."""
        return AdmissionGate(steps_per_phase, min_members, self.max_lag, **options)

    def reference(self, pause: Callable[[], None] | None = None) -> ReferenceSync | None:
        return REFERENCE[self.name](pause) if self.name in REFERENCE else None


def strategy(name: str, max_lag: int = 1) -> Strategy:
    """The strategy registered as ``name``; ``max_lag`` applies to ``pipelined``."""
    if name == "strict":
        return Strategy("strict", 0, True, "admission gate, T steps per version, strictly on-policy")
    if name == "pipelined":
        if max_lag < 1:
            raise ValueError(f"pipelined mode needs --max-lag >= 1, got {max_lag} (0 is --sync strict)")
        return Strategy("pipelined", max_lag, True, f"admission gate, collection overlaps training, lag <= {max_lag}")
    if name in REFERENCE:
        return Strategy(name, None, False, (REFERENCE[name].__doc__ or "").strip().splitlines()[0])
    raise ValueError(f"unknown synchronization {name!r}; choose one of {', '.join(NAMES)}")


NAMES = ("strict", "pipelined", *REFERENCE)

__all__ = ["Admission", "AdmissionGate", "ClosedPhase", "GateError", "RequestResult", "Strategy",
           "strategy", "NAMES", "ReferenceSync"]
