"""The admission gate: which policy version may act for which actor, and when.

This module knows members, phases, versions and waiting; it imports neither gRPC
nor torch, and never blocks: a request is either admitted at once or *held*, and a
held request is released later by a callback (an awaited future in the gRPC
server, an event in tests). Nothing here polls.

Terms
    member     one actor connection. Its k env slots step together, so counting a
               member's steps counts each of its slots' steps.
    phase u    the u-th unroll of T steps per member. The trainer trains the phases
               in order, one version per phase, so phase u is trained by version u.
    published  the newest policy version; inference always uses it.
    lag        (version that trains a sample) - (version that produced it).

Protocol
    * The first phase (0) starts once ``min_members`` have joined; until then every
      request is held.
    * A member's requests are admitted as steps t = 0 .. T-1 of its current phase u,
      with the published version, but only while ``published >= u - max_lag``: the
      sample's lag is then at most ``max_lag``. Otherwise the request is held until
      ``publish`` makes it admissible. ``max_lag=0`` is strict on-policy mode: phase u
      collects only with version u. ``max_lag=None`` never holds (reference
      strategies, which bound nothing).
    * The request after step T-1 carries its outcome and the observation to bootstrap
      from: the member's unroll of phase u is *complete* and the member moves on to
      phase u+1, the same request asking to be its step 0.
    * Phase u *closes* when no member collects in it any more and at least one
      unroll of it is complete. Phases close in order. A member that leaves drops its
      unfinished unroll (so a phase never waits for a member that is gone) and keeps
      its complete ones.
    * A member that joins collects from the newest phase, or from the one after if a
      step has already been admitted in it (it never delays a phase under way).
    * A phase that every collecting member left before completing it stays open for
      joiners while nobody waits beyond it; once a member waits beyond it, it closes
      with no unrolls and the trainer publishes the next version unchanged.
      With ``close_empty`` (several learners: the other ranks wait for this one's
      update) a started gate with no member at all closes its oldest open phase with
      no unrolls as soon as that phase's version is published (at the last leave, or
      at ``publish``), so a learner whose actors are all gone still trains every version.
    * ``publish(v)`` (after training phase v-1) makes version v the newest and
      releases every held request that has become admissible.
    * Straggler cut-off (DD-PPO, optional): once members holding a fraction
      ``cutoff`` of the oldest open phase's weight (env slots) have completed it and
      every member still collecting in it has at least ``min_unroll`` * T steps,
      those members get no more steps in it: each one's next request completes a
      shorter unroll, bootstrapped where it was cut.
    * ``start_version`` (a resumed run): the first phase and version are that number.

Invariants (tests/sync/ checks them with real threads and random delays,
``lockstep_verify`` exhaustively for small sizes)
    1. Every admission for phase u carries a version v with u - max_lag <= v <= u;
       a member is admitted at most T times per phase, exactly T if the phase closes
       with its unroll (with the cut-off: at least ceil(min_unroll * T) times).
    2. A held request is released exactly once, or discarded when its member leaves.
    3. Each phase closes exactly once, after the phase before it, and only when no
       member is still collecting in it.
    4. Strict mode: between the close of phase v and ``publish(v + 1)`` nothing is admitted.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

Member = Hashable  # must also be orderable: batches are laid out in member order


@dataclass(frozen=True)
class Admission:
    """Permission to act once: step ``step`` of the member's unroll for ``phase``, taken with ``version``."""

    version: int
    step: int
    phase: int


@dataclass(frozen=True)
class ClosedPhase:
    """A finished phase: the members whose complete unrolls make up its training batch."""

    phase: int
    members: tuple[Member, ...]

    @property
    def version(self) -> int:
        """The version that trains this phase."""
        return self.phase


@dataclass(frozen=True)
class RequestResult:
    """What ``request`` decided.

    ``admission`` is set when the request may act now; otherwise the request is
    held and ``release`` will be called with its admission later. ``completed`` is
    the phase whose unroll this request completed (its observation is the bootstrap
    observation), and ``closed`` the phases this request closed, oldest first.
    """

    admission: Admission | None
    completed: int | None = None
    closed: tuple[ClosedPhase, ...] = ()


Release = Callable[[Admission], None]


@dataclass
class _MemberState:
    phase: int  # the phase it collects in now
    steps: int = 0  # steps admitted in that phase
    first_phase: int = 0
    budget: int = 0  # steps it may take in that phase: T, or fewer once the phase is cut
    weight: int = 1  # its share of the phase (env slots), for the cut-off fraction


@dataclass
class _PhaseState:
    complete: dict = field(default_factory=dict)  # member -> weight, for members whose unroll is complete


class GateError(RuntimeError):
    """A call that breaks the protocol: an unknown member, a second request in flight."""


class AdmissionGate:
    def __init__(self, steps_per_phase: int, min_members: int = 1, max_lag: int | None = 0,
                 start_version: int = 0, cutoff: float | None = None, min_unroll: float = 0.0,
                 close_empty: bool = False) -> None:
        if steps_per_phase < 1:
            raise ValueError(f"steps_per_phase must be at least 1, got {steps_per_phase}")
        if max_lag is not None and max_lag < 0:
            raise ValueError(f"max_lag must be >= 0 or None, got {max_lag}")
        if cutoff is not None and not 0.0 < cutoff <= 1.0:
            raise ValueError(f"cutoff must be in (0, 1], got {cutoff}")
        if not 0.0 <= min_unroll <= 1.0:
            raise ValueError(f"min_unroll must be in [0, 1], got {min_unroll}")
        self.steps_per_phase = steps_per_phase
        self.cutoff = cutoff
        self.min_cut_steps = max(1, math.ceil(min_unroll * steps_per_phase))
        self.min_members = max(1, min_members)
        self.max_lag = max_lag
        self.close_empty = close_empty
        self._lock = threading.Lock()
        self._members: dict[Member, _MemberState] = {}
        self._held: dict[Member, Release] = {}
        self._phases: dict[int, _PhaseState] = {}  # open phases with complete unrolls
        self._started = False
        self._published = start_version
        self._next_close = start_version  # the oldest phase not yet closed
        self._cut: int | None = None  # the phase whose collecting members were cut

    # -- membership ---------------------------------------------------------------

    def join(self, member: Member, weight: int = 1) -> None:
        """Add a member (see the protocol for the phase it starts in); ``weight`` is its env slots."""
        with self._lock:
            if member in self._members:
                raise GateError(f"member {member!r} has already joined")
            first = self._joining_phase() if self._started else self._published
            self._members[member] = _MemberState(first, first_phase=first, budget=self.steps_per_phase,
                                                 weight=weight)
            releases = []
            if not self._started and len(self._members) >= self.min_members:
                self._started = True
                releases = self._release_admissible()
        _run(releases)

    def leave(self, member: Member) -> tuple[int, tuple[ClosedPhase, ...]]:
        """Remove a member. Returns (steps dropped from its unfinished unroll, phases closed by leaving)."""
        with self._lock:
            state = self._members.pop(member, None)
            if state is None:
                raise GateError(f"member {member!r} is not a member")
            self._held.pop(member, None)
            closed = self._close_ready() if self._started else ()
            releases = self._release_admissible() if self._started else []
            self._maybe_cut()
        _run(releases)
        return state.steps, closed

    # -- requests -----------------------------------------------------------------

    def request(self, member: Member, release: Release) -> RequestResult:
        """A member asks to act. Admit now, or hold and call ``release`` later."""
        with self._lock:
            state = self._members.get(member)
            if state is None:
                raise GateError(f"member {member!r} has not joined")
            if member in self._held:
                raise GateError(f"member {member!r} already has a held request")
            completed, closed = None, ()
            if state.steps == state.budget:  # this request carries the outcome of the unroll's last step
                completed = state.phase
                self._phases.setdefault(state.phase, _PhaseState()).complete[member] = state.weight
                state.phase, state.steps, state.budget = state.phase + 1, 0, self.steps_per_phase
                closed = self._close_ready()
            admission = self._admit(state) if self._started else None
            if admission is None:
                self._held[member] = release
            self._maybe_cut()
            return RequestResult(admission, completed, closed)

    def publish(self, version: int) -> tuple[ClosedPhase, ...]:
        """Version ``version`` is the newest: release every held request it makes admissible. Returns the
        phases this closed (only with ``close_empty``: an empty phase of a gate without members)."""
        with self._lock:
            if version != self._published + 1:
                raise GateError(f"published version {version} does not follow {self._published}")
            if version > self._next_close:
                raise GateError(f"publish({version}) before phase {version - 1} closed")
            self._published = version
            releases = self._release_admissible()
            closed = self._close_ready() if self.close_empty and self._started else ()
        _run(releases)
        return closed

    # -- inspection (for logs, watchdogs and tests) --------------------------------

    @property
    def published(self) -> int:
        with self._lock:
            return self._published

    @property
    def started(self) -> bool:
        with self._lock:
            return self._started

    @property
    def oldest_open(self) -> int:
        """The oldest phase that has not closed: the one being collected, or waiting for its stragglers."""
        with self._lock:
            return self._next_close

    def waiting_for(self) -> list[Member]:
        """Members still collecting in the oldest open phase."""
        with self._lock:
            u = self._next_close
            return sorted(m for m, s in self._members.items() if s.first_phase <= u and s.phase <= u)

    def held_count(self) -> int:
        with self._lock:
            return len(self._held)

    # -- internals (lock held) ----------------------------------------------------

    def _maybe_cut(self) -> None:
        """Cut the oldest open phase's stragglers short (see the protocol), at most once per phase."""
        u = self._next_close
        if self.cutoff is None or self._cut == u or u not in self._phases:
            return
        collecting = [s for s in self._members.values() if s.first_phase <= u and s.phase == u]
        if not collecting:
            return
        done = sum(self._phases[u].complete.values())
        if done < self.cutoff * (done + sum(s.weight for s in collecting)):
            return
        if any(s.steps < self.min_cut_steps for s in collecting):
            return
        self._cut = u
        for state in collecting:
            state.budget = state.steps

    def _admissible(self, phase: int) -> bool:
        return self.max_lag is None or self._published >= phase - self.max_lag

    def _admit(self, state: _MemberState) -> Admission | None:
        if not self._admissible(state.phase):
            return None
        step = state.steps
        state.steps += 1
        return Admission(self._published, step, state.phase)

    def _release_admissible(self) -> list[tuple[Release, Admission]]:
        releases = []
        for member in sorted(self._held):
            admission = self._admit(self._members[member])
            if admission is not None:
                releases.append((self._held.pop(member), admission))
        return releases

    def _joining_phase(self) -> int:
        """The newest phase, unless a step has been admitted in it: then the one after."""
        # Phases with complete unrolls count too: a member that completed them may have left.
        newest = max([s.phase for s in self._members.values()] + [self._next_close, *self._phases])
        under_way = newest in self._phases or any(s.phase == newest and s.steps for s in self._members.values())
        return newest + 1 if under_way else newest

    def _close_ready(self) -> tuple[ClosedPhase, ...]:
        closed = []
        while True:
            u = self._next_close
            if any(s.first_phase <= u and s.phase <= u for s in self._members.values()):
                break  # someone still collects in it
            phase = self._phases.pop(u, None)
            if phase is None and not any(s.first_phase > u for s in self._members.values()) \
                    and not any(p > u for p in self._phases) \
                    and not (self.close_empty and not self._members and u <= self._published):
                break  # empty, and nothing waits beyond it (no member, no complete unroll): open for joiners
            # An empty phase that members wait beyond closes with no unrolls: the trainer
            # publishes the next version unchanged, so nothing waits for it forever.
            closed.append(ClosedPhase(u, tuple(sorted(phase.complete)) if phase else ()))
            self._next_close = u + 1
        return tuple(closed)


def _run(releases: list[tuple[Release, Admission]]) -> None:
    """Call release callbacks outside the lock, so a callback may call back into the gate."""
    for release, admission in releases:
        release(admission)
