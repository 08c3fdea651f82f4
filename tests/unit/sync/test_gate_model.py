"""The admission gate against a reference model written from its module docstring.

A hypothesis state machine drives random join/request/leave/publish sequences,
single-threaded, for max_lag in {0, 1, 2, None}, and checks every result and
release callback against the model.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from lockstep.sync import Admission, AdmissionGate, ClosedPhase, GateError, RequestResult

# ---------------------------------------------------------------------------------
# 7: stateful test against a reference model, for max_lag in {0, 1, 2, None}
# ---------------------------------------------------------------------------------

MEMBERS = st.integers(min_value=0, max_value=4)


@dataclass
class _ModelMember:
    phase: int  # the phase it collects in (or waits for)
    first: int  # the phase it joined in
    steps: int = 0  # steps admitted in ``phase``


class GateAgainstReferenceModel(RuleBasedStateMachine):
    """Random join/request/leave/publish sequences; the model is the module docstring."""

    max_lag: int | None = 0

    @initialize(steps=st.integers(1, 3), min_members=st.integers(1, 3))
    def start(self, steps, min_members):
        self.T = steps
        self.M = min_members
        self.K = type(self).max_lag
        self.gate = AdmissionGate(steps, min_members, self.K)
        # Model.
        self.members: dict[int, _ModelMember] = {}
        self.started = False
        self.published = 0
        self.next_close = 0  # the oldest phase not closed
        self.complete: dict[int, set[int]] = {}  # open phase -> members whose unroll of it is complete
        self.held: dict[int, int] = {}  # member -> token of its held request
        self.expected: dict[int, Admission] = {}  # token -> admission it must have been released with
        self.discarded: set[int] = set()
        self.tokens: dict[int, int] = {}  # token -> member
        # Observations (of the gate, checked against the invariants, not against the model).
        self.calls: dict[int, list[Admission]] = defaultdict(list)
        self.joins: Counter[int] = Counter()  # a member that leaves and joins again starts afresh
        self.admitted: Counter[tuple[int, int, int]] = Counter()  # (member, joins, phase) -> admissions
        self.completions: Counter[tuple[int, int]] = Counter()  # (member, phase) -> unrolls completed
        self.closed: list[ClosedPhase] = []  # as the gate reported them
        self.problems: list[str] = []

    # -- model --------------------------------------------------------------------

    def _admissible(self, phase: int) -> bool:
        return self.K is None or self.published >= phase - self.K

    def _admit(self, m: int) -> Admission | None:
        s = self.members[m]
        if not self._admissible(s.phase):
            return None
        s.steps += 1
        return Admission(self.published, s.steps - 1, s.phase)

    def _release_admissible(self) -> None:
        for m in sorted(self.held):
            admission = self._admit(m)
            if admission is not None:
                self.expected[self.held.pop(m)] = admission

    def _collecting(self, u: int) -> list[int]:
        return sorted(m for m, s in self.members.items() if s.first <= u and s.phase <= u)

    def _joining_phase(self) -> int:
        phases = [s.phase for s in self.members.values()] + [self.next_close] + list(self.complete)
        newest = max(phases)
        under_way = newest in self.complete or any(s.phase == newest and s.steps for s in self.members.values())
        return newest + 1 if under_way else newest

    def _close_ready(self) -> tuple[ClosedPhase, ...]:
        closed = []
        while not self._collecting(self.next_close):
            u = self.next_close
            beyond = any(s.first > u for s in self.members.values()) or any(p > u for p in self.complete)
            if u not in self.complete and not beyond:
                break  # empty, nobody waits beyond it: open for joiners
            closed.append(ClosedPhase(u, tuple(sorted(self.complete.pop(u, ())))))
            self.next_close += 1
        return tuple(closed)

    # -- observations ---------------------------------------------------------------

    def _observe_admission(self, m: int, admission: Admission, what: str) -> None:
        live = self.gate.published  # release callbacks run outside the gate's lock
        K = self.K
        if admission.version != live:
            self.problems.append(f"{what}: {admission} while version {live} is published")
        if admission.version > admission.phase or (K is not None and admission.version < admission.phase - K):
            self.problems.append(f"{what}: {admission} outside the lag bound {K}")
        if admission.phase < len(self.closed):
            self.problems.append(f"{what}: {admission} into a closed phase")
        if K == 0 and len(self.closed) > live:
            self.problems.append(f"{what}: {admission} between the close of {live} and publish({live + 1})")
        self.admitted[(m, self.joins[m], admission.phase)] += 1

    def _release(self, token: int):
        def release(admission: Admission) -> None:
            self.calls[token].append(admission)
            self._observe_admission(self.tokens[token], admission, f"release of token {token}")

        return release

    def _observe_closed(self, closed: tuple[ClosedPhase, ...]) -> None:
        """Phases close once each, in order; each member of a closed phase was admitted exactly T times in it."""
        assert isinstance(closed, tuple), closed
        for c in closed:
            assert c.phase == len(self.closed), (c, self.closed)
            assert c.version == c.phase
            self.closed.append(c)
            assert list(c.members) == sorted(set(c.members)), c
            for m in c.members:
                counts = [self.admitted[(m, j, c.phase)] for j in range(1, self.joins[m] + 1)]
                assert self.T in counts, (m, c, counts)
                assert self.completions[(m, c.phase)] == 1, (m, c)

    # -- rules ---------------------------------------------------------------------

    def _join(self, m: int) -> None:
        if m in self.members:
            with pytest.raises(GateError):
                self.gate.join(m)
            return
        joining = self._joining_phase() if self.started else 0
        self.joins[m] += 1
        self.gate.join(m)
        self.members[m] = _ModelMember(phase=joining, first=joining)
        if not self.started and len(self.members) >= self.M:
            self.started = True
            self._release_admissible()

    def _request(self, m: int) -> RequestResult | None:
        if m not in self.members or m in self.held:
            with pytest.raises(GateError):
                self.gate.request(m, lambda a: None)
            return None
        token = len(self.tokens)
        self.tokens[token] = m
        result = self.gate.request(m, self._release(token))
        s = self.members[m]
        completed, closed = None, ()
        if s.steps == self.T:  # the outcome of step T-1: the unroll is complete
            completed = s.phase
            self.complete.setdefault(s.phase, set()).add(m)
            self.completions[(m, s.phase)] += 1
            s.phase, s.steps = s.phase + 1, 0
            closed = self._close_ready()
        admission = self._admit(m) if self.started else None
        if admission is None:
            self.held[m] = token
        assert result == RequestResult(admission, completed, closed)
        self._observe_closed(result.closed)
        if result.admission is not None:
            self._observe_admission(m, result.admission, f"request of member {m}")
        return result

    def _leave(self, m: int) -> None:
        if m not in self.members:
            with pytest.raises(GateError):
                self.gate.leave(m)
            return
        dropped, closed = self.gate.leave(m)
        s = self.members.pop(m)
        if m in self.held:
            self.discarded.add(self.held.pop(m))
        # Its unfinished unroll is dropped; its complete ones stay; phases it held up may close.
        assert (dropped, closed) == (s.steps, self._close_ready() if self.started else ())
        self._observe_closed(closed)

    @rule(m=MEMBERS)
    def join(self, m):
        self._join(m)

    @rule(m=MEMBERS)
    def request(self, m):
        self._request(m)

    @rule(m=MEMBERS)
    def unroll(self, m):
        """Request until held or the unroll is complete (reaches run-ahead states more often)."""
        for _ in range(self.T + 1):
            result = self._request(m)
            if result is None or result.admission is None or result.completed is not None:
                return

    @rule(m=MEMBERS)
    def leave(self, m):
        self._leave(m)

    @rule(m=MEMBERS)
    def rejoin(self, m):
        self._leave(m)
        self._join(m)

    @precondition(lambda self: self.published < self.next_close)
    @rule()
    def train_and_publish(self):
        self.gate.publish(self.published + 1)
        self.published += 1
        self._release_admissible()

    @rule(delta=st.sampled_from([-1, 0, 1, 2]))
    def publish_out_of_turn(self, delta):
        if delta == 1 and self.published < self.next_close:
            return  # that one is legal: train_and_publish
        with pytest.raises(GateError):
            self.gate.publish(self.published + delta)

    # -- invariants -------------------------------------------------------------------

    @invariant()
    def releases_match_the_model(self):
        for token in self.tokens:
            calls = self.calls.get(token, [])
            if token in self.expected:
                assert calls == [self.expected[token]], f"token {token}: {calls}"
            else:
                assert calls == [], f"token {token} released with {calls} (held or discarded)"
        # A request is released, discarded or still held: exactly one of them.
        held = set(self.held.values())
        assert not (held & self.discarded) and not (held & set(self.expected))
        assert not (self.discarded & set(self.expected))

    @invariant()
    def admissions_are_within_the_lag_bound_and_at_most_T_per_phase(self):
        assert self.problems == []
        assert all(n <= self.T for n in self.admitted.values()), self.admitted
        assert all(n <= 1 for n in self.completions.values()), self.completions

    @invariant()
    def gate_agrees_with_model(self):
        assert self.gate.published == self.published
        assert self.gate.started == self.started
        assert self.gate.held_count() == len(self.held)
        assert self.gate.waiting_for() == self._collecting(self.next_close)
        assert len(self.closed) == self.next_close

    @invariant()
    def no_deadlock(self):
        if not self.started:
            assert len(self.members) < self.M  # the first phase would have started
            return
        for m in self.held:  # a held request that is admissible should have been released
            assert not self._admissible(self.members[m].phase), (m, self.members[m])
        if self.K is None:
            assert not self.held
        if self.published < self.next_close:
            return  # the trainer can publish
        # Nothing to publish: the oldest open phase must be able to progress by itself.
        assert not (self.members and len(self.held) == len(self.members)), "every member held, nothing to publish"
        if self.members:
            collecting = self._collecting(self.next_close)
            assert collecting and not set(collecting) & set(self.held), "oldest open phase cannot progress"


_STATEFUL = settings(max_examples=120, stateful_step_count=40, deadline=None, database=None)


class StrictGateMachine(GateAgainstReferenceModel):
    max_lag = 0


class PipelinedLag1GateMachine(GateAgainstReferenceModel):
    max_lag = 1


class PipelinedLag2GateMachine(GateAgainstReferenceModel):
    max_lag = 2


class UnboundedLagGateMachine(GateAgainstReferenceModel):
    max_lag = None


TestStrictGateAgainstReferenceModel = StrictGateMachine.TestCase
TestPipelinedLag1GateAgainstReferenceModel = PipelinedLag1GateMachine.TestCase
TestPipelinedLag2GateAgainstReferenceModel = PipelinedLag2GateMachine.TestCase
TestUnboundedLagGateAgainstReferenceModel = UnboundedLagGateMachine.TestCase
for _case in (TestStrictGateAgainstReferenceModel, TestPipelinedLag1GateAgainstReferenceModel,
              TestPipelinedLag2GateAgainstReferenceModel, TestUnboundedLagGateAgainstReferenceModel):
    _case.settings = _STATEFUL
del _case
