"""Tests for the admission gate (lockstep.sync.AdmissionGate).

Strict mode (``max_lag=0``) and pipelined mode
(``max_lag=K >= 1``, collection of phase u overlaps training of phase u-1) are
tested with the same machinery; ``max_lag=None`` (never holds) in the stateful
test and a few scenarios.

Two kinds of tests:

* Simulations with real threads, laid out like the learner: one thread per actor
  (member) that requests, waits on an event when held, "infers" after a random
  delay with whatever snapshot is published, and records the transition; one
  trainer thread that takes each closed phase from a queue (in phase order),
  checks its batch, swaps the published snapshot and only then calls ``publish``.
  Every check is about the outcome (which admissions, which batches, which
  callbacks, which lags), never about timing, and every wait has a generous
  timeout so a broken gate fails instead of hanging.
* Single-threaded tests: small scripted scenarios and a hypothesis state machine
  driving the gate against a reference model written from the module docstring,
  for max_lag in {0, 1, 2, None}.
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

from lockstep.sync import Admission, AdmissionGate, ClosedPhase, GateError, RequestResult

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
    leave_phase: int = 0  # "mid"/"held": leave in a phase of at least this index
    leave_step: int = 0  # "mid": leave right after acting as this step


@dataclass
class _Leave:
    member: int
    kind: str  # "mid", "held", "fresh", "stop", "abort"
    phase: int | None  # phase of the last admission the member acted on
    acted: int  # steps it acted on in that phase
    dropped: int
    closed: tuple[ClosedPhase, ...]
    held: _Once | None = None  # "held": the request that was held when it left


@dataclass
class _Sim:
    steps_per_phase: int
    min_members: int
    plans: list[_Plan]
    phases: int
    seed: int
    max_lag: int | None = 0
    act_s: float = 0.002  # inference delay: uniform(0, act_s)
    train_s: tuple[float, float] = (0.0, 0.005)  # training time: uniform(*train_s)
    gate: AdmissionGate = field(init=False)

    def __post_init__(self) -> None:
        self.gate = AdmissionGate(self.steps_per_phase, self.min_members, self.max_lag)
        self.lock = threading.Lock()
        self.errors: list[str] = []
        self.abort = threading.Event()
        self.stop = threading.Event()
        self.closed_q: queue.Queue[ClosedPhase] = queue.Queue()
        # All below under self.lock.
        self.published_version = 0  # the snapshot the actors infer with; swapped before publish()
        self.closed: dict[int, ClosedPhase] = {}  # phase -> closed phase, recorded before handing to the trainer
        self.next_to_queue = 0  # closes reach the trainer in phase order
        self.empty: list[int] = []  # phases that closed with no unrolls
        self.trained: list[int] = []
        # phase -> member -> [(step, snapshot version at inference, admission version)]
        self.store: dict[int, dict[int, list[tuple[int, int, int]]]] = defaultdict(lambda: defaultdict(list))
        self.joins_started = 0
        self.joined = 0
        self.done = 0
        self.leaves: list[_Leave] = []
        self.leaving: set[int] = set()  # members that have started to leave (before gate.leave)
        self.left: set[int] = set()
        self.in_closed: set[int] = set()  # members that are in at least one closed phase
        self.first: dict[int, Admission] = {}
        self.held_after_start = 0  # requests held after the member's first admission
        self.stepped: dict[int, int] = {}  # member -> newest phase it was admitted into
        self.join_bound: dict[int, int] = {}  # member -> its first phase must be above this

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

    def _on_closed(self, closed: tuple[ClosedPhase, ...], by: int, kind: str) -> None:
        if not closed:
            return
        problems = []
        phases = [c.phase for c in closed]
        if phases != list(range(phases[0], phases[0] + len(phases))):
            problems.append(f"one call closed non-consecutive phases {phases}")
        with self.lock:
            for c in closed:
                if c.phase in self.closed:
                    problems.append(f"phase {c.phase} closed twice ({self.closed[c.phase]}, {c})")
                    continue
                self.closed[c.phase] = c
                self.in_closed.update(c.members)
                if not c.members:
                    self.empty.append(c.phase)
                if kind == "leave" and by in c.members:
                    problems.append(f"member {by} closed phase {c.phase} by leaving but is in it: {c}")
            if self.max_lag == 0 and phases[0] != self.next_to_queue:
                # Strict: phase v+1 cannot close before v is trained, so closes arrive in order.
                problems.append(f"phase {phases[0]} closed while phase {self.next_to_queue} is not trained")
            # Threads may report closes out of order (pipelined); the trainer takes them in order.
            while self.next_to_queue in self.closed:
                self.closed_q.put(self.closed[self.next_to_queue])
                self.next_to_queue += 1
        for p in problems:
            self.fail(p)

    def _leave(self, member: int, kind: str, phase: int | None, held: _Once | None = None) -> None:
        with self.lock:
            self.leaving.add(member)
        dropped, closed = self.gate.leave(member)
        if not isinstance(closed, tuple):
            self.fail(f"leave returned closed={closed!r}, not a tuple")
            closed = ()
        with self.lock:
            acted = len(self.store[phase][member]) if phase is not None else 0
            self.leaves.append(_Leave(member, kind, phase, acted, dropped, closed, held))
            self.left.add(member)
        self._on_closed(closed, member, "leave")

    def _on_admission(self, member: int, adm: Admission, prev: Admission | None) -> None:
        T, K = self.steps_per_phase, self.max_lag
        problems = []
        with self.lock:
            if adm.version > self.published_version:
                problems.append(f"admitted with version {adm.version} while {self.published_version} is published")
            if K == 0 and adm.version != self.published_version:
                problems.append(f"strict: admitted with version {adm.version} while {self.published_version} is live")
            if adm.version > adm.phase or (K is not None and adm.version < adm.phase - K):
                problems.append(f"{adm} outside the lag bound max_lag={K}")
            if adm.phase in self.closed:
                problems.append(f"admitted into phase {adm.phase} after it closed")
            if self.joins_started < self.min_members:
                problems.append(f"admitted before {self.min_members} members joined")
            if not 0 <= adm.step < T:
                problems.append(f"step {adm.step} outside 0..{T - 1}")
            if prev is None:
                self.first[member] = adm
                if adm.step != 0:
                    problems.append(f"first admission {adm} is not step 0")
                if adm.phase <= self.join_bound[member]:
                    problems.append(f"first admitted into {adm}, but a phase >= {self.join_bound[member]} "
                                    f"was under way (or published) when it joined")
            elif adm.phase == prev.phase:
                if adm.step != prev.step + 1 or adm.version < prev.version:
                    problems.append(f"{adm} follows {prev} in the same phase")
            elif adm.phase != prev.phase + 1 or adm.step != 0 or prev.step != T - 1 or adm.version < prev.version:
                problems.append(f"{adm} follows {prev}")
            self.stepped[member] = adm.phase
        for p in problems:
            self.fail(f"member {member}: {p}")

    # -- threads ------------------------------------------------------------------

    def actor(self, plan: _Plan) -> None:
        m = plan.member
        T = self.steps_per_phase
        rng = random.Random(self.seed * 10_007 + m)
        prev: Admission | None = None
        try:
            if plan.join_after is not None:
                while len(self.trained) < plan.join_after:
                    if self.abort.is_set():
                        return
                    time.sleep(0.001)
                time.sleep(rng.uniform(0, 0.002))
            published_before = self.gate.published
            with self.lock:
                self.joins_started += 1
                under_way = {o: p for o, p in self.stepped.items() if o not in self.leaving}
            self.gate.join(m)
            with self.lock:
                self.joined += 1
                # A member that stepped in phase p before the join and did not leave during it kept
                # phase p under way (or it closed): the joiner must start after p, and never before
                # the published version.
                bound = max([p for o, p in under_way.items() if o not in self.leaving], default=-1)
                self.join_bound[m] = max(bound, published_before - 1)
            if plan.leave == "fresh":
                time.sleep(rng.uniform(0, 0.002))
                self._leave(m, "fresh", None)
                return
            while True:
                if self.abort.is_set():
                    self._leave(m, "abort", prev and prev.phase)
                    return
                if self.stop.is_set():
                    self._leave(m, "stop", prev and prev.phase)
                    return
                once = _Once(self, m)
                result = self.gate.request(m, once)
                if not isinstance(result.closed, tuple):
                    self.fail(f"member {m}: closed={result.closed!r}, not a tuple")
                else:
                    self._on_closed(result.closed, m, "request")
                if result.completed is not None:
                    with self.lock:
                        acted = len(self.store[result.completed][m])
                    if prev is None or result.completed != prev.phase or acted != T:
                        self.fail(f"member {m}: completed={result.completed} after {prev} ({acted} steps)")
                elif prev is not None and prev.step == T - 1:
                    self.fail(f"member {m}: request after step T-1 of {prev} did not complete it: {result}")
                elif result.closed:
                    self.fail(f"member {m}: a request that completed nothing closed {result.closed}")
                if result.admission is not None:
                    if self.max_lag == 0 and result.completed is not None:
                        self.fail(f"member {m}: strict: a completing request was admitted: {result}")
                    adm = result.admission
                else:
                    if prev is not None:
                        with self.lock:
                            self.held_after_start += 1
                    armed = plan.leave == "held" and (prev is None or prev.phase >= plan.leave_phase)
                    if armed and not once.event.wait(rng.uniform(0, 0.002)):
                        self._leave(m, "held", prev and prev.phase, once)
                        return
                    if not self._await(once):
                        if not self.abort.is_set():
                            self.fail(f"member {m}: held request not released within {WAIT_S} s (after {prev})")
                        self._leave(m, "abort", prev and prev.phase)
                        return
                    adm = once.admission
                self._on_admission(m, adm, prev)
                prev = adm
                time.sleep(rng.uniform(0, self.act_s))  # inference with the snapshot that is live now
                with self.lock:
                    snapshot = self.published_version
                    self.store[adm.phase][m].append((adm.step, snapshot, adm.version))
                if plan.leave == "mid" and adm.phase >= plan.leave_phase and adm.step == plan.leave_step:
                    self._leave(m, "mid", adm.phase)
                    return
        except Exception:
            self.fail(f"member {m} raised:\n{traceback.format_exc()}")
        finally:
            with self.lock:
                self.done += 1

    def _batch_problems(self, phase: ClosedPhase) -> list[str]:
        """Lock held. What is wrong with the batch of ``phase`` as the store has it now."""
        T, K = self.steps_per_phase, self.max_lag
        u = phase.phase
        problems = []
        if list(phase.members) != sorted(set(phase.members)):
            problems.append(f"phase {u} members not sorted/unique: {phase.members}")
        for m in phase.members:
            rows = self.store[u][m]
            steps = sorted(s for s, _, _ in rows)
            if steps != list(range(T)):
                problems.append(f"phase {u} member {m} has steps {steps}, want 0..{T - 1}")
            # lag = (version that trains the sample: u) - (snapshot that produced it)
            bad = [snap for _, snap, _ in rows if u - snap < 0 or (K is not None and u - snap > K)]
            if bad:
                problems.append(f"phase {u} member {m}: {len(bad)} samples with lag outside [0, {K}]: {bad}")
        return problems

    def trainer(self) -> None:
        rng = random.Random(self.seed)
        late = {p.member for p in self.plans if p.join_after is not None}
        next_phase = 0
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
                if phase.phase != next_phase:
                    problems.append(f"closed phase {phase.phase}, expected {next_phase}")
                for p in problems:
                    self.fail(f"trainer: {p}")
                next_phase = phase.phase + 1
                if phase.members:
                    time.sleep(rng.uniform(*self.train_s))  # training (an empty phase: publish unchanged)
                with self.lock:
                    self.trained.append(phase.phase)
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
        if alive:
            self.abort.set()  # let the threads go
        assert not alive, f"threads still running (deadlock?): {alive}; errors: {self.errors[:5]}"
        return self

    # -- final checks (all threads joined) ---------------------------------------

    def lags(self) -> Counter[int]:
        """How many trained samples had each lag (phase - snapshot version at inference)."""
        return Counter(p - snap for p, c in self.closed.items() for m in c.members for _, snap, _ in self.store[p][m])

    def check(self, allow_empty: bool = False) -> None:
        T = self.steps_per_phase
        assert not self.errors, "\n".join(self.errors[:10])
        assert self.stop.is_set(), "the run ended before the trainer saw enough phases"
        phases = sorted(self.closed)
        assert phases == list(range(len(phases))), f"closed phases {phases}"
        assert len(phases) >= self.phases
        assert self.trained == phases, "every closed phase is trained once, in order"
        assert allow_empty or not self.empty, f"phases closed empty: {self.empty}"

        # Every batch is complete and within the lag bound, and nothing was added to it after it closed.
        for p in phases:
            assert self._batch_problems(self.closed[p]) == []

        # Every admission is accounted for: in a closed batch, or dropped by a leave (checked below).
        leaves = {lv.member: lv for lv in self.leaves}
        assert len(leaves) == len(self.leaves) == len(self.plans), "every member leaves exactly once"
        for p, rows_by_member in self.store.items():
            phase = self.closed.get(p)
            for m, rows in rows_by_member.items():
                if phase is not None and m in phase.members:
                    continue
                lv = leaves[m]
                assert lv.phase == p and lv.acted == len(rows), (
                    f"member {m} acted {len(rows)} times in phase {p}, which neither trained nor dropped them: {lv}"
                )

        for lv in self.leaves:
            m = lv.member
            assert m not in {x for c in lv.closed for x in c.members}, lv
            if lv.kind in ("mid", "stop", "fresh"):
                # Left while collecting (or before ever acting): drops what it acted on.
                assert lv.dropped == lv.acted, lv
                if lv.phase is not None and lv.phase in self.closed:
                    assert m not in self.closed[lv.phase].members, lv
            elif lv.kind == "held":
                if lv.held.calls == 1:
                    # The release was decided before the leave: the member was in the new phase at step 0.
                    assert lv.dropped == 1, lv
                    nu = lv.held.admission.phase
                    assert lv.held.admission.step == 0
                    assert nu not in self.closed or m not in self.closed[nu].members, lv
                elif lv.phase is not None and lv.acted == T:
                    # Left with its unroll complete: it keeps the unroll in the phase, which trains it.
                    assert lv.dropped == 0, lv
                    assert lv.phase in self.closed and m in self.closed[lv.phase].members, lv
                else:
                    # A late joiner waiting for its first phase.
                    assert lv.phase is None and lv.dropped == 0, lv
            else:
                raise AssertionError(f"unexpected leave {lv}")

        assert self.gate.held_count() == 0, "a held request survived its member's leave"
        assert self.gate.waiting_for() == []


def _run_sim(allow_empty: bool = False, **kwargs) -> _Sim:
    sim = _Sim(**kwargs).run()
    sim.check(allow_empty=allow_empty)
    return sim


# ---------------------------------------------------------------------------------
# 1-4: threaded simulations, strict mode (and the same scenarios pipelined)
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
    for u in range(sim.phases):
        assert sim.closed[u].members == tuple(range(n))
    # Strictly on-policy: every sample was produced by the version that trains it.
    assert set(sim.lags()) == {0}
    # The first phase is 0 and every actor starts it at step 0 with version 0.
    assert all(a == Admission(0, 0, 0) for a in sim.first.values()) and len(sim.first) == n
    # After the stop every actor left right after being released into the next phase.
    assert {lv.kind for lv in sim.leaves} == {"stop"}
    assert all(lv.dropped == 1 for lv in sim.leaves)


@pytest.mark.parametrize("seed, max_lag", [(11, 0), (12, 0), (13, 1), (14, 2)])
def test_members_leaving_mid_phase_or_while_held_do_not_stall_or_pollute_phases(seed, max_lag):
    T, n, phases = 6, 16, 25
    rng = random.Random(seed)
    plans = []
    for m in range(n):
        if m < 5:
            plans.append(_Plan(m, leave="mid", leave_phase=rng.randrange(1, phases - 3),
                               leave_step=rng.randrange(T)))
        elif m < 10:
            plans.append(_Plan(m, leave="held", leave_phase=rng.randrange(0, phases - 3)))
        else:
            plans.append(_Plan(m))
    # Late joiners that leave too: while waiting for their first phase, before any request, mid-unroll.
    plans += [
        _Plan(16, join_after=2, leave="held"),
        _Plan(17, join_after=5, leave="held"),
        _Plan(18, join_after=3, leave="fresh"),
        _Plan(19, join_after=4, leave="mid", leave_phase=0, leave_step=T // 2),
    ]
    # Pipelined: training slower than collection, so members run ahead and are held by the lag bound.
    train_s = (0.0, 0.005) if max_lag == 0 else (0.004, 0.008)
    sim = _run_sim(steps_per_phase=T, min_members=8, plans=plans, phases=phases, seed=seed,
                   max_lag=max_lag, train_s=train_s)

    leaves = {lv.member: lv for lv in sim.leaves}
    for m in range(5):
        assert leaves[m].kind == "mid", leaves[m]
    for m in range(5, 10):
        # Pipelined: a request is held only where the lag bound binds, which a slow member may never meet.
        assert leaves[m].kind == "held" or (max_lag > 0 and leaves[m].kind == "stop"), leaves[m]
    assert sum(leaves[m].kind == "held" for m in range(5, 10)) >= 1
    # A member that left mid-unroll is in no phase from then on.
    for lv in sim.leaves:
        if lv.kind == "mid":
            assert all(lv.member not in p.members for u, p in sim.closed.items() if u >= lv.phase)
            assert lv.dropped == lv.acted >= 1
    # Phases kept closing after the leavers were gone (pipelined members may first be held, and
    # leave, near the stop: only those leaving mid-unroll at a planned phase count there).
    last_leave = max(lv.phase or 0 for lv in sim.leaves if lv.kind == "mid" or (lv.kind == "held" and not max_lag))
    assert max(sim.closed) > last_leave
    assert max(sim.lags()) <= max_lag


@pytest.mark.parametrize("max_lag", [0, 1])
def test_members_joining_late_start_in_a_later_phase_at_step_0(max_lag):
    T, phases = 5, 25
    plans = [_Plan(m) for m in range(12)]
    plans += [_Plan(m, join_after=j) for m, j in zip(range(12, 16), (1, 3, 3, 8))]
    sim = _run_sim(steps_per_phase=T, min_members=12, plans=plans, phases=phases, seed=21 + max_lag,
                   max_lag=max_lag)

    for m in range(12, 16):
        first = sim.first[m]
        assert first.step == 0
        # It joined after phase 0 was under way, so its first phase came later.
        assert first.phase >= 1
        if max_lag == 0:
            assert first.version == first.phase  # held until the publish of its phase
        joined_phases = [u for u, p in sim.closed.items() if m in p.members]
        assert joined_phases, f"late member {m} never contributed to a phase"
        # From its first phase on it is in every phase until the stop.
        assert joined_phases == list(range(first.phase, first.phase + len(joined_phases)))
        assert all(m not in sim.closed[u].members for u in range(first.phase))
    for u in range(phases):
        expected = {m for m in range(16) if m < 12 or sim.first[m].phase <= u}
        assert set(sim.closed[u].members) == expected


@pytest.mark.parametrize("seed, max_lag", [(51, 0), (52, 0), (53, 1)])
def test_all_initial_members_leaving_mid_phase_while_late_joiners_arrive_does_not_stall(seed, max_lag):
    # Depending on the race, each late joiner enters phase 2 (under way, or emptied and open) or
    # waits beyond it; if all of phase 2's collectors leave while one waits beyond, phase 2 closes
    # empty and the trainer publishes the next version unchanged. Either way nothing stalls.
    T, phases = 4, 8
    rng = random.Random(seed)
    plans = [_Plan(m, leave="mid", leave_phase=2, leave_step=rng.randrange(T)) for m in range(4)]
    plans += [_Plan(m, join_after=2) for m in range(4, 8)]
    sim = _run_sim(allow_empty=True, steps_per_phase=T, min_members=4, plans=plans, phases=phases,
                   seed=seed, max_lag=max_lag)
    assert {lv.kind for lv in sim.leaves if lv.member < 4} == {"mid"}
    for u, c in sim.closed.items():
        assert c.members == (0, 1, 2, 3) if u < 2 else all(m >= 4 for m in c.members), c
        if not c.members:
            assert u == 2, c  # only the phase the initial members abandoned can close empty
    for m in range(4, 8):
        first = sim.first[m].phase
        assert first >= 2
        assert [u for u, c in sim.closed.items() if m in c.members][:1] == [first]


# ---------------------------------------------------------------------------------
# Threaded simulations, pipelined mode
# ---------------------------------------------------------------------------------


@pytest.mark.parametrize("max_lag, steps_per_phase, seed", [(1, 4, 31), (2, 4, 32), (1, 1, 33), (2, 3, 34)])
def test_pipelined_sixteen_actors_lag_stays_within_max_lag_and_reaches_it(max_lag, steps_per_phase, seed):
    n, phases = 16, 25
    sim = _run_sim(
        steps_per_phase=steps_per_phase,
        min_members=n,
        plans=[_Plan(m) for m in range(n)],
        phases=phases,
        seed=seed,
        max_lag=max_lag,
        train_s=(0.004, 0.008),  # slower than collection: the lag bound is what holds the actors
    )
    # Every phase before the stop has all 16 members, each with exactly T steps (checked per batch).
    for u in range(phases):
        assert sim.closed[u].members == tuple(range(n))
    for u, c in sim.closed.items():
        for m in c.members:
            assert sorted(s for s, _, _ in sim.store[u][m]) == list(range(steps_per_phase))
    lags = sim.lags()
    assert min(lags) >= 0 and max(lags) <= max_lag, lags
    # Collection overlapped training: samples with the full lag K were collected (phase u with
    # version u - K, while phases u-K .. u-1 were not trained yet).
    assert lags[max_lag] > 0, lags
    # ... and admissions themselves ran ahead by K.
    admitted_lags = Counter(u - v for u, by in sim.store.items() for rows in by.values() for _, _, v in rows)
    assert max(admitted_lags) == max_lag, admitted_lags
    assert all(a == Admission(0, 0, 0) for a in sim.first.values()) and len(sim.first) == n
    assert {lv.kind for lv in sim.leaves} == {"stop"}
    assert sim.held_after_start > 0  # the lag bound held members that ran ahead


def test_unbounded_lag_never_holds_and_samples_are_never_from_the_future():
    n, T = 8, 3
    sim = _run_sim(steps_per_phase=T, min_members=n, plans=[_Plan(m) for m in range(n)], phases=15,
                   seed=41, max_lag=None, train_s=(0.003, 0.006))
    assert sim.held_after_start == 0
    lags = sim.lags()
    assert min(lags) >= 0 and max(lags) >= 1, lags
    for u in range(15):
        assert sim.closed[u].members == tuple(range(n))


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


def _admit(gate: AdmissionGate, member, releases: Releases) -> Admission:
    result = gate.request(member, releases.for_(member))
    assert result.admission is not None, f"member {member} was held: {result}"
    assert result.completed is None and result.closed == (), result
    return result.admission


def _finish(gate: AdmissionGate, member, releases: Releases) -> RequestResult:
    """Act until the member's unroll is complete; return the result of the request that completed it."""
    while True:
        result = gate.request(member, releases.for_(member))
        if result.completed is not None:
            if gate.max_lag == 0:
                assert result.admission is None, f"strict: the completing request was admitted: {result}"
            return result
        assert result.admission is not None, f"member {member} was held mid-unroll: {result}"
        assert result.closed == ()


def test_late_joiner_is_held_until_the_next_publish_then_admitted_as_step_0():
    r = Releases()
    gate = AdmissionGate(steps_per_phase=2)
    gate.join("a")
    assert _admit(gate, "a", r) == Admission(0, 0, 0)

    gate.join("b")  # phase 0 is under way
    assert gate.request("b", r.for_("b")) == RequestResult(None)
    assert _admit(gate, "a", r) == Admission(0, 1, 0)
    assert gate.waiting_for() == ["a"]
    result = gate.request("a", r.for_("a"))
    assert result == RequestResult(None, completed=0, closed=(ClosedPhase(0, ("a",)),))
    assert result.closed[0].version == 0
    assert r.take() == []  # b waits for the publish, not for the close

    gate.join("c")  # between close and publish: phase 1 has not started, c joins it
    assert gate.request("c", r.for_("c")) == RequestResult(None)
    assert r.take() == []
    assert gate.published == 0

    gate.publish(1)
    assert gate.published == 1
    assert r.take() == [("a", Admission(1, 0, 1)), ("b", Admission(1, 0, 1)), ("c", Admission(1, 0, 1))]
    for m in "abc":
        assert _admit(gate, m, r) == Admission(1, 1, 1)
    assert gate.held_count() == 0


def test_late_joiner_that_does_not_request_before_the_publish_starts_the_new_phase_at_step_0():
    r = Releases()
    gate = AdmissionGate(steps_per_phase=1)
    gate.join("a")
    _admit(gate, "a", r)
    gate.join("b")
    assert _finish(gate, "a", r).closed == (ClosedPhase(0, ("a",)),)
    gate.publish(1)
    assert r.take() == [("a", Admission(1, 0, 1))]
    assert _admit(gate, "b", r) == Admission(1, 0, 1)
    assert _finish(gate, "b", r).closed == ()  # a (released as step 0) has not reported yet
    assert gate.waiting_for() == ["a"]


def test_joiner_enters_a_started_phase_at_once_while_nobody_has_stepped_in_it():
    r = Releases()
    gate = AdmissionGate(steps_per_phase=2, min_members=2)
    gate.join(1)
    gate.join(2)
    assert gate.started
    gate.join(3)  # phase 0 started but no step admitted yet: 3 joins it
    assert gate.waiting_for() == [1, 2, 3]
    assert _admit(gate, 3, r) == Admission(0, 0, 0)
    gate.join(4)  # now phase 0 is under way: 4 waits for phase 1
    assert gate.request(4, r.for_(4)) == RequestResult(None)
    assert gate.waiting_for() == [1, 2, 3]
    for m in (1, 2):
        _finish(gate, m, r)
    assert _finish(gate, 3, r).closed == (ClosedPhase(0, (1, 2, 3)),)
    gate.publish(1)
    assert r.take() == [(m, Admission(1, 0, 1)) for m in (1, 2, 3, 4)]


def test_nothing_is_admitted_before_min_members_join_and_the_first_phase_is_0():
    r = Releases()
    gate = AdmissionGate(steps_per_phase=3, min_members=3)
    gate.join(1)
    assert gate.request(1, r.for_(1)) == RequestResult(None)
    gate.join(2)
    assert gate.request(2, r.for_(2)) == RequestResult(None)
    assert not gate.started and gate.published == 0 and gate.held_count() == 2 and r.take() == []

    assert gate.leave(2) == (0, ())  # leaving before the start discards the held request and does not count
    gate.join(4)
    assert not gate.started and gate.held_count() == 1 and r.take() == []
    with pytest.raises(GateError):
        gate.publish(1)  # no phase has closed

    gate.join(3)
    assert gate.started and gate.published == 0
    assert r.take() == [(1, Admission(0, 0, 0))]  # the early member's held request, as step 0
    assert _admit(gate, 3, r) == Admission(0, 0, 0)
    assert _admit(gate, 4, r) == Admission(0, 0, 0)
    assert _admit(gate, 1, r) == Admission(0, 1, 0)
    assert gate.waiting_for() == [1, 3, 4]
    assert r.take() == []


def test_min_members_with_threads_releases_every_early_request_into_phase_0():
    n = 6
    gate = AdmissionGate(steps_per_phase=2, min_members=n)
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
            assert not gate.started
    for t in threads:
        t.join(JOIN_S)
    assert not errors, errors
    assert results == {m: Admission(0, 0, 0) for m in range(n)}


def test_phase_whose_members_all_left_admits_a_new_joiner_at_once_with_the_same_version():
    r = Releases()
    gate = AdmissionGate(steps_per_phase=3, min_members=2)
    gate.join("a")
    gate.join("b")
    _admit(gate, "a", r)
    _admit(gate, "a", r)
    _admit(gate, "b", r)
    assert gate.leave("a") == (2, ())
    # The last collecting member leaves; nobody waits beyond the phase: it stays open.
    assert gate.leave("b") == (1, ())
    assert gate.waiting_for() == [] and gate.published == 0
    with pytest.raises(GateError):
        gate.publish(1)

    gate.join("c")  # the emptied phase takes a new member at once, with the same version
    assert gate.waiting_for() == ["c"]
    assert gate.request("c", r.for_("c")) == RequestResult(Admission(0, 0, 0))
    assert _admit(gate, "c", r) == Admission(0, 1, 0)
    assert _admit(gate, "c", r) == Admission(0, 2, 0)
    result = gate.request("c", r.for_("c"))
    assert result == RequestResult(None, completed=0, closed=(ClosedPhase(0, ("c",)),))
    gate.publish(1)
    assert r.take() == [("c", Admission(1, 0, 1))]


def test_phase_whose_collecting_members_all_left_closes_empty_when_a_joiner_waits_beyond_it():
    r = Releases()
    gate = AdmissionGate(steps_per_phase=3, min_members=2)
    gate.join("a")
    gate.join("b")
    _admit(gate, "a", r)
    _admit(gate, "a", r)
    _admit(gate, "b", r)
    gate.join("c")  # late joiner: phase 0 is under way, c's first phase is 1
    assert gate.request("c", r.for_("c")) == RequestResult(None)

    assert gate.leave("a") == (2, ())
    assert r.take() == []
    # The last collecting member leaves while c waits beyond the phase: it closes with no unrolls.
    dropped, closed = gate.leave("b")
    assert (dropped, closed) == (1, (ClosedPhase(0, ()),))
    assert closed[0].version == 0
    assert r.take() == []  # c is not let into the emptied phase ...
    assert gate.published == 0 and gate.held_count() == 1
    gate.publish(1)  # ... the trainer publishes the next version unchanged, which releases c
    assert r.take() == [("c", Admission(1, 0, 1))]

    # c carries on alone, then leaves mid-unroll; nobody waits beyond phase 1: it stays open.
    assert _admit(gate, "c", r) == Admission(1, 1, 1)
    assert gate.leave("c") == (2, ())
    gate.join("d")
    assert gate.waiting_for() == ["d"]
    assert gate.request("d", r.for_("d")) == RequestResult(Admission(1, 0, 1))
    assert _admit(gate, "d", r) == Admission(1, 1, 1)
    assert _admit(gate, "d", r) == Admission(1, 2, 1)
    result = gate.request("d", r.for_("d"))
    assert result == RequestResult(None, completed=1, closed=(ClosedPhase(1, ("d",)),))
    gate.publish(2)
    assert r.take() == [("d", Admission(2, 0, 2))]


def test_empty_close_happens_when_the_waiter_requests_after_the_others_left():
    # The late joiner has joined (so it waits beyond phase 0) but not requested yet.
    r = Releases()
    gate = AdmissionGate(steps_per_phase=2, min_members=1)
    gate.join("a")
    _admit(gate, "a", r)
    gate.join("b")
    assert gate.leave("a") == (1, (ClosedPhase(0, ()),))
    assert gate.request("b", r.for_("b")) == RequestResult(None)
    gate.publish(1)
    assert r.take() == [("b", Admission(1, 0, 1))]
    # A late joiner that leaves again before the others does not make the phase close.
    gate.join("c")  # phase 1 is under way (b stepped): c's first phase is 2
    assert gate.leave("c") == (0, ())
    assert gate.leave("b") == (1, ())  # nobody waits beyond phase 1 any more: it stays open
    gate.join("d")
    assert _admit(gate, "d", r) == Admission(1, 0, 1)


def test_phase_emptied_before_anyone_acted_takes_the_next_joiner_at_once():
    r = Releases()
    gate = AdmissionGate(steps_per_phase=2, min_members=2)
    gate.join(1)
    gate.join(2)
    assert gate.leave(1) == (0, ())
    assert gate.leave(2) == (0, ())
    gate.join(3)  # the empty phase 0 takes it at once
    assert gate.request(3, r.for_(3)) == RequestResult(Admission(0, 0, 0))
    gate.join(4)  # phase 0 is under way again: 4 waits for phase 1
    assert gate.request(4, r.for_(4)) == RequestResult(None)
    assert _finish(gate, 3, r).closed == (ClosedPhase(0, (3,)),)
    assert r.take() == []
    gate.publish(1)
    assert r.take() == [(3, Admission(1, 0, 1)), (4, Admission(1, 0, 1))]


def test_phase_closes_when_the_last_collecting_member_leaves():
    r = Releases()
    gate = AdmissionGate(steps_per_phase=2, min_members=3)
    for m in (1, 2, 3):
        gate.join(m)
    assert _finish(gate, 1, r).closed == ()
    assert _finish(gate, 2, r).closed == ()
    _admit(gate, 3, r)
    dropped, closed = gate.leave(3)
    assert (dropped, closed) == (1, (ClosedPhase(0, (1, 2)),))
    assert gate.waiting_for() == [1, 2]  # the members of phase 1, which waits for the publish
    assert r.take() == []
    gate.publish(1)
    assert r.take() == [(1, Admission(1, 0, 1)), (2, Admission(1, 0, 1))]


def test_member_leaving_a_closed_phase_keeps_its_unroll_and_drops_nothing():
    r = Releases()
    gate = AdmissionGate(steps_per_phase=2, min_members=2)
    gate.join(1)
    gate.join(2)
    _finish(gate, 1, r)
    assert _finish(gate, 2, r).closed == (ClosedPhase(0, (1, 2)),)
    assert gate.leave(1) == (0, ())  # its held request is discarded ...
    gate.publish(1)
    assert r.take() == [(2, Admission(1, 0, 1))]  # ... and never released
    assert gate.held_count() == 0


def test_full_member_leaving_an_open_phase_keeps_its_unroll_in_the_phase():
    r = Releases()
    gate = AdmissionGate(steps_per_phase=3, min_members=2)
    gate.join(1)
    gate.join(2)
    _admit(gate, 2, r)
    assert _finish(gate, 1, r).closed == ()  # 1's unroll is complete, 2 still collecting
    assert gate.leave(1) == (0, ())  # nothing dropped, its held request discarded
    assert gate.held_count() == 0 and gate.waiting_for() == [2]
    _admit(gate, 2, r)
    _admit(gate, 2, r)
    assert _finish(gate, 2, r).closed == (ClosedPhase(0, (1, 2)),)  # 1's complete unroll is trained
    gate.publish(1)
    assert r.take() == [(2, Admission(1, 0, 1))]  # the discarded request is never released
    assert gate.waiting_for() == [2]  # and 1 is not in phase 1


def test_full_member_leaving_when_the_others_have_left_closes_the_phase_with_it():
    r = Releases()
    gate = AdmissionGate(steps_per_phase=2, min_members=2)
    gate.join(1)
    gate.join(2)
    _finish(gate, 1, r)
    _admit(gate, 2, r)
    assert gate.leave(1) == (0, ())
    assert gate.leave(2) == (1, (ClosedPhase(0, (1,)),))
    gate.join(3)  # the closed phase takes nobody; 3 waits for the publish
    assert gate.request(3, r.for_(3)) == RequestResult(None)
    gate.publish(1)
    assert r.take() == [(3, Admission(1, 0, 1))]


def test_full_member_that_leaves_and_rejoins_the_same_phase_waits_for_the_next():
    r = Releases()
    gate = AdmissionGate(steps_per_phase=2, min_members=2)
    gate.join(1)
    gate.join(2)
    _finish(gate, 1, r)
    _admit(gate, 2, r)
    gate.leave(1)
    gate.join(1)
    assert gate.request(1, r.for_(1)) == RequestResult(None)  # held: its unroll of phase 0 is complete
    assert gate.waiting_for() == [2]
    assert _finish(gate, 2, r).closed == (ClosedPhase(0, (1, 2)),)
    assert r.take() == []
    gate.publish(1)
    assert r.take() == [(1, Admission(1, 0, 1)), (2, Admission(1, 0, 1))]


def test_collecting_member_that_leaves_and_rejoins_a_phase_under_way_waits_for_the_next_phase():
    r = Releases()
    gate = AdmissionGate(steps_per_phase=2, min_members=2)
    gate.join(1)
    gate.join(2)
    _admit(gate, 2, r)  # phase 0 is under way
    _admit(gate, 1, r)
    assert gate.leave(1) == (1, ())
    gate.join(1)
    assert gate.request(1, r.for_(1)) == RequestResult(None)
    assert gate.waiting_for() == [2]
    assert _finish(gate, 2, r).closed == (ClosedPhase(0, (2,)),)  # the dropped unroll is not in it
    gate.publish(1)
    assert r.take() == [(1, Admission(1, 0, 1)), (2, Admission(1, 0, 1))]


def test_collecting_member_that_leaves_and_rejoins_before_anyone_else_stepped_restarts_the_phase():
    # Only the steps of current members put a phase under way: the dropped unroll does not.
    r = Releases()
    gate = AdmissionGate(steps_per_phase=2, min_members=2)
    gate.join(1)
    gate.join(2)
    _admit(gate, 1, r)
    assert gate.leave(1) == (1, ())
    gate.join(1)
    assert _admit(gate, 1, r) == Admission(0, 0, 0)  # a fresh unroll of phase 0, from step 0
    assert _admit(gate, 1, r) == Admission(0, 1, 0)
    assert _finish(gate, 1, r).closed == ()
    assert _finish(gate, 2, r).closed == (ClosedPhase(0, (1, 2)),)


# ---------------------------------------------------------------------------------
# Pipelined scenarios (max_lag >= 1, and None)
# ---------------------------------------------------------------------------------


def test_pipelined_member_runs_ahead_by_max_lag_then_waits_for_the_publish():
    r = Releases()
    gate = AdmissionGate(steps_per_phase=2, min_members=1, max_lag=1)
    gate.join("a")
    assert _admit(gate, "a", r) == Admission(0, 0, 0)
    assert _admit(gate, "a", r) == Admission(0, 1, 0)
    # The completing request closes phase 0 and is admitted at once to phase 1 (lag 1).
    assert gate.request("a", r.for_("a")) == RequestResult(
        Admission(0, 0, 1), completed=0, closed=(ClosedPhase(0, ("a",)),))
    assert _admit(gate, "a", r) == Admission(0, 1, 1)
    # Phase 2 would need version >= 1: held.
    assert gate.request("a", r.for_("a")) == RequestResult(None, completed=1, closed=(ClosedPhase(1, ("a",)),))
    assert r.take() == []
    gate.publish(1)
    assert r.take() == [("a", Admission(1, 0, 2))]
    gate.publish(2)  # phase 1 is closed: allowed; nothing held
    assert r.take() == [] and gate.published == 2
    assert _admit(gate, "a", r) == Admission(2, 1, 2)  # the version may change within an unroll
    assert gate.request("a", r.for_("a")) == RequestResult(
        Admission(2, 0, 3), completed=2, closed=(ClosedPhase(2, ("a",)),))
    with pytest.raises(GateError):
        gate.publish(4)  # versions are published one by one
    gate.publish(3)  # phase 2 is closed
    with pytest.raises(GateError):
        gate.publish(4)  # phase 3 is collecting
    assert r.take() == []


def test_pipelined_phases_close_in_order_and_a_leave_can_close_several():
    r = Releases()
    gate = AdmissionGate(steps_per_phase=1, min_members=2, max_lag=2)
    gate.join("a")
    gate.join("b")
    assert _admit(gate, "a", r) == Admission(0, 0, 0)
    assert gate.request("a", r.for_("a")) == RequestResult(Admission(0, 0, 1), completed=0)
    assert gate.request("a", r.for_("a")) == RequestResult(Admission(0, 0, 2), completed=1)
    assert gate.request("a", r.for_("a")) == RequestResult(None, completed=2)  # phase 3 needs version 1
    assert gate.waiting_for() == ["b"]
    with pytest.raises(GateError):
        gate.publish(1)  # phase 0 is still collecting
    assert _admit(gate, "b", r) == Admission(0, 0, 0)
    # b completes phase 0: only phase 0 closes; b now collects in phase 1, which holds a's unroll.
    result = gate.request("b", r.for_("b"))
    assert result == RequestResult(Admission(0, 0, 1), completed=0, closed=(ClosedPhase(0, ("a", "b")),))
    assert gate.waiting_for() == ["b"]
    # b leaves mid phase 1: phases 1 and 2 (a's unrolls only) close together, oldest first.
    assert gate.leave("b") == (1, (ClosedPhase(1, ("a",)), ClosedPhase(2, ("a",))))
    gate.publish(1)
    assert r.take() == [("a", Admission(1, 0, 3))]
    gate.publish(2)
    gate.publish(3)
    with pytest.raises(GateError):
        gate.publish(4)  # phase 3 is collecting
    assert gate.published == 3


def test_pipelined_late_joiner_starts_without_a_publish_and_an_emptied_phase_closes_empty():
    r = Releases()
    gate = AdmissionGate(steps_per_phase=2, min_members=1, max_lag=1)
    gate.join("a")
    _admit(gate, "a", r)
    gate.join("b")  # phase 0 under way: b's first phase is 1, admissible with version 0
    assert _admit(gate, "b", r) == Admission(0, 0, 1)
    assert gate.waiting_for() == ["a"]
    # a leaves mid phase 0 while b collects beyond it: phase 0 closes empty.
    assert gate.leave("a") == (1, (ClosedPhase(0, ()),))
    assert gate.waiting_for() == ["b"]
    assert _admit(gate, "b", r) == Admission(0, 1, 1)
    assert gate.request("b", r.for_("b")) == RequestResult(None, completed=1, closed=(ClosedPhase(1, ("b",)),))
    gate.publish(1)  # phase 0 trained as a no-op
    assert r.take() == [("b", Admission(1, 0, 2))]
    gate.publish(2)
    assert _admit(gate, "b", r) == Admission(2, 1, 2)


def test_pipelined_lag_bound_holds_a_fast_member_while_a_slow_one_collects():
    r = Releases()
    gate = AdmissionGate(steps_per_phase=1, min_members=2, max_lag=1)
    gate.join("fast")
    gate.join("slow")
    assert _admit(gate, "fast", r) == Admission(0, 0, 0)
    assert gate.request("fast", r.for_("fast")) == RequestResult(Admission(0, 0, 1), completed=0)
    assert gate.request("fast", r.for_("fast")) == RequestResult(None, completed=1)
    assert gate.held_count() == 1
    assert _admit(gate, "slow", r) == Admission(0, 0, 0)
    assert gate.request("slow", r.for_("slow")) == RequestResult(
        Admission(0, 0, 1), completed=0, closed=(ClosedPhase(0, ("fast", "slow")),))
    assert r.take() == []  # closing phase 0 is not enough: phase 2 needs version 1
    gate.publish(1)
    assert r.take() == [("fast", Admission(1, 0, 2))]
    assert gate.request("slow", r.for_("slow")) == RequestResult(
        Admission(1, 0, 2), completed=1, closed=(ClosedPhase(1, ("fast", "slow")),))


def test_unbounded_lag_never_holds_but_phases_still_close_in_order_and_publish_follows_them():
    r = Releases()
    gate = AdmissionGate(steps_per_phase=2, min_members=1, max_lag=None)
    gate.join("a")
    for u in range(5):  # a runs five phases ahead with version 0
        if u == 0:
            assert _admit(gate, "a", r) == Admission(0, 0, 0)
        else:
            assert gate.request("a", r.for_("a")) == RequestResult(
                Admission(0, 0, u), completed=u - 1, closed=(ClosedPhase(u - 1, ("a",)),))
        assert _admit(gate, "a", r) == Admission(0, 1, u)
    assert gate.held_count() == 0 and gate.waiting_for() == ["a"]
    for v in range(1, 5):
        gate.publish(v)
    with pytest.raises(GateError):
        gate.publish(5)  # phase 4 is collecting
    assert r.take() == []
    assert gate.request("a", r.for_("a")) == RequestResult(
        Admission(4, 0, 5), completed=4, closed=(ClosedPhase(4, ("a",)),))


def test_max_lag_and_steps_per_phase_are_validated():
    with pytest.raises(ValueError):
        AdmissionGate(steps_per_phase=0)
    with pytest.raises(ValueError):
        AdmissionGate(steps_per_phase=2, max_lag=-1)
    assert AdmissionGate(steps_per_phase=2).max_lag == 0  # strict is the default
    assert AdmissionGate(steps_per_phase=2, max_lag=None).max_lag is None


# Complete unrolls left behind by a member that has left, in a phase beyond every current
# member's phase (pipelined only: in strict mode nobody completes phase u+1 while u is open).


def test_joiner_is_not_put_into_a_phase_that_already_holds_a_complete_unroll():
    r = Releases()
    gate = AdmissionGate(steps_per_phase=2, min_members=1, max_lag=1)
    gate.join("A")
    _admit(gate, "A", r)  # phase 0 under way
    gate.join("B")  # first phase 1
    assert _admit(gate, "B", r) == Admission(0, 0, 1)
    assert _admit(gate, "B", r) == Admission(0, 1, 1)
    assert gate.request("B", r.for_("B")) == RequestResult(None, completed=1)  # phase 1 is under way
    assert gate.leave("B") == (0, ())  # B keeps its complete unroll of phase 1
    gate.join("C")
    # Phase 1 holds a complete unroll: C must start in phase 2 (as it does when B stays), which
    # version 0 may not collect. The gate puts C into phase 1 and admits it at once.
    assert gate.request("C", r.for_("C")) == RequestResult(None)


def test_member_that_rejoins_does_not_collect_a_phase_it_already_completed():
    r = Releases()
    gate = AdmissionGate(steps_per_phase=1, min_members=1, max_lag=1)
    gate.join("A")
    _admit(gate, "A", r)
    gate.join("B")
    assert _admit(gate, "B", r) == Admission(0, 0, 1)
    assert gate.request("B", r.for_("B")) == RequestResult(None, completed=1)
    gate.leave("B")
    gate.join("B")
    # The gate admits B to phase 1 again: B would be admitted 2T times in phase 1 and complete it
    # twice (the learner keeps one unroll per member and phase: the first is silently overwritten).
    assert gate.request("B", r.for_("B")) == RequestResult(None)


def test_complete_unroll_of_a_member_that_left_is_not_stranded_when_the_phase_before_empties():
    r = Releases()
    gate = AdmissionGate(steps_per_phase=1, min_members=1, max_lag=1)
    gate.join("A")
    _admit(gate, "A", r)
    gate.join("B")
    assert _admit(gate, "B", r) == Admission(0, 0, 1)
    assert gate.request("B", r.for_("B")) == RequestResult(None, completed=1)
    assert gate.leave("B") == (0, ())
    # Nobody collects in phase 0 any more and B's complete unroll waits beyond it: phase 0 should
    # close empty and phase 1 with B's unroll. The gate closes nothing (phase 1 has no collector
    # and a complete unroll, yet stays open until some new member completes phase 0).
    assert gate.leave("A") == (1, (ClosedPhase(0, ()), ClosedPhase(1, ("B",))))


# ---------------------------------------------------------------------------------
# 6: protocol errors
# ---------------------------------------------------------------------------------


def test_request_before_join_raises():
    gate = AdmissionGate(steps_per_phase=2)
    with pytest.raises(GateError):
        gate.request(1, lambda a: None)
    gate.join(1)
    gate.leave(1)
    with pytest.raises(GateError):
        gate.request(1, lambda a: None)  # after leaving, too


def test_double_join_raises_and_leaving_a_non_member_raises():
    gate = AdmissionGate(steps_per_phase=2)
    gate.join(1)
    with pytest.raises(GateError):
        gate.join(1)
    with pytest.raises(GateError):
        gate.leave(2)
    assert gate.waiting_for() == [1]


@pytest.mark.parametrize("max_lag", [0, 1])
def test_second_held_request_for_one_member_raises_and_keeps_the_first(max_lag):
    r = Releases()
    gate = AdmissionGate(steps_per_phase=1, max_lag=max_lag)
    gate.join(1)
    assert _admit(gate, 1, r) == Admission(0, 0, 0)
    for u in range(1, max_lag + 1):  # pipelined: runs ahead until the lag bound holds it
        assert gate.request(1, r.for_(1)).admission == Admission(0, 0, u)
    assert gate.request(1, r.for_("first")).admission is None  # held by the lag bound
    with pytest.raises(GateError):
        gate.request(1, r.for_("second"))
    # Also for a request held while waiting for the first phase.
    gate2 = AdmissionGate(steps_per_phase=1, min_members=2, max_lag=max_lag)
    gate2.join(1)
    assert gate2.request(1, r.for_("early")).admission is None
    with pytest.raises(GateError):
        gate2.request(1, r.for_("early-2"))
    gate.publish(1)
    gate2.join(2)
    assert r.take() == [("early", Admission(0, 0, 0)), ("first", Admission(1, 0, max_lag + 1))]


def test_publish_without_a_closed_phase_raises():
    gate = AdmissionGate(steps_per_phase=2, min_members=2)
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
    assert gate.published == 0 and gate.started and gate.waiting_for() == [1, 2]


def test_publish_of_a_non_consecutive_version_raises():
    r = Releases()
    gate = AdmissionGate(steps_per_phase=1)
    gate.join(1)
    _admit(gate, 1, r)
    assert _finish(gate, 1, r).closed == (ClosedPhase(0, (1,)),)
    for bad in (0, 2, -1, 5):
        with pytest.raises(GateError):
            gate.publish(bad)
    assert r.take() == [] and gate.held_count() == 1 and gate.published == 0
    gate.publish(1)
    assert r.take() == [(1, Admission(1, 0, 1))]
    with pytest.raises(GateError):
        gate.publish(2)  # phase 1 has not closed
    with pytest.raises(GateError):
        gate.publish(1)  # not twice
    assert gate.published == 1


def test_pipelined_publish_follows_closes_one_version_at_a_time():
    r = Releases()
    gate = AdmissionGate(steps_per_phase=1, max_lag=2)
    gate.join(1)
    _admit(gate, 1, r)
    gate.request(1, r.for_(1))
    gate.request(1, r.for_(1))  # phases 0 and 1 closed, phase 2 collecting
    with pytest.raises(GateError):
        gate.publish(2)  # skips 1
    gate.publish(1)
    gate.publish(2)
    with pytest.raises(GateError):
        gate.publish(3)  # phase 2 is collecting
    assert gate.published == 2 and r.take() == []


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
