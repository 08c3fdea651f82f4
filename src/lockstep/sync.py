"""The admission gate: which policy version may act for which actor, and when.

This module knows members, steps, versions and waiting; it imports neither gRPC
nor torch, and never blocks: a request is either admitted at once or *held*, and a
held request is released later by a callback (an awaited future in the gRPC
server, an event in tests). Nothing here polls.

Terms
    member   one actor connection. Its k env slots step together, so counting a
             member's steps counts each of its slots' steps.
    phase v  the collection of T steps per member with policy version v.

Protocol (strict)
    * A member that joins while a phase is collecting waits for the next phase.
      The first phase (version 0) starts once ``min_members`` have joined.
    * In phase v a member's requests are admitted as steps t = 0 .. T-1 with
      version v. Its next request carries the outcome of step T-1 (and the
      observation to bootstrap from): the member is then *full* and that request
      is held.
    * The phase *closes* when it has at least one full member and no member still
      collecting. A member that leaves while collecting is removed from the phase
      and its partial unroll dropped, so a phase never waits for a member that is
      gone; one that leaves when full keeps its complete unroll in the phase.
    * ``publish(v + 1)`` (after training on phase v) starts phase v + 1 with every
      current member and releases each held request as step 0 of phase v + 1.
    * A phase whose members have all left, with no full member, accepts joining
      members at once, so nothing waits for a phase that can never close.

Invariants (checked by tests/test_sync.py with real threads and random delays)
    1. Every admission in phase v carries version v; a member is admitted at most
       T times in a phase, and exactly T times if the phase closes with it.
    2. A held request is released exactly once, or discarded when its member
       leaves; never both, never twice.
    3. A phase closes exactly once, and only when no member of it is collecting.
    4. Between the close of phase v and ``publish(v + 1)`` nothing is admitted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

Member = Hashable  # must also be orderable: batches are laid out in member order


@dataclass(frozen=True)
class Admission:
    """Permission to act once: step ``step`` of the unroll collected with ``version``."""

    version: int
    step: int


@dataclass(frozen=True)
class ClosedPhase:
    """A finished phase: the members whose T steps go into the training batch."""

    version: int
    members: tuple[Member, ...]


@dataclass(frozen=True)
class RequestResult:
    """What ``request`` decided.

    ``admission`` is set when the request may act now; otherwise the request is
    held and ``release`` will be called with its admission later. ``completed`` is
    the version whose unroll this request finished (its observation is the
    bootstrap observation), and ``closed`` the phase this request closed.
    """

    admission: Admission | None
    completed: int | None = None
    closed: ClosedPhase | None = None


Release = Callable[[Admission], None]


@dataclass
class _Phase:
    version: int
    steps: dict[Member, int] = field(default_factory=dict)  # admitted steps per member
    full: set[Member] = field(default_factory=set)
    closed: bool = False


class GateError(RuntimeError):
    """A call that breaks the protocol: an unknown member, a second request in flight."""


class StrictGate:
    """Strictly on-policy admission: every step of phase v is taken with version v."""

    def __init__(self, steps_per_phase: int, min_members: int = 1) -> None:
        if steps_per_phase < 1:
            raise ValueError(f"steps_per_phase must be at least 1, got {steps_per_phase}")
        self.steps_per_phase = steps_per_phase
        self.min_members = max(1, min_members)
        self._lock = threading.Lock()
        self._members: set[Member] = set()
        self._held: dict[Member, Release] = {}
        self._phase: _Phase | None = None  # None until the first phase starts

    # -- membership ---------------------------------------------------------------

    def join(self, member: Member) -> None:
        """Add a member; it collects from the next phase on (or at once, see the protocol)."""
        with self._lock:
            if member in self._members:
                raise GateError(f"member {member!r} has already joined")
            self._members.add(member)
            if self._phase is None:
                if len(self._members) >= self.min_members:
                    releases = self._start(0)
                else:
                    releases = []
            elif self._phase_is_empty():
                self._phase.steps[member] = 0
                releases = []
            else:
                releases = []
        _run(releases)

    def leave(self, member: Member) -> tuple[int, ClosedPhase | None]:
        """Remove a member. Returns (steps dropped from its unfinished unroll, phase closed by leaving)."""
        with self._lock:
            if member not in self._members:
                raise GateError(f"member {member!r} is not a member")
            self._members.discard(member)
            self._held.pop(member, None)
            phase = self._phase
            dropped, closed, releases = 0, None, []
            if phase is not None and member in phase.steps and member not in phase.full and not phase.closed:
                dropped = phase.steps.pop(member)
                closed = self._maybe_close()
                if self._phase_is_empty():
                    releases = self._admit_waiting_into_empty_phase()
        _run(releases)
        return dropped, closed

    # -- requests -----------------------------------------------------------------

    def request(self, member: Member, release: Release) -> RequestResult:
        """A member asks to act. Admit now, or hold and call ``release`` later."""
        with self._lock:
            if member not in self._members:
                raise GateError(f"member {member!r} has not joined")
            if member in self._held:
                raise GateError(f"member {member!r} already has a held request")
            phase = self._phase
            if phase is None or phase.closed or member not in phase.steps or member in phase.full:
                # Not collecting in this phase (joined late, or rejoined after its unroll was complete).
                self._held[member] = release
                return RequestResult(None)
            taken = phase.steps[member]
            if taken < self.steps_per_phase:
                phase.steps[member] = taken + 1
                return RequestResult(Admission(phase.version, taken))
            # The (T+1)-th request: the outcome of step T-1 has arrived.
            phase.full.add(member)
            self._held[member] = release
            return RequestResult(None, completed=phase.version, closed=self._maybe_close())

    def publish(self, version: int) -> None:
        """Version ``version`` is live: start its phase and release every held request into it."""
        with self._lock:
            if self._phase is None or not self._phase.closed:
                raise GateError("publish() without a closed phase to follow")
            if version != self._phase.version + 1:
                raise GateError(f"published version {version} does not follow {self._phase.version}")
            releases = self._start(version)
        _run(releases)

    # -- inspection (for logs, watchdogs and tests) --------------------------------

    @property
    def version(self) -> int | None:
        with self._lock:
            return None if self._phase is None else self._phase.version

    def waiting_for(self) -> list[Member]:
        """Members of the current phase that are still collecting."""
        with self._lock:
            if self._phase is None or self._phase.closed:
                return []
            return sorted(m for m in self._phase.steps if m not in self._phase.full)

    def held_count(self) -> int:
        with self._lock:
            return len(self._held)

    # -- internals (lock held) ----------------------------------------------------

    def _start(self, version: int) -> list[tuple[Release, Admission]]:
        self._phase = _Phase(version, {m: 0 for m in self._members})
        return self._release_held()

    def _release_held(self) -> list[tuple[Release, Admission]]:
        phase = self._phase
        releases = []
        for member, release in self._held.items():
            phase.steps[member] = 1
            releases.append((release, Admission(phase.version, 0)))
        self._held.clear()
        return releases

    def _phase_is_empty(self) -> bool:
        phase = self._phase
        return phase is not None and not phase.closed and not phase.steps

    def _admit_waiting_into_empty_phase(self) -> list[tuple[Release, Admission]]:
        for member in self._members:
            self._phase.steps[member] = 0
        return self._release_held()

    def _maybe_close(self) -> ClosedPhase | None:
        phase = self._phase
        if phase.closed or not phase.full or len(phase.full) < len(phase.steps):
            return None
        phase.closed = True
        return ClosedPhase(phase.version, tuple(sorted(phase.full)))


def _run(releases: list[tuple[Release, Admission]]) -> None:
    """Call release callbacks outside the lock, so a callback may call back into the gate."""
    for release, admission in releases:
        release(admission)
