"""Actor sessions: one per connected actor, whatever transport carries its messages.

``Sessions`` is what a transport talks to (``transport.protocol.ActorHandler``):
it checks each hello against the learner's spaces, keeps one session per actor id
and retires run ids whose connection ended. A ``Session`` turns one actor's steps
into gate requests, forward passes and unroll records.

Run ids: every actor start or reconnect says hello with a new run id. A hello with
a known actor id and a new run id *replaces* the old session (its unfinished unroll
is dropped and counted): the actor noticed a broken connection before the learner
did. The replaced connection, if it is still alive (two actors given the same id),
is refused on its next step with a message that says so. A run id whose connection
ended can never come back, so a replayed hello is refused. A hello is accepted whole or refused with no
trace (``Sessions.connect``): a refused one never replaces a live session.

Step deadline: an actor that the oldest open phase waits for and that owes the learner its next step
(``owed_since``, stamped by the connection loop when the learner's answer went out) for longer than its
deadline is *evicted* by the watchdog exactly as if it had disconnected: it leaves the gate, its unfinished
unroll is dropped and counted, and its connection is ended with DEADLINE_EXCEEDED (the actor may reconnect
with a new run id). The deadline follows the pace the learner has seen (``StepDeadline``)::

    deadline = min(ceiling, max(floor, factor x max(own, others)))

``own`` is the actor's slowest recent step gap (seconds from the learner's answer to its next step: each
step's gap or the slowest before it decayed by ``GAP_DECAY``, whichever is longer), ``others`` the median
of the other connected actors' ``own``; ``floor`` is ``sync.first_step_deadline_s`` until the actor's first
step since its hello and ``sync.step_deadline_min_s`` after, ``ceiling`` is ``sync.step_deadline_s`` and
``factor`` ``sync.step_deadline_factor``. Invariants:

1. No actor is evicted sooner than min(ceiling, floor) after the learner's last answer: a step or a first
   reset shorter than its floor is never cut, however fast the other actors are.
2. No actor holds a phase longer than the ceiling (and the watchdog's tick, at most 1 s).
3. A held request never counts: ``owed_since`` is None while the learner owes the answer, and a gap is
   measured from the answer, so a gap is the actor's own time (its envs and the wire).
4. An actor's deadline grows with its own pace and the others': an env that is slow throughout is
   given ``factor`` times its own step, and one that joins a slow run ``factor`` times the others'.
5. The per-step cost is two clock reads, a multiplication and a comparison; the rule is evaluated by the
   watchdog only, and only for actors already owing a step for longer than the least deadline possible.

A silent member, a hung env or a peer that never reads its replies therefore holds a phase for its
deadline: ``sync.first_step_deadline_s`` (20 s) for one that never stepped, ``sync.step_deadline_min_s``
(60 s) for a hung one of an ordinary env.

Stalls: the watchdog also warns, once per phase, when the oldest open phase has collected for longer than the
run's own phases usually take, naming the actors it waits for; such a phase counts as a stall (``stalls`` in
metrics.csv and summary.json). The limit follows the phases' history (``StallRule``)::

    limit = max(stall_s, factor x median(recent))

``recent`` are the collect times (seconds from one phase's close to the next's) of the last
``rollout.RECENT_PHASES`` (20) closed phases, none before the first close; ``stall_s`` is ``sync.stall_s``
and ``factor`` is ``STALL_FACTOR`` (3). Invariants:

1. A phase that collects for no longer than ``sync.stall_s`` is never a stall; before any phase has closed
   (the first phase, which includes the actors' start) the limit is ``sync.stall_s``.
2. A run at a steady pace, however slow, has no stall after its first phase: a phase within ``factor`` times
   the median of the phases before it is none. A phase far slower than its history is one, and a few such
   phases do not raise the limit for the next (the median moves only once half the window is slow).
3. The warning and the count agree: both judge a phase against the history before it, the watchdog while it
   collects (``PhaseStore.recent``), the trainer when it is trained (``TrainingPhase.recent_s``, the same
   tuple). A stall is warned of at most once; one that passes its limit by less than the watchdog's tick
   may close before the watchdog looks, and is counted all the same.
4. The cost is a tuple of at most 20 floats replaced at each close, and its median once per watchdog tick
   and once per trained phase.
"""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from lockstep.algo import noise
from lockstep.envs import EnvSpec
from lockstep.learner import RunFailed
from lockstep.learner.backends import InferenceBackend, Retry
from lockstep.learner.rollout import PhaseStore, Unroll
from lockstep.learner.teams import TeamReturns
from lockstep.observe.counters import Clock, Counters, ReleaseLatency
from lockstep.observe.metrics import EpisodeTracker
from lockstep.sync import Admission, AdmissionGate
from lockstep.transport import PROTOCOL
from lockstep.transport.messages import OPPONENT, HelloInfo, StepData, check_action_mask
from lockstep.transport.protocol import (
    ALREADY_EXISTS,
    FAILED_PRECONDITION,
    INVALID_ARGUMENT,
    UNAVAILABLE,
    Refused,
    Reply,
    Welcome,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from lockstep.config import SyncConfig
    from lockstep.learner.opponents import OpponentPool

log = logging.getLogger(__name__)

GAP_DECAY = 0.99  # per step: a slow step's weight in an actor's "slowest recent gap" halves in ~70 steps
STALL_FACTOR = 3.0  # a phase is a stall past this many times the median collect time of the phases before it


WATCH_TICK_MIN_S = 0.05  # the watchdog's shortest sleep: settings of milliseconds must not make it spin


def watch_tick(config: SyncConfig) -> float:
    """How long the watchdog sleeps between looks: half the stall time and a quarter of the least step deadline,
    so that it overshoots neither by much; at most 1 s (invariant 2 below), at least ``WATCH_TICK_MIN_S``."""
    return max(WATCH_TICK_MIN_S, min(1.0, config.stall_s / 2, StepDeadline.of(config).least_s / 4))


@dataclass(frozen=True)
class StepDeadline:
    """The step deadline rule (the module's docstring): how long the oldest open phase waits for an actor's
    next step, from its own pace and the other actors'."""

    ceiling_s: float  # sync.step_deadline_s
    first_step_s: float  # sync.first_step_deadline_s: the floor until the actor's first step since its hello
    floor_s: float  # sync.step_deadline_min_s: the floor after
    factor: float  # sync.step_deadline_factor

    @classmethod
    def of(cls, config: SyncConfig) -> StepDeadline:
        return cls(config.step_deadline_s, config.first_step_deadline_s, config.step_deadline_min_s,
                   config.step_deadline_factor)

    @property
    def least_s(self) -> float:
        """No deadline is shorter: an actor owing a step for less is not looked at further."""
        return min(self.ceiling_s, self.first_step_s, self.floor_s)

    def seconds(self, own: float | None, others: float | None) -> tuple[float, str]:
        """The deadline of an actor whose slowest recent step gap is ``own`` (None: no step since its hello)
        beside the other actors' typical ``others`` (None: none has stepped), and the rule that set it:
        "first step", "floor", "pace" or "ceiling"."""
        pace = self.factor * max(own or 0.0, others or 0.0)
        floor, rule = (self.first_step_s, "first step") if own is None else (self.floor_s, "floor")
        deadline, rule = (pace, "pace") if pace > floor else (floor, rule)
        return (self.ceiling_s, "ceiling") if deadline > self.ceiling_s else (deadline, rule)

    def explain(self, own: float | None, others: float | None) -> str:
        """What ``seconds`` gave and why, with its numbers: the eviction's log line and refusal."""
        deadline, rule = self.seconds(own, others)
        return f"deadline {deadline:.3g} s: {self._rule(rule, own, others)}"

    def _rule(self, rule: str, own: float | None, others: float | None) -> str:
        if rule == "ceiling":
            uncapped = StepDeadline(float("inf"), self.first_step_s, self.floor_s, self.factor)
            return f"the ceiling sync.step_deadline_s = {self.ceiling_s:g}, below {uncapped.explain(own, others)}"
        mine = own is not None and (others is None or own >= others)
        basis = (f"its slowest recent step gap {own:.3g} s" if mine
                 else None if others is None else f"the other actors' typical step gap {others:.3g} s")
        pace = None if basis is None else f"sync.step_deadline_factor {self.factor:g} x {basis}"
        if rule == "pace":
            return f"its pace, {pace}"
        less = ("no step gap seen yet" if pace is None
                else f"its pace gives less: {pace} = {self.factor * max(own or 0.0, others or 0.0):.3g} s")
        if rule == "first step":
            return f"no step since its hello, sync.first_step_deadline_s = {self.first_step_s:g}; {less}"
        return f"the floor sync.step_deadline_min_s = {self.floor_s:g}; {less}"


@dataclass(frozen=True)
class StallRule:
    """The stall rule (the module's docstring): how long a phase may collect, after phases that collected for
    ``recent`` seconds each, before it is a stall."""

    floor_s: float  # sync.stall_s
    factor: float = STALL_FACTOR

    @classmethod
    def of(cls, config: SyncConfig) -> StallRule:
        return cls(config.stall_s)

    def limit_s(self, recent: Sequence[float]) -> float:
        """The longest collect time that is no stall after phases of ``recent`` collect times (none: no history)."""
        return max(self.floor_s, self.factor * statistics.median(recent)) if recent else self.floor_s

    def stalled(self, collect_s: float, recent: Sequence[float]) -> bool:
        """Whether a phase that collected for ``collect_s`` after phases of ``recent`` collect times is a stall."""
        return collect_s > self.limit_s(recent)

    def explain(self, recent: Sequence[float]) -> str:
        """The limit and the rule that set it, with its numbers: the watchdog's warning."""
        if not recent:
            return f"{self.floor_s:g} s (sync.stall_s; no phase has closed yet)"
        typical = statistics.median(recent)
        pace = f"{self.factor:g} x the median collect time {typical:.3g} s of the last {len(recent)} phases"
        if self.factor * typical > self.floor_s:
            return f"{self.factor * typical:.3g} s ({pace}; sync.stall_s = {self.floor_s:g} is less)"
        return f"{self.floor_s:g} s (sync.stall_s; {pace} is less)"


class StallWatch:
    """The watchdog's stall warnings: once per phase, when the oldest open phase has collected for longer than
    ``rule`` allows after the phases closed before it (``phases.recent``)."""

    def __init__(self, rule: StallRule, phases: PhaseStore) -> None:
        self.rule, self.phases = rule, phases
        self.warned = -1  # the last phase warned of

    def overdue(self, phase: int) -> str | None:
        """What to warn of the first time the oldest open phase, ``phase``, is past its limit; else None."""
        if phase == self.warned:
            return None
        recent = self.phases.recent
        if not self.rule.stalled(self.phases.collecting_s(), recent):
            return None
        self.warned = phase
        return f"phase {phase} has collected for more than {self.rule.explain(recent)}"


class Sessions:
    """The connected actors of one learner; accepts and ends their sessions on the event loop."""

    def __init__(self, spec: EnvSpec, welcome: Welcome, steps_per_phase: int, gate: AdmissionGate,
                 backend: InferenceBackend, phases: PhaseStore, counters: Counters, episodes: EpisodeTracker,
                 clock: Clock) -> None:
        self.spec, self.welcome, self.steps_per_phase = spec, welcome, steps_per_phase
        self.gate, self.backend, self.phases = gate, backend, phases
        self.counters, self.episodes, self.clock = counters, episodes, clock
        self.slot_counters: dict[int, int] = {}  # actor id -> steps taken: its slots' noise counter
        self.finished = False
        self._live: dict[int, Session] = {}
        self._retired_runs: set[str] = set()  # run ids of connections that ended: a replayed hello is refused
        self.releases = ReleaseLatency()  # per phase: publish -> the last held request resumed (summary.json)
        self.opponents: OpponentPool | None = None  # a self-play game's opponents (``learner.opponents``)
        # a PettingZoo parallel env's finished env episodes, their agents' returns summed (``learner.teams``),
        # the report's, so that a resumed run continues them
        self.teams: EpisodeTracker | None = None
        # several policies: each policy's episodes, the mean return of its agents in each env episode (the report's)
        self.policy_returns: dict[str, EpisodeTracker] = {}
        self.failure: str | None = None  # why the learner failed (``fail``): every connection is refused with it
        self.on_failure: Callable[[BaseException], None] = lambda error: None  # the learner's: it stops the run

    @property
    def actor_ids(self) -> list[int]:
        return sorted(self._live)

    def describe(self, actor_ids: list[int]) -> str:
        """"actor 3 (8 slots), ..." for the connected ones of ``actor_ids`` (the watchdog's message)."""
        return ", ".join(f"actor {m} ({self._live[m].num_envs} slots)" for m in actor_ids if m in self._live)

    def connect(self, hello: HelloInfo) -> tuple[Session, Welcome]:
        """Accept an actor (``transport.protocol.ActorHandler``) or raise ``Refused`` naming the problem.

        All or nothing: every check that can refuse the hello (``check``, and the backend's ``check_join`` of its
        slots) runs before anything changes. A refused hello leaves the live sessions, the retired run ids, the
        gate and the backend as they were: a live actor of the same id keeps its session and trains on, and a
        later hello with that id is served as if the refused one had never come."""
        self.check(hello)
        if hello.role == OPPONENT:  # inference only: no gate, no unroll, not one of the live actors
            return self.opponents.connect(hello), self.welcome
        self.backend.check_join(hello.actor_id, hello.num_envs)
        session = Session(self, hello)
        # accepted: from here on nothing refuses
        old = self._live.get(hello.actor_id)
        if old is not None:
            newer = f"run {hello.run_id}" + (f" from {hello.peer}" if hello.peer else "")
            dropped = self.disconnect(old, replaced_by=newer)
            log.warning("actor %d reconnected (run %s replaces run %s); %d transition(s) of its unfinished "
                        "unroll dropped", hello.actor_id, hello.run_id[:8], old.run_id[:8], dropped)
        self._live[hello.actor_id] = session
        # the backend learns the actor's slots before the gate can admit anything: a join that starts
        # the first phase releases requests, and their first pass must already have the full layout
        self.backend.join(hello.actor_id, hello.num_envs)
        self.gate.join(hello.actor_id, weight=hello.num_envs)
        if not self.clock.started and self.gate.started:  # the first phase starts: training time counts from here
            self.clock.start()
            self.phases.restart_timer()
        log.info("actor %d joined with %d env(s) (run %s)", hello.actor_id, hello.num_envs, hello.run_id[:8])
        return session, self.welcome

    def check(self, hello: HelloInfo) -> None:
        """Raise ``Refused`` naming the problem if ``hello`` cannot join as it says (``connect``'s checks that
        need no backend); reads the learner's state and changes none of it."""
        if hello.protocol != PROTOCOL:
            raise Refused(FAILED_PRECONDITION, f"actor speaks protocol {hello.protocol}, the learner {PROTOCOL}; "
                          "run the same lockstep version on both")
        problems = []
        for what, ours, theirs in (("observation space", self.spec.observation, hello.observation),
                                   ("action space", self.spec.action, hello.action)):
            diff = ours.mismatch(theirs)
            if diff:
                problems.append(f"{what} {diff} for {self.spec.env_id}")
        if problems:
            if self.spec.agents > 1:  # a PettingZoo env's slots are laid out by the learner's settings
                problems.append("its slots follow the learner's env.agent_id, model.critic_input and policies: "
                                "start actors by hand with the same --agent-id, --critic-input and --policies")
            raise Refused(INVALID_ARGUMENT, f"actor {hello.actor_id} ({hello.env_id}): " + "; ".join(problems))
        mapping = self._mapping_problem(hello.agent_policies)
        if mapping:
            raise Refused(INVALID_ARGUMENT, f"actor {hello.actor_id} ({hello.env_id}): {mapping}")
        if hello.num_envs < 1:
            raise Refused(INVALID_ARGUMENT, f"actor {hello.actor_id}: num_envs must be >= 1")
        if hello.role == OPPONENT:
            if self.opponents is None:
                raise Refused(FAILED_PRECONDITION, f"actor {hello.actor_id}: an opponents' connection, but "
                              f"{self.spec.env_id} is no self-play game (env id pettingzoo:MODULE of a turn-based one)")
            if self.finished:
                raise Refused(UNAVAILABLE, "training is over")
            return
        if hello.run_id in self._retired_runs:
            raise Refused(FAILED_PRECONDITION, f"actor {hello.actor_id}: run id {hello.run_id} has ended and cannot "
                          "rejoin; a restarted actor says hello with a new run id")
        old = self._live.get(hello.actor_id)
        if old is not None and old.run_id == hello.run_id:
            raise Refused(ALREADY_EXISTS, f"actor id {hello.actor_id} is already connected with run id "
                          f"{hello.run_id}; give each actor a distinct --actor-id")
        if self.finished:
            raise Refused(UNAVAILABLE, "training is over")

    def _mapping_problem(self, theirs: dict[str, str]) -> str | None:
        """How an actor's agent -> policy mapping (its hello's ``agent_policies``) differs from the learner's, with
        the flag that fixes it; None if they agree. Two policies of the same spaces give the same slot spaces
        whichever agents they act for, so only the mapping tells a swapped one apart."""
        ours = self.spec.agent_policies
        if theirs == ours:
            return None
        if not ours:
            return (f"its agents are mapped to policies ({_mapping(theirs)}), but the learner runs one policy for "
                    "every agent: start the actor without --policies")
        fix = ("start it with lockstep actor --policies '{"
               + ", ".join(f"{policy}: [{', '.join(a for a, p in ours.items() if p == policy)}]"
                           for policy in self.spec.policies) + "}', the learner's policies")
        if not theirs:
            return (f"its hello maps no agent to a policy, but the learner runs several policies ({_mapping(ours)}); "
                    f"{fix} (an actor of an older lockstep version sends no mapping: run the learner's version)")
        differ = [agent for agent in ours if theirs.get(agent) != ours[agent]]
        unknown = [agent for agent in theirs if agent not in ours]
        parts = [(f"agent {agent} acts for policy {theirs[agent]!r} in this actor, for {ours[agent]!r} on the learner"
                  if agent in theirs else f"agent {agent} has no policy in this actor, {ours[agent]!r} on the learner")
                 for agent in differ[:8]]
        parts += [f"agent {agent} is no agent of the learner's env" for agent in unknown[:8]]
        more = len(differ) + len(unknown) - len(parts)
        return (f"its agents' policies differ from the learner's: {'; '.join(parts)}"
                + (f" (and {more} more)" if more > 0 else "") + f"; {fix}")

    def disconnect(self, session: Session, replaced_by: str | None = None) -> int:
        """End ``session``: leave the gate, drop its unfinished unroll; return the transitions dropped."""
        if self._live.get(session.member) is not session:
            return 0
        del self._live[session.member]
        self.backend.leave(session.member)
        self._retired_runs.add(session.run_id)
        _, closed = self.gate.leave(session.member)
        dropped = session.drop_unfinished()
        session.replaced_by = replaced_by
        session.cancel_wait()
        self.phases.close(closed)
        if replaced_by is None and not self.finished and session.evicted is None:
            log.info("actor %d left; %d transition(s) of its unfinished unroll dropped", session.member, dropped)
        return dropped

    async def watchdog(self, config: SyncConfig) -> None:
        """``watch`` until serving ends; an exception of its own is a learner failure (``fail``), not silence."""
        try:
            await self.watch(config)
        except Exception as err:
            self.fail(err, "the watchdog")

    async def watch(self, config: SyncConfig) -> None:
        """Log, once per phase, which actors a phase waits for when it is a stall (``StallRule``); evict those
        that owe their next step for longer than their step deadline."""
        stalls, rule = StallWatch(StallRule.of(config), self.phases), StepDeadline.of(config)
        while True:
            await asyncio.sleep(watch_tick(config))
            self.evict_late(rule)
            late = self.clock.started and stalls.overdue(self.gate.oldest_open)
            if late:
                log.warning("%s; waiting for %s", late, self.describe(self.gate.waiting_for()) or "actors to connect")

    def evict_late(self, rule: StepDeadline) -> None:
        """Evict every actor the oldest open phase waits for whose next step is later than ``rule`` allows it."""
        now, phase = time.perf_counter(), self.gate.oldest_open
        late = [session for member in self.gate.waiting_for() if (session := self._live.get(member)) is not None
                and session.owed_since is not None and now - session.owed_since > rule.least_s]
        if not late:
            return
        gaps = {m: s.slowest_gap for m, s in self._live.items() if s.slowest_gap is not None}
        for session in late:
            member, owed = session.member, now - session.owed_since
            others = [gap for m, gap in gaps.items() if m != member]
            own, typical = session.slowest_gap, statistics.median(others) if others else None
            if owed <= rule.seconds(own, typical)[0]:
                continue
            session.evicted = (f"actor {member}: evicted, no step for {owed:.0f} s after the learner's last "
                               f"answer while phase {phase} waits for it; {rule.explain(own, typical)}; "
                               "a restarted actor says hello with a new run id")
            self.counters.evicted_actors += 1
            dropped = self.disconnect(session)
            log.warning("%s; %d transition(s) of its unfinished unroll dropped", session.evicted, dropped)
            session.end_connection()

    def publish(self, version: int) -> None:
        """Release the requests held for ``version`` (``gate.publish``), timing their release for ``releases``.

        Called by the trainer thread once the backend serves ``version``; the stamp comes first, so every
        resumption it causes is measured from it."""
        self.releases.published(version)
        if self.opponents is not None:  # the backend serves ``version`` already: it may join the pool
            self.opponents.published()
        self.phases.close(self.gate.publish(version))  # several learners: a phase of no actor closes empty at once

    def expected_requests(self) -> int:
        """Requests that may arrive soon: every connected actor that is not held."""
        return max(1, len(self._live) - self.gate.held_count())

    def fail(self, error: BaseException, what: str = "serving the actors") -> str:
        """The learner's own code raised ``error`` while ``what`` (``ActorHandler.fail``, or the trainer thread's
        update): the first failure is logged with its traceback and ends the run (``on_failure``); every actor
        is refused with INTERNAL and ``failure`` from then on, not told that training is over. Returns it."""
        if self.failure is None:
            self.failure = str(RunFailed(error))
            log.error("%s failed; the run stops", what, exc_info=error)
            self.on_failure(error)
        return self.failure

    def finish(self) -> None:
        """Training is over: every held request is answered with 'training is over' (or ``failure``)."""
        self.finished = True
        if self.opponents is not None:
            self.opponents.finish()
        for session in self._live.values():
            session.cancel_wait()


def _mapping(agent_policies: dict[str, str], shown: int = 8) -> str:
    """"scout_0 -> a, scout_1 -> b, ..." (the first ``shown`` agents)."""
    pairs = [f"{agent} -> {policy}" for agent, policy in list(agent_policies.items())[:shown]]
    return ", ".join(pairs) + (", ..." if len(agent_policies) > shown else "")


class Session:
    """One actor's connection: records what its envs did and asks the gate and the backend for actions."""

    def __init__(self, sessions: Sessions, hello: HelloInfo) -> None:
        self.sessions = sessions
        self.member = hello.actor_id
        self.run_id = hello.run_id
        self.num_envs = hello.num_envs
        self.keys = noise.slot_keys(sessions.welcome.seed, hello.actor_id, hello.num_envs)
        self.counter = sessions.slot_counters.get(hello.actor_id, 0)  # continues across reconnects and resumes
        self.first_counter = self.counter
        self.unroll: Unroll | None = None
        self.last_step: int | None = None  # step of the unroll the last action was recorded at
        self.pending: tuple[Admission, np.ndarray] | None = None  # admitted, answered "no action" (Retry)
        # Each slot's policy state, kept here between requests (SEED's design; [k, 0] for a feedforward
        # policy). A new session (a new run id: an actor that started or reconnected) starts from zeros;
        # an episode's end resets it.
        self.state = np.zeros((self.num_envs, sessions.backend.state_size), np.float32)
        # per-env returns of a multi-agent env; an actor's first connection starts at its envs' reset
        agents = sessions.spec.agents
        groups = tuple(sessions.spec.policies.index(p) for p in sessions.spec.policy_of)  # each agent's policy
        self.teams = (TeamReturns(agents, self.num_envs, from_reset=self.counter == 0, groups=groups)
                      if sessions.teams is not None and self.num_envs % agents == 0 else None)
        self.replaced_by: str | None = None  # the connection that replaced this one: "run ID from PEER"
        spec = sessions.spec
        self._shapes = (spec.observation.shape, spec.observation.array_dtype,
                        spec.action.element_shape, spec.action.action_dtype)
        self._held: asyncio.Future | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        # since when (time.perf_counter) the learner waits for this actor's next step; None while it serves one
        self.owed_since: float | None = None
        # The step gaps, seconds from the learner's answer (the welcome first) to this actor's next step, that
        # the step deadline follows: the slowest recent one (each gap, or the one before decayed by GAP_DECAY,
        # whichever is longer); None until its first step.
        self.slowest_gap: float | None = None
        self._answered = time.perf_counter()
        self.evicted: str | None = None  # why the step deadline ended this session
        self._connection = asyncio.current_task()  # the task serving its connection: eviction ends it

    async def step(self, data: StepData) -> Reply | None:
        sessions = self.sessions
        gap = time.perf_counter() - self._answered  # this actor's own time: from the learner's answer to now
        slowest = GAP_DECAY * (self.slowest_gap or 0.0)
        self.slowest_gap = gap if gap > slowest else slowest
        self._check_replaced()
        if sessions.finished:
            return None
        if self.pending is None:
            check_action_mask(data.obs, sessions.spec.observation)  # the learner's spec knows the mask
            admission = await self._admit(data)
            self._check_replaced()
            if admission is None:
                return None
            counters = np.full(self.num_envs, self.counter, np.uint64)
            self.counter += 1
            sessions.slot_counters[self.member] = self.counter
            # the observation of a slot whose episode just ended starts a new one
            self.state = np.where((data.terminated | data.truncated)[:, None], np.float32(0), self.state)
        else:  # the step again, after the backend's "no action": served with the admission it holds
            (admission, counters), self.pending = self.pending, None
        state_in = self.state
        try:
            out = await sessions.backend.infer(self.member, data.obs, self.keys, counters, state_in)
        except Retry:
            self.pending = (admission, counters)
            self._check_replaced()
            self._answered = time.perf_counter()
            return Reply(None, admission.version)
        self._check_replaced()
        self.state = out.state
        if admission.step == 0:
            self.unroll = Unroll(self.member, self.num_envs, sessions.steps_per_phase, *self._shapes,
                                 initial_state=state_in)
        self.unroll.record_action(admission.step, data.obs, out.actions, out.logprobs, out.values,
                                  out.version if out.versions is None else out.versions)
        sessions.counters.transitions_collected += self.num_envs
        self.last_step = admission.step
        self._answered = time.perf_counter()
        return Reply(out.actions, out.version)

    def _check_replaced(self) -> None:
        if self.replaced_by is not None:
            raise Refused(FAILED_PRECONDITION,
                          f"actor {self.member}: this connection (run {self.run_id}) was replaced by a newer one "
                          f"with the same actor id ({self.replaced_by}); if two actors share --actor-id, "
                          "give each a distinct one")

    async def _admit(self, data: StepData) -> Admission | None:
        """Record the outcome of the previous action, then ask the gate (waiting while held)."""
        sessions = self.sessions
        if self.last_step is not None:
            # self.state: the slots' state after that step (reset below, once admitted), which the values of
            # truncated episodes' last observations are bootstrapped from
            self.unroll.record_outcome(self.last_step, data.reward, data.terminated, data.truncated,
                                       data.final_index, data.final_obs, self.state)
        if self.counter > self.first_counter:
            sessions.counters.collected_steps += self.num_envs
        # Key (step counter, actor id): the order a single process stepping every slot would see, whatever
        # order the messages arrive in. self.counter is the number of this actor's requests admitted so
        # far, so this message's episodes ended in the step with counter self.counter - 1.
        sessions.episodes.add(data.episode_return, data.episode_length, sessions.counters.collected_steps,
                              sessions.clock.wall_s, key=(self.counter, self.member))
        if self.teams is not None and self.counter > self.first_counter:  # the outcome of this session's step
            returns, lengths = self.teams.step(data.reward, data.terminated, data.truncated)
            sessions.teams.add(returns, lengths, sessions.counters.collected_steps, sessions.clock.wall_s,
                               key=(self.counter, self.member))
            for g, tracker in enumerate(sessions.policy_returns.values()):
                tracker.add(self.teams.last_per_agent[:, g], lengths,
                            sessions.counters.collected_steps, sessions.clock.wall_s, key=(self.counter, self.member))

        self._loop = asyncio.get_running_loop()  # where _release sends the admission
        result = sessions.gate.request(self.member, self._release)
        if result.completed is not None:
            self.unroll.finish(data.obs, self.state)
            sessions.phases.add(result.completed, self.unroll)
            self.unroll, self.last_step = None, None
        if result.closed:
            sessions.phases.close(result.closed)
        if result.admission is not None:
            return result.admission
        # Held. The gate calls _release later, from whichever thread publishes; its call reaches the
        # loop after this coroutine has yielded, so the future exists by then.
        future = self._held = self._loop.create_future()
        since = time.perf_counter() if sessions.clock.started else None
        try:
            admission = await future
        finally:
            self._held = None
            if since is not None:
                sessions.counters.actors_held_s += time.perf_counter() - since
        if admission is not None:
            sessions.releases.resumed(admission.version)
        return admission

    def _release(self, admission: Admission) -> None:
        """The gate admits the held request (any thread)."""
        self._loop.call_soon_threadsafe(self._resume, admission)

    def _resume(self, admission: Admission) -> None:
        if self._held is not None and not self._held.done():
            self._held.set_result(admission)

    def cancel_wait(self) -> None:
        """The session or the training ended while one of its requests was held: wake it so it can say why."""
        if self._held is not None and not self._held.done():
            self._held.set_result(None)

    def end_connection(self) -> None:
        """End the connection of an evicted session (its connection loop tells the actor ``evicted``)."""
        if self._connection is not None:
            self._connection.cancel()

    def drop_unfinished(self) -> int:
        """Discard the unroll this actor had not finished; return the transitions dropped."""
        dropped = 0 if self.unroll is None else self.unroll.steps_acted * self.num_envs
        self.sessions.counters.dropped_transitions += dropped
        self.unroll, self.last_step = None, None
        return dropped

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.sessions.disconnect(self)

