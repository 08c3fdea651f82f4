"""Synchronization between inference and training, chosen by name (``--sync NAME``).

``strict``, ``pipelined`` and ``async`` use the admission gate (``gate.py``) and immutable policy
snapshots; they differ in the lag they allow (the versions between the one that acted a sample and the one that
trains on it): none, one by default, several (four by default) with V-trace correcting it. The flag designs
they were measured against (spin flags, one flag with redo, reject and retry, the seqlock) are the benchmarks'
reference designs, not ways to train: ``lockstep bench sync`` runs them (``dev/lockstep_bench/reference.py``);
here only their names remain, so that a config naming one is told where they went and the audit can still judge
their runs' trails. Nothing in this package imports gRPC or torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from lockstep.sync.gate import Admission, AdmissionGate, ClosedPhase, GateError, RequestResult


@dataclass(frozen=True)
class Strategy:
    name: str
    max_lag: int | None  # the gate's bound on policy lag; None: unbounded
    snapshots: bool  # inference on immutable versioned snapshots (else on the live, in-place-updated model)
    summary: str

    def gate(self, steps_per_phase: int, min_members: int, **options) -> AdmissionGate:
        """The admission gate for this strategy (options: start_version, cutoff, min_unroll)."""
        return AdmissionGate(steps_per_phase, min_members, self.max_lag, **options)


NAMES = ("strict", "pipelined", "async")  # what ``sync.strategy`` offers: the strategies that train correctly

DEFAULT_LAG = {"pipelined": 1, "async": 4}  # ``sync.max_lag`` when the config leaves it unset

REFERENCE_DESIGNS = ("spin-flags", "spin-redo", "reject-retry", "seqlock")


def moved(name: str) -> str:
    """Where the reference design ``name`` went, for the error that refuses it."""
    return (f"{name!r} is a reference design of the synchronization benchmark, not a way to train: it moved to "
            f"the benchmarks (pip install -e ./dev): `lockstep bench sync` measures it against strict and "
            f"pipelined (docs/synchronization.md), `python -m lockstep_bench.train --design {name}` runs it alone. "
            f"Train with strict, pipelined or async")


def strategy(name: str, max_lag: int | None = None) -> Strategy:
    """The strategy registered as ``name``; ``max_lag`` (None: the strategy's default) applies to ``pipelined``
    and ``async``. All three are the admission gate over snapshots: the gate serves the newest published
    version and holds a request only where serving it would make a sample lag more than ``max_lag``."""
    if name == "strict":
        return Strategy("strict", 0, True, "admission gate, T steps per version, strictly on-policy")
    if name in DEFAULT_LAG:
        lag = DEFAULT_LAG[name] if max_lag is None else max_lag
        if lag < 1:
            raise ValueError(f"{name} mode needs --max-lag >= 1, got {lag} (0 is --sync strict)")
        if name == "pipelined":
            return Strategy(name, lag, True, f"admission gate, collection overlaps training, lag <= {lag}")
        return Strategy(name, lag, True, f"admission gate, actors held only at the lag bound, lag <= {lag}")
    if name in REFERENCE_DESIGNS:
        raise ValueError(f"synchronization {moved(name)}")
    raise ValueError(f"unknown synchronization {name!r}; choose one of {', '.join(NAMES)}")


def in_place(name: str, summary: str) -> Strategy:
    """A design that serves one policy the trainer updates in place (a reference design): no lag bound
    (its gate never holds), no snapshots."""
    return Strategy(name, None, False, summary)


def recorded(name: str, max_lag: int | None = None) -> Strategy:
    """The rules a run that recorded ``name`` is judged by (``lockstep audit``): a strategy's above, or, for a
    reference design of the benchmarks, the in-place rules its trail was written under."""
    if name in REFERENCE_DESIGNS:
        return in_place(name, "a reference design of lockstep bench sync")
    return strategy(name, max_lag)


__all__ = ["Admission", "AdmissionGate", "ClosedPhase", "GateError", "RequestResult", "Strategy", "strategy",
           "in_place", "recorded", "moved", "NAMES", "DEFAULT_LAG", "REFERENCE_DESIGNS"]
