"""Tests for the admission gate (lockstep.sync.StrictGate).

Two kinds of tests:

* Simulations with real threads, laid out like the learner: one thread per actor
  (member) that requests, waits on an event when held, "infers" after a random
  delay with whatever snapshot is published, and records the transition; one
  trainer thread that takes each closed phase from a queue, checks its batch,
  swaps the published snapshot and only then calls ``publish``. Every check is
  about the outcome (which admissions, which batches, which callbacks), never
  about timing, and every wait has a generous timeout so a broken gate fails
  instead of hanging.
* Single-threaded tests: small scripted scenarios and a hypothesis state machine
  driving the gate against a reference model written from the module docstring.
"""

from __future__ import annotations

import queue
import random
import threading
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass, field

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

from lockstep.sync import Admission, ClosedPhase, GateError, RequestResult, StrictGate

WAIT_S = 10.0  # a held request that is not released within this is a failure, not a hang
JOIN_S = 60.0  # overall limit for a simulation's threads


# ---------------------------------------------------------------------------------
# Threaded simulation
# ---------------------------------------------------------------------------------


class _Once:
    """A release callback that records its admission and must be called at most once."""

    def __init__(self, sim: _Sim, member: int) -> None:
        self.sim = sim
        self.member = member
        self.event = threading.Event()
        self.admission: Admission | None = None
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, admission: Admission) -> None:
        with self._lock:
            self.calls += 1
            calls = self.calls
            if calls == 1:
                self.admission = admission
        if calls > 1:
            self.sim.fail(f"release of member {self.member} called {calls} times ({admission})")
            return
        self.event.set()


@dataclass
class _Plan:
    member: int
    join_after: int | None = None  # join once this many phases are trained (None: at the start)
    leave: str | None = None  # None (stay to the end), "mid", "held" or "fresh"
    leave_version: int = 0  # "mid"/"held": leave in a phase of at least this version
    leave_step: int = 0  # "mid": leave right after acting as this step


@dataclass
class _Leave:
    member: int
    kind: str  # "mid", "held", "fresh", "stop", "abort"
    version: int | None  # version of the last admission the member acted on
    acted: int  # steps it acted on in that version
    dropped: int
    closed: ClosedPhase | None
    held: _Once | None = None  # "held": the request that was held when it left


@dataclass
class _Sim:
    steps_per_phase: int
    min_members: int
    plans: list[_Plan]
    phases: int
    seed: int
    gate: StrictGate = field(init=False)

    def __post_init__(self) -> None:
        self.gate = StrictGate(self.steps_per_phase, self.min_members)
        self.lock = threading.Lock()
        self.errors: list[str] = []
        self.abort = threading.Event()
        self.stop = threading.Event()
        self.closed_q: queue.Queue[ClosedPhase] = queue.Queue()
        # All below under self.lock.
        self.published_version = 0  # the snapshot the actors infer with; swapped before publish()
        self.closed: dict[int, ClosedPhase] = {}  # version -> phase, recorded before handing to the trainer
        self.trained: list[int] = []
        self.store: dict[int, dict[int, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
        self.joins_started = 0
        self.joined = 0
        self.done = 0
        self.leaves: list[_Leave] = []
        self.left: set[int] = set()
        self.in_closed: set[int] = set()  # members that are in at least one closed phase
        self.first: dict[int, Admission] = {}

    # -- helpers ------------------------------------------------------------------

    def fail(self, message: str) -> None:
        with self.lock:
            self.errors.append(message)
        self.abort.set()

    def _await(self, once: _Once, timeout: float = WAIT_S) -> bool:
        deadline = time.monotonic() + timeout
        while not once.event.wait(0.02):
            if self.abort.is_set() or time.monotonic() > deadline:
                return False
        return True

    def _on_closed(self, phase: ClosedPhase, by: int, kind: str) -> None:
        with self.lock:
            if phase.version in self.closed:
                self.errors.append(f"phase {phase.version} closed twice ({self.closed[phase.version]}, {phase})")
                self.abort.set()
            self.closed[phase.version] = phase
            self.in_closed.update(phase.members)
        if kind == "leave" and by in phase.members:
            self.fail(f"member {by} closed phase {phase.version} by leaving but is in it: {phase}")
        self.closed_q.put(phase)

    def _leave(self, member: int, kind: str, version: int | None, held: _Once | None = None) -> None:
        dropped, closed = self.gate.leave(member)
        with self.lock:
            acted = len(self.store[version][member]) if version is not None else 0
            self.leaves.append(_Leave(member, kind, version, acted, dropped, closed, held))
            self.left.add(member)
        if closed is not None:
            self._on_closed(closed, member, "leave")

    def _on_admission(self, member: int, adm: Admission, prev: Admission | None,
                      version_before_join: int | None) -> None:
        T = self.steps_per_phase
        problems = []
        with self.lock:
            if adm.version != self.published_version:
                problems.append(f"admitted with version {adm.version} while {self.published_version} is published")
            if adm.version in self.closed:
                problems.append(f"admitted into phase {adm.version} after it closed")
            if self.joins_started < self.min_members:
                problems.append(f"admitted before {self.min_members} members joined")
            if not 0 <= adm.step < T:
                problems.append(f"step {adm.step} outside 0..{T - 1}")
            if prev is None:
                self.first[member] = adm
                if adm.step != 0:
                    problems.append(f"first admission {adm} is not step 0")
                if version_before_join is not None and adm.version <= version_before_join:
                    problems.append(f"joined during phase >= {version_before_join} but first admitted with {adm}")
            elif adm.version == prev.version:
                if adm.step != prev.step + 1:
                    problems.append(f"step {adm.step} follows {prev.step} in phase {adm.version}")
            elif adm.version != prev.version + 1 or adm.step != 0 or prev.step != T - 1:
                problems.append(f"{adm} follows {prev}")
        for p in problems:
            self.fail(f"member {member}: {p}")

    # -- threads ------------------------------------------------------------------

    def actor(self, plan: _Plan) -> None:
        m = plan.member
        rng = random.Random(self.seed * 10_007 + m)
        prev: Admission | None = None
        try:
            if plan.join_after is not None:
                while len(self.trained) < plan.join_after:
                    if self.abort.is_set():
                        return
                    time.sleep(0.001)
                time.sleep(rng.uniform(0, 0.002))
            version_before_join = self.gate.version
            with self.lock:
                self.joins_started += 1
            self.gate.join(m)
            with self.lock:
                self.joined += 1
            if plan.leave == "fresh":
                time.sleep(rng.uniform(0, 0.002))
                self._leave(m, "fresh", None)
                return
            while True:
                if self.abort.is_set():
                    self._leave(m, "abort", prev and prev.version)
                    return
                if self.stop.is_set():
                    self._leave(m, "stop", prev and prev.version)
                    return
                once = _Once(self, m)
                result = self.gate.request(m, once)
                if result.closed is not None:
                    self._on_closed(result.closed, m, "request")
                if result.completed is not None:
                    with self.lock:
                        acted = len(self.store[result.completed][m])
                    if prev is None or result.completed != prev.version or acted != self.steps_per_phase:
                        self.fail(f"member {m}: completed={result.completed} after {prev} ({acted} steps)")
                if result.admission is not None:
                    if result.completed is not None or result.closed is not None:
                        self.fail(f"member {m}: admitted request also completed/closed: {result}")
                    adm = result.admission
                else:
                    armed = plan.leave == "held" and (prev is None or prev.version >= plan.leave_version)
                    if armed and not once.event.wait(rng.uniform(0, 0.002)):
                        self._leave(m, "held", prev and prev.version, once)
                        return
                    if not self._await(once):
                        if not self.abort.is_set():
                            self.fail(f"member {m}: held request not released within {WAIT_S} s (after {prev})")
                        self._leave(m, "abort", prev and prev.version)
                        return
                    adm = once.admission
                self._on_admission(m, adm, prev, version_before_join)
                prev = adm
                time.sleep(rng.uniform(0, 0.002))  # inference with the snapshot that is live now
                with self.lock:
                    snapshot = self.published_version
                    self.store[adm.version][m].append((adm.step, snapshot))
                if plan.leave == "mid" and adm.version >= plan.leave_version and adm.step == plan.leave_step:
                    self._leave(m, "mid", adm.version)
                    return
        except Exception:
            self.fail(f"member {m} raised:\n{traceback.format_exc()}")
        finally:
            with self.lock:
                self.done += 1

    def _batch_problems(self, phase: ClosedPhase) -> list[str]:
        """Lock held. What is wrong with the batch of ``phase`` as the store has it now."""
        T = self.steps_per_phase
        problems = []
        if not phase.members:
            problems.append(f"phase {phase.version} closed without members")
        if list(phase.members) != sorted(set(phase.members)):
            problems.append(f"phase {phase.version} members not sorted/unique: {phase.members}")
        for m in phase.members:
            rows = self.store[phase.version][m]
            steps = sorted(s for s, _ in rows)
            if steps != list(range(T)):
                problems.append(f"phase {phase.version} member {m} has steps {steps}, want 0..{T - 1}")
            off = [snap for _, snap in rows if snap != phase.version]
            if off:
                problems.append(f"phase {phase.version} member {m}: {len(off)} off-policy samples {off}")
        return problems

    def trainer(self) -> None:
        rng = random.Random(self.seed)
        late = {p.member for p in self.plans if p.join_after is not None}
        next_version = 0
        try:
            while True:
                try:
                    phase = self.closed_q.get(timeout=0.01)
                except queue.Empty:
                    with self.lock:
                        finished = self.done == len(self.plans)
                    if finished or (self.abort.is_set() and self.closed_q.empty()):
                        return
                    continue
                with self.lock:
                    problems = self._batch_problems(phase)
                if phase.version != next_version:
                    problems.append(f"closed phase {phase.version}, expected {next_version}")
                for p in problems:
                    self.fail(f"trainer: {p}")
                next_version = phase.version + 1
                time.sleep(rng.uniform(0, 0.005))  # training
                with self.lock:
                    self.trained.append(phase.version)
                    all_in = self.joined == len(self.plans) and all(
                        m in self.in_closed or m in self.left for m in late
                    )
                    if len(self.trained) >= self.phases and all_in:
                        self.stop.set()
                    self.published_version = phase.version + 1  # swap the snapshot, then publish
                self.gate.publish(phase.version + 1)
        except Exception:
            self.fail(f"trainer raised:\n{traceback.format_exc()}")

    def run(self) -> _Sim:
        actors = [threading.Thread(target=self.actor, args=(p,), daemon=True) for p in self.plans]
        trainer = threading.Thread(target=self.trainer, daemon=True)
        trainer.start()
        for t in actors:
            t.start()
        deadline = time.monotonic() + JOIN_S
        for t in [*actors, trainer]:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in [*actors, trainer] if t.is_alive()]
        assert not alive, f"threads still running (deadlock?): {alive}; errors: {self.errors[:5]}"
        return self

    # -- final checks (all threads joined) ---------------------------------------

    def check(self) -> None:
        T = self.steps_per_phase
        assert not self.errors, "\n".join(self.errors[:10])
        assert self.stop.is_set(), "the run ended before the trainer saw enough phases"
        versions = sorted(self.closed)
        assert versions == list(range(len(versions))), f"closed versions {versions}"
        assert len(versions) >= self.phases
        assert self.trained == versions, "every closed phase is trained once, in order"

        # Every batch is complete and on-policy, and nothing was added to it after it closed.
        for v in versions:
            assert self._batch_problems(self.closed[v]) == []

        # Every admission is accounted for: in a closed batch, or dropped by a leave (checked below).
        leaves = {lv.member: lv for lv in self.leaves}
        assert len(leaves) == len(self.leaves) == len(self.plans), "every member leaves exactly once"
        for v, rows_by_member in self.store.items():
            phase = self.closed.get(v)
            for m, rows in rows_by_member.items():
                if phase is not None and m in phase.members:
                    continue
                lv = leaves[m]
                assert lv.version == v and lv.acted == len(rows), (
                    f"member {m} acted {len(rows)} times in phase {v}, which neither trained nor dropped them: {lv}"
                )

        for lv in self.leaves:
            m = lv.member
            if lv.closed is not None:
                assert m not in lv.closed.members
            if lv.kind in ("mid", "stop", "fresh"):
                # Left while collecting (or before ever acting): drops what it acted on.
                assert lv.dropped == lv.acted, lv
                if lv.version is not None and lv.version in self.closed:
                    assert m not in self.closed[lv.version].members, lv
            elif lv.kind == "held":
                if lv.held.calls == 1:
                    # The release was decided before the leave: the member was in the new phase at step 0.
                    assert lv.dropped == 1, lv
                    nv = lv.held.admission.version
                    assert lv.held.admission.step == 0
                    assert nv not in self.closed or m not in self.closed[nv].members, lv
                elif lv.version is not None and lv.acted == T:
                    # Left while full: it keeps its complete unroll in the phase, which trains it.
                    assert lv.dropped == 0, lv
                    assert lv.version in self.closed and m in self.closed[lv.version].members, lv
                else:
                    # A late joiner waiting for its first phase.
                    assert lv.version is None and lv.dropped == 0, lv
            else:
                raise AssertionError(f"unexpected leave {lv}")

        assert self.gate.held_count() == 0, "a held request survived its member's leave"
        assert self.gate.waiting_for() == []


def _run_sim(**kwargs) -> _Sim:
    sim = _Sim(**kwargs).run()
    sim.check()
    return sim


# ---------------------------------------------------------------------------------
# 1-4: threaded simulations
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("steps_per_phase, seed", [(4, 1), (8, 2), (1, 3)])
def test_sixteen_actors_with_random_delays_train_only_on_policy_complete_batches(steps_per_phase, seed):
    n = 16
    sim = _run_sim(
        steps_per_phase=steps_per_phase,
        min_members=n,
        plans=[_Plan(m) for m in range(n)],
        phases=25,
        seed=seed,
    )
    # Nobody joins or leaves before the stop: every phase before it has all 16 members.
    for v in range(sim.phases):
        assert sim.closed[v].members == tuple(range(n))
    # The first phase is version 0 and every actor starts it at step 0.
    assert all(a == Admission(0, 0) for a in sim.first.values()) and len(sim.first) == n
    # After the stop every actor left right after being released into the next phase.
    assert {lv.kind for lv in sim.leaves} == {"stop"}
    assert all(lv.dropped == 1 for lv in sim.leaves)


@pytest.mark.parametrize("seed", [11, 12])
def test_members_leaving_mid_phase_or_while_held_do_not_stall_or_pollute_phases(seed):
    T, n, phases = 6, 16, 25
    rng = random.Random(seed)
    plans = []
    for m in range(n):
        if m < 5:
            plans.append(_Plan(m, leave="mid", leave_version=rng.randrange(1, phases - 3),
                               leave_step=rng.randrange(T)))
        elif m < 10:
            plans.append(_Plan(m, leave="held", leave_version=rng.randrange(0, phases - 3)))
        else:
            plans.append(_Plan(m))
    # Late joiners that leave too: while waiting for their first phase, before any request, mid-unroll.
    plans += [
        _Plan(16, join_after=2, leave="held"),
        _Plan(17, join_after=5, leave="held"),
        _Plan(18, join_after=3, leave="fresh"),
        _Plan(19, join_after=4, leave="mid", leave_version=0, leave_step=T // 2),
    ]
    sim = _run_sim(steps_per_phase=T, min_members=8, plans=plans, phases=phases, seed=seed)

    leaves = {lv.member: lv for lv in sim.leaves}
    for m in range(10):
        assert leaves[m].kind in ("mid", "held"), leaves[m]
    # A member that left mid-unroll is in no phase from then on.
    for lv in sim.leaves:
        if lv.kind == "mid":
            assert all(lv.member not in p.members for v, p in sim.closed.items() if v >= lv.version)
            assert lv.dropped == lv.acted >= 1
    # Phases kept closing after the leavers were gone.
    last_leave = max(lv.version or 0 for lv in sim.leaves if lv.kind in ("mid", "held"))
    assert max(sim.closed) > last_leave


def test_members_joining_late_wait_for_the_next_publish_and_start_at_step_0():
    T, phases = 5, 25
    plans = [_Plan(m) for m in range(12)]
    plans += [_Plan(m, join_after=j) for m, j in zip(range(12, 16), (1, 3, 3, 8))]
    sim = _run_sim(steps_per_phase=T, min_members=12, plans=plans, phases=phases, seed=21)

    for m in range(12, 16):
        first = sim.first[m]
        assert first.step == 0
        # It joined while a phase > 0 was in progress (or closed), so its first phase came later.
        assert first.version >= 1
        joined_phases = [v for v, p in sim.closed.items() if m in p.members]
        assert joined_phases, f"late member {m} never contributed to a phase"
        # From its first phase on it is in every phase until the stop.
        assert joined_phases == list(range(first.version, first.version + len(joined_phases)))
        assert all(m not in sim.closed[v].members for v in range(first.version))
    for v in range(phases):
        expected = {m for m in range(16) if m < 12 or sim.first[m].version <= v}
        assert set(sim.closed[v].members) == expected


# ---------------------------------------------------------------------------------
# Single-threaded scenarios
# ---------------------------------------------------------------------------------


class Releases:
    """Release callbacks for single-threaded tests: ``releases.for_(m)`` records calls per member."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, Admission]] = []

    def for_(self, member):
        return lambda admission: self.calls.append((member, admission))

    def take(self) -> list[tuple[object, Admission]]:
        calls, self.calls = self.calls, []
        return sorted(calls, key=lambda c: c[0])


def _admit(gate: StrictGate, member, releases: Releases) -> Admission:
    result = gate.request(member, releases.for_(member))
    assert result.admission is not None, f"member {member} was held: {result}"
    return result.admission


def _finish(gate: StrictGate, member, releases: Releases) -> RequestResult:
    """Act until the member is full; return the result of its (T+1)-th request."""
    while True:
        result = gate.request(member, releases.for_(member))
        if result.admission is None:
            assert result.completed == gate.version
            return result


def test_late_joiner_is_held_until_the_next_publish_then_admitted_as_step_0():
    r = Releases()
    gate = StrictGate(steps_per_phase=2)
    gate.join("a")
    assert _admit(gate, "a", r) == Admission(0, 0)

    gate.join("b")  # phase 0 is collecting
    assert gate.request("b", r.for_("b")) == RequestResult(None)
    assert _admit(gate, "a", r) == Admission(0, 1)
    assert gate.waiting_for() == ["a"]
    result = gate.request("a", r.for_("a"))
    assert result == RequestResult(None, completed=0, closed=ClosedPhase(0, ("a",)))
    assert r.take() == []  # b waits for the publish, not for the close

    gate.join("c")  # between close and publish
    assert gate.request("c", r.for_("c")) == RequestResult(None)
    assert r.take() == []

    gate.publish(1)
    assert r.take() == [("a", Admission(1, 0)), ("b", Admission(1, 0)), ("c", Admission(1, 0))]
    for m in "abc":
        assert _admit(gate, m, r) == Admission(1, 1)
    assert gate.held_count() == 0


def test_late_joiner_that_does_not_request_before_the_publish_starts_the_new_phase_at_step_0():
    r = Releases()
    gate = StrictGate(steps_per_phase=1)
    gate.join("a")
    _admit(gate, "a", r)
    gate.join("b")
    assert _finish(gate, "a", r).closed == ClosedPhase(0, ("a",))
    gate.publish(1)
    assert r.take() == [("a", Admission(1, 0))]
    assert _admit(gate, "b", r) == Admission(1, 0)
    assert _finish(gate, "b", r).closed is None  # a (released as step 0) has not reported yet
    assert gate.waiting_for() == ["a"]


def test_nothing_is_admitted_before_min_members_join_and_the_first_phase_is_version_0():
    r = Releases()
    gate = StrictGate(steps_per_phase=3, min_members=3)
    gate.join(1)
    assert gate.request(1, r.for_(1)) == RequestResult(None)
    gate.join(2)
    assert gate.request(2, r.for_(2)) == RequestResult(None)
    assert gate.version is None and gate.held_count() == 2 and r.take() == []
    assert gate.waiting_for() == []

    gate.leave(2)  # leaving before the start discards the held request and does not count
    gate.join(4)
    assert gate.version is None and gate.held_count() == 1 and r.take() == []

    gate.join(3)
    assert gate.version == 0
    assert r.take() == [(1, Admission(0, 0))]  # the early member's held request, as step 0
    assert _admit(gate, 3, r) == Admission(0, 0)
    assert _admit(gate, 4, r) == Admission(0, 0)
    assert _admit(gate, 1, r) == Admission(0, 1)
    assert gate.waiting_for() == [1, 3, 4]
    assert r.take() == []


def test_min_members_with_threads_releases_every_early_request_into_version_0():
    n = 6
    gate = StrictGate(steps_per_phase=2, min_members=n)
    joined = []
    lock = threading.Lock()
    results: dict[int, Admission] = {}
    errors = []

    def actor(m):
        try:
            with lock:
                joined.append(m)
            gate.join(m)
            once = threading.Event()
            slot = []

            def release(a):
                slot.append(a)
                once.set()

            res = gate.request(m, release)
            if res.admission is None:
                assert once.wait(WAIT_S), f"member {m} never released"
                adm = slot[0]
            else:
                adm = res.admission
            with lock:
                assert len(joined) == n, f"member {m} admitted after {len(joined)} joins"
                results[m] = adm
            assert len(slot) <= 1
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = []
    for m in range(n):
        t = threading.Thread(target=actor, args=(m,), daemon=True)
        threads.append(t)
        t.start()
        time.sleep(0.002)
        if m < n - 1:
            assert gate.version is None
    for t in threads:
        t.join(JOIN_S)
    assert not errors, errors
    assert results == {m: Admission(0, 0) for m in range(n)}


def test_phase_whose_members_all_left_admits_a_new_joiner_at_once_with_the_same_version():
    r = Releases()
    gate = StrictGate(steps_per_phase=3, min_members=2)
    gate.join("a")
    gate.join("b")
    _admit(gate, "a", r)
    _admit(gate, "a", r)
    _admit(gate, "b", r)
    gate.join("c")  # late joiner, held
    assert gate.request("c", r.for_("c")) == RequestResult(None)

    assert gate.leave("a") == (2, None)
    assert r.take() == []
    # The last collecting member leaves: the empty phase takes the waiting member at once.
    assert gate.leave("b") == (1, None)
    assert r.take() == [("c", Admission(0, 0))]
    assert gate.version == 0 and gate.waiting_for() == ["c"]

    # And c can finish it alone; then everyone leaves and a brand-new member gets straight in.
    assert _admit(gate, "c", r) == Admission(0, 1)
    assert gate.leave("c") == (2, None)
    gate.join("d")
    assert gate.waiting_for() == ["d"]
    assert gate.request("d", r.for_("d")) == RequestResult(Admission(0, 0))
    assert _admit(gate, "d", r) == Admission(0, 1)
    assert _admit(gate, "d", r) == Admission(0, 2)
    result = gate.request("d", r.for_("d"))
    assert result == RequestResult(None, completed=0, closed=ClosedPhase(0, ("d",)))
    gate.publish(1)
    assert r.take() == [("d", Admission(1, 0))]


def test_phase_emptied_before_anyone_acted_takes_the_next_joiner_at_once():
    r = Releases()
    gate = StrictGate(steps_per_phase=2, min_members=2)
    gate.join(1)
    gate.join(2)
    assert gate.leave(1) == (0, None)
    assert gate.leave(2) == (0, None)
    gate.join(3)  # the empty phase 0 takes it at once
    assert gate.request(3, r.for_(3)) == RequestResult(Admission(0, 0))
    gate.join(4)  # phase 0 has a member again: 4 waits for phase 1
    assert gate.request(4, r.for_(4)) == RequestResult(None)
    assert _finish(gate, 3, r).closed == ClosedPhase(0, (3,))
    assert r.take() == []
    gate.publish(1)
    assert r.take() == [(3, Admission(1, 0)), (4, Admission(1, 0))]


def test_phase_closes_when_the_last_collecting_member_leaves():
    r = Releases()
    gate = StrictGate(steps_per_phase=2, min_members=3)
    for m in (1, 2, 3):
        gate.join(m)
    assert _finish(gate, 1, r).closed is None
    assert _finish(gate, 2, r).closed is None
    _admit(gate, 3, r)
    dropped, closed = gate.leave(3)
    assert (dropped, closed) == (1, ClosedPhase(0, (1, 2)))
    assert gate.waiting_for() == []
    gate.publish(1)
    assert r.take() == [(1, Admission(1, 0)), (2, Admission(1, 0))]


def test_member_leaving_a_closed_phase_keeps_its_unroll_and_drops_nothing():
    r = Releases()
    gate = StrictGate(steps_per_phase=2, min_members=2)
    gate.join(1)
    gate.join(2)
    _finish(gate, 1, r)
    assert _finish(gate, 2, r).closed == ClosedPhase(0, (1, 2))
    assert gate.leave(1) == (0, None)  # its held request is discarded ...
    gate.publish(1)
    assert r.take() == [(2, Admission(1, 0))]  # ... and never released
    assert gate.held_count() == 0


def test_full_member_leaving_an_open_phase_keeps_its_unroll_in_the_phase():
    r = Releases()
    gate = StrictGate(steps_per_phase=3, min_members=2)
    gate.join(1)
    gate.join(2)
    _admit(gate, 2, r)
    assert _finish(gate, 1, r).closed is None  # 1 is full, 2 still collecting
    assert gate.leave(1) == (0, None)  # nothing dropped, its held request discarded
    assert gate.held_count() == 0 and gate.waiting_for() == [2]
    _admit(gate, 2, r)
    _admit(gate, 2, r)
    assert _finish(gate, 2, r).closed == ClosedPhase(0, (1, 2))  # 1's complete unroll is trained
    gate.publish(1)
    assert r.take() == [(2, Admission(1, 0))]  # the discarded request is never released
    assert gate.waiting_for() == [2]  # and 1 is not in phase 1


def test_full_member_leaving_when_the_others_have_left_closes_the_phase_with_it():
    r = Releases()
    gate = StrictGate(steps_per_phase=2, min_members=2)
    gate.join(1)
    gate.join(2)
    _finish(gate, 1, r)
    _admit(gate, 2, r)
    assert gate.leave(1) == (0, None)
    assert gate.leave(2) == (1, ClosedPhase(0, (1,)))
    gate.join(3)  # the closed phase takes nobody; 3 waits for the publish
    assert gate.request(3, r.for_(3)) == RequestResult(None)
    gate.publish(1)
    assert r.take() == [(3, Admission(1, 0))]


def test_full_member_that_leaves_and_rejoins_the_same_phase_waits_for_the_next():
    r = Releases()
    gate = StrictGate(steps_per_phase=2, min_members=2)
    gate.join(1)
    gate.join(2)
    _finish(gate, 1, r)
    _admit(gate, 2, r)
    gate.leave(1)
    gate.join(1)
    assert gate.request(1, r.for_(1)) == RequestResult(None)  # held: its unroll of phase 0 is complete
    assert gate.waiting_for() == [2]
    _admit(gate, 2, r)
    assert _finish(gate, 2, r).closed == ClosedPhase(0, (1, 2))
    assert r.take() == []
    gate.publish(1)
    assert r.take() == [(1, Admission(1, 0)), (2, Admission(1, 0))]


def test_collecting_member_that_leaves_and_rejoins_waits_for_the_next_phase():
    r = Releases()
    gate = StrictGate(steps_per_phase=2, min_members=2)
    gate.join(1)
    gate.join(2)
    _admit(gate, 1, r)
    assert gate.leave(1) == (1, None)
    gate.join(1)
    assert gate.request(1, r.for_(1)) == RequestResult(None)
    assert gate.waiting_for() == [2]
    assert _finish(gate, 2, r).closed == ClosedPhase(0, (2,))  # the dropped unroll is not in it
    gate.publish(1)
    assert r.take() == [(1, Admission(1, 0)), (2, Admission(1, 0))]


# ---------------------------------------------------------------------------------
# 6: protocol errors
# ---------------------------------------------------------------------------------


def test_request_before_join_raises():
    gate = StrictGate(steps_per_phase=2)
    with pytest.raises(GateError):
        gate.request(1, lambda a: None)
    gate.join(1)
    gate.leave(1)
    with pytest.raises(GateError):
        gate.request(1, lambda a: None)  # after leaving, too


def test_double_join_raises_and_leaving_a_non_member_raises():
    gate = StrictGate(steps_per_phase=2)
    gate.join(1)
    with pytest.raises(GateError):
        gate.join(1)
    with pytest.raises(GateError):
        gate.leave(2)
    assert gate.waiting_for() == [1]


def test_second_held_request_for_one_member_raises_and_keeps_the_first():
    r = Releases()
    gate = StrictGate(steps_per_phase=1)
    gate.join(1)
    _admit(gate, 1, r)
    assert gate.request(1, r.for_("first")).closed == ClosedPhase(0, (1,))
    with pytest.raises(GateError):
        gate.request(1, r.for_("second"))
    # Also for a request held while waiting for the first phase.
    gate2 = StrictGate(steps_per_phase=1, min_members=2)
    gate2.join(1)
    assert gate2.request(1, r.for_("early")).admission is None
    with pytest.raises(GateError):
        gate2.request(1, r.for_("early-2"))
    gate.publish(1)
    gate2.join(2)
    assert r.take() == [("early", Admission(0, 0)), ("first", Admission(1, 0))]


def test_publish_without_a_closed_phase_raises():
    gate = StrictGate(steps_per_phase=2, min_members=2)
    with pytest.raises(GateError):
        gate.publish(1)  # no phase at all
    gate.join(1)
    with pytest.raises(GateError):
        gate.publish(1)  # still no phase
    gate.join(2)
    r = Releases()
    _admit(gate, 1, r)
    with pytest.raises(GateError):
        gate.publish(1)  # phase 0 is collecting
    assert gate.version == 0 and gate.waiting_for() == [1, 2]


def test_publish_of_a_non_consecutive_version_raises():
    r = Releases()
    gate = StrictGate(steps_per_phase=1)
    gate.join(1)
    _admit(gate, 1, r)
    assert _finish(gate, 1, r).closed == ClosedPhase(0, (1,))
    for bad in (0, 2, -1, 5):
        with pytest.raises(GateError):
            gate.publish(bad)
    assert r.take() == [] and gate.held_count() == 1
    gate.publish(1)
    assert r.take() == [(1, Admission(1, 0))]
    with pytest.raises(GateError):
        gate.publish(2)  # phase 1 has not closed


def test_steps_per_phase_must_be_positive():
    with pytest.raises(ValueError):
        StrictGate(steps_per_phase=0)


# ---------------------------------------------------------------------------------
# 7: stateful test against a reference model
# ---------------------------------------------------------------------------------

MEMBERS = st.integers(min_value=0, max_value=4)


class GateAgainstReferenceModel(RuleBasedStateMachine):
    """Random join/request/leave/publish sequences; the model is the module docstring."""

    @initialize(steps=st.integers(1, 3), min_members=st.integers(1, 3))
    def start(self, steps, min_members):
        self.T = steps
        self.M = min_members
        self.gate = StrictGate(steps, min_members)
        # Model.
        self.members: set[int] = set()
        self.version: int | None = None
        self.phase: dict[int, int] = {}  # member -> admissions in the current phase
        self.full: set[int] = set()
        self.closed = False
        self.held: dict[int, int] = {}  # member -> token of its held request
        self.expected: dict[int, Admission] = {}  # token -> admission it must have been released with
        self.discarded: set[int] = set()
        self.tokens: dict[int, int] = {}  # token -> member
        # Observations.
        self.calls: dict[int, list[tuple[Admission, int | None]]] = defaultdict(list)
        self.joins: Counter[int] = Counter()  # a member that leaves and joins again starts afresh
        self.admitted: Counter[tuple[int, int, int]] = Counter()  # (member, joins, version) -> admissions
        self.lag_violations: list[str] = []

    # -- model helpers -----------------------------------------------------------

    def _release(self, token: int):
        def release(admission: Admission) -> None:
            live = self.gate.version  # callbacks run outside the gate's lock
            self.calls[token].append((admission, live))
            if admission.version != live:
                self.lag_violations.append(f"released {admission} while version {live} is live")
            m = self.tokens[token]
            self.admitted[(m, self.joins[m], admission.version)] += 1

        return release

    def _release_held(self) -> None:
        for m, token in self.held.items():
            self.phase[m] = 1
            self.expected[token] = Admission(self.version, 0)
        self.held.clear()

    def _start(self, version: int) -> None:
        self.version = version
        self.phase = {m: 0 for m in self.members}
        self.full = set()
        self.closed = False
        self._release_held()

    def _maybe_close(self) -> ClosedPhase | None:
        if self.closed or not self.full or self.full != set(self.phase):
            return None
        self.closed = True
        return ClosedPhase(self.version, tuple(sorted(self.full)))

    def _check_closed(self, closed: ClosedPhase | None) -> None:
        """Every member of a closed phase was admitted exactly T times in it (in some membership)."""
        if closed is None:
            return
        for m in closed.members:
            counts = [self.admitted[(m, j, closed.version)] for j in range(1, self.joins[m] + 1)]
            assert self.T in counts, (m, closed, counts)

    # -- rules ---------------------------------------------------------------------

    @rule(m=MEMBERS)
    def join(self, m):
        if m in self.members:
            with pytest.raises(GateError):
                self.gate.join(m)
            return
        self.gate.join(m)
        self.members.add(m)
        self.joins[m] += 1
        if self.version is None:
            if len(self.members) >= self.M:
                self._start(0)
        elif not self.closed and not self.phase:
            self.phase[m] = 0

    @rule(m=MEMBERS)
    def request(self, m):
        if m not in self.members or m in self.held:
            with pytest.raises(GateError):
                self.gate.request(m, lambda a: None)
            return
        token = len(self.tokens)
        self.tokens[token] = m
        result = self.gate.request(m, self._release(token))
        if self.version is None or self.closed or m not in self.phase or m in self.full:
            # Waiting for a phase: not started, closed, joined late, or rejoined with a complete unroll.
            assert result == RequestResult(None)
            self.held[m] = token
        elif self.phase[m] < self.T:
            assert result == RequestResult(Admission(self.version, self.phase[m]))
            assert result.admission.version == self.gate.version  # lag 0
            self.admitted[(m, self.joins[m], self.version)] += 1
            self.phase[m] += 1
        else:
            self.full.add(m)
            self.held[m] = token
            closed = self._maybe_close()
            assert result == RequestResult(None, completed=self.version, closed=closed)
            self._check_closed(closed)

    @rule(m=MEMBERS)
    def leave(self, m):
        if m not in self.members:
            with pytest.raises(GateError):
                self.gate.leave(m)
            return
        dropped, closed = self.gate.leave(m)
        self.members.discard(m)
        if m in self.held:
            self.discarded.add(self.held.pop(m))
        if self.version is not None and not self.closed and m in self.phase and m not in self.full:
            # Leaving while collecting: its partial unroll is dropped and the phase may close.
            assert dropped == self.phase.pop(m)
            assert closed == self._maybe_close()
            self._check_closed(closed)
            if not self.closed and not self.phase:
                for member in self.members:
                    self.phase[member] = 0
                self._release_held()
        else:
            # Waiting for a phase, or full (its complete unroll stays in the phase): nothing dropped.
            assert (dropped, closed) == (0, None)

    @precondition(lambda self: self.closed)
    @rule()
    def train_and_publish(self):
        self.gate.publish(self.version + 1)
        self._start(self.version + 1)

    @rule(delta=st.sampled_from([-1, 0, 1, 2]))
    def publish_out_of_turn(self, delta):
        current = -1 if self.version is None else self.version
        if self.closed and delta == 1:
            return  # that one is legal: train_and_publish
        with pytest.raises(GateError):
            self.gate.publish(current + delta)

    # -- invariants -------------------------------------------------------------------

    @invariant()
    def releases_match_the_model(self):
        for token in self.tokens:
            calls = [a for a, _ in self.calls.get(token, [])]
            if token in self.expected:
                assert calls == [self.expected[token]], f"token {token}: {calls}"
            else:
                assert calls == [], f"token {token} released with {calls} (held or discarded)"
        # A request is released, discarded or still held: exactly one of them.
        held = set(self.held.values())
        assert not (held & self.discarded) and not (held & set(self.expected))
        assert not (self.discarded & set(self.expected))

    @invariant()
    def admissions_are_current_and_bounded(self):
        assert self.lag_violations == []
        assert all(n <= self.T for n in self.admitted.values()), self.admitted

    @invariant()
    def gate_agrees_with_model(self):
        assert self.gate.version == self.version
        assert self.gate.held_count() == len(self.held)
        collecting = [] if self.version is None or self.closed else sorted(set(self.phase) - self.full)
        assert self.gate.waiting_for() == collecting

    @invariant()
    def no_deadlock(self):
        if self.version is None:
            assert len(self.members) < self.M  # the first phase would have started
            return
        if self.closed:
            return  # publish(version + 1) is possible (train_and_publish)
        # Open phase: it must be able to progress.
        assert not (self.full and self.full == set(self.phase)), "every member full but phase open"
        if not self.phase:
            assert not self.members and not self.held, "empty open phase with members waiting"
        for m in self.held:
            assert m in self.full or m not in self.phase


GateAgainstReferenceModel.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, database=None
)
TestGateAgainstReferenceModel = GateAgainstReferenceModel.TestCase
