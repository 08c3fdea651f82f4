"""The admission gate under real threads, laid out like the learner.

One thread per actor (member) requests, waits on an event when held, "infers"
after a random delay with whatever snapshot is published, and records the
transition; one trainer thread takes each closed phase from a queue (in phase
order), checks its batch, swaps the published snapshot and only then calls
``publish``. Strict mode (``max_lag=0``) and pipelined mode (``max_lag=K >= 1``,
collection of phase u overlaps training of phase u-1) run the same scenarios;
``max_lag=None`` (never holds) runs one.

Every check is about the outcome (which admissions, which batches, which
callbacks, which lags), never about timing, and every wait has a generous
timeout so a broken gate fails instead of hanging.
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

from lockstep.sync import Admission, AdmissionGate, ClosedPhase

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
# Real threads without the simulation: the start of the first phase
# ---------------------------------------------------------------------------------


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
        except BaseException as e:
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
