"""The search: breadth-first over every reachable state, then liveness over the explored graph."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from lockstep.sync.gate import AdmissionGate
from lockstep_verify.freeze import describe_gate, gate_key
from lockstep_verify.model import Config, Model
from lockstep_verify.state import COOPERATIVE, Event, Finding, Status, World
from lockstep_verify.symmetry import Asymmetric, canonical_key


@dataclass(frozen=True)
class Violation:
    """A property found violated, with the events that lead there from the initial state."""

    prop: str  # safety | lag | deadlock | liveness | progress
    message: str
    events: tuple[Event, ...]  # BFS: a shortest such trace
    trace: tuple[str, ...]  # the same events, labelled with what the gate answered

    def format(self) -> str:
        lines = [f"[{self.prop}] {self.message}", f"  trace ({len(self.trace)} events):"]
        lines += [f"    {i + 1:3d}. {e}" for i, e in enumerate(self.trace)]
        return "\n".join(lines)


@dataclass
class Report:
    """What a :func:`check` explored and found."""

    config: dict[str, Any]  # the Config's fields, and ``symmetry``
    states: int = 0
    transitions: int = 0
    seconds: float = 0.0
    finished_states: int = 0  # terminal: the run is finished
    abandoned_states: int = 0  # terminal: every actor gone for good
    max_depth: int = 0
    complete: bool = True  # False if the search stopped early (max_states, stop_on_violation)
    violations: list[Violation] = field(default_factory=list)  # the first of each kind of finding
    violation_count: int = 0  # every violating transition or state, kept or not

    @property
    def ok(self) -> bool:
        return self.complete and not self.violations

    def result(self) -> str:
        if self.violations:
            return "VIOLATED: " + ", ".join(sorted({v.prop for v in self.violations}))
        return "ok" if self.complete else "incomplete (max_states)"

    def format(self) -> str:
        head = (f"{config_name(self.config)}: {self.states} states, {self.transitions} transitions, "
                f"depth {self.max_depth}, {self.seconds:.2f}s -> {self.result()}")
        return "\n".join([head] + [v.format() for v in self.violations])


def config_name(c: dict[str, Any]) -> str:
    """A configuration (a Report's ``config``) in words, as the table prints it."""
    mode = "strict" if c["max_lag"] == 0 else f"pipelined K={c['max_lag']}"
    disc = f"leave, {c['reconnects']} rejoin" if c["disconnects"] else "no leave"
    extra = "".join([f", min_members {c['min_members']}" if c["min_members"] != 1 else "",
                     f", cutoff {c['cutoff']} min_unroll {c['min_unroll']}" if c.get("cutoff") is not None else "",
                     f", start v{c['start_version']}" if c.get("start_version") else "",
                     f", weights {list(c['weights'])}" if c.get("weights") else "",
                     "" if c.get("exact_stamps", True) else ", stamps at inference",
                     ", symmetry" if c.get("symmetry") else ""])
    return f"{mode}, {c['actors']} actors, T={c['steps']}, {c['versions']} versions, {disc}{extra}"


def replay(events: Sequence[tuple[str, int]], gate_factory: Callable[..., Any] = AdmissionGate,
           **config: Any) -> list[tuple[str, list[Finding]]]:
    """Take ``events`` from the initial state of the model ``config`` (the fields of :class:`Config`).

    Returns [(label, findings)], one per event, each label saying what happened;
    raises ValueError if an event is not enabled where it is taken.
    """
    model = Model(Config(**config), gate_factory)
    gate, world = model.initial()
    out: list[tuple[str, list[Finding]]] = []
    for e in events:
        event = Event(*e)
        if event not in model.enabled(world):
            raise ValueError(f"event {tuple(e)} is not enabled after {[label for label, _ in out]}")
        gate, world, label, findings = model.apply(gate, world, event, verbose=True)
        out.append((label, findings))
    return out


def check(actors: int = 2, steps: int = 2, versions: int = 3, max_lag: int = 0, disconnects: bool = True,
          reconnects: int = 1, min_members: int = 1, gate_factory: Callable[..., Any] = AdmissionGate,
          exact_stamps: bool = True, symmetry: bool = False, cutoff: float | None = None,
          min_unroll: float = 0.0, start_version: int = 0, weights: Sequence[int] | None = None,
          stop_on_violation: bool = False, max_states: int = 3_000_000) -> Report:
    """Explore every interleaving of the model around ``gate_factory(steps, min_members, max_lag)``.

    ``cutoff``, ``min_unroll`` and ``start_version`` are passed on to the gate, and
    ``weights`` (one per actor) to ``join``, when set. Returns a :class:`Report`;
    ``report.violations`` holds the first violation found of each kind (BFS: along a
    shortest trace).
    """
    config = Config(actors=actors, steps=steps, versions=versions, max_lag=max_lag, disconnects=disconnects,
                    reconnects=reconnects if disconnects else 0, min_members=min_members, exact_stamps=exact_stamps,
                    cutoff=cutoff, min_unroll=min_unroll, start_version=start_version,
                    weights=None if weights is None else tuple(weights))
    search = _Search(Model(config, gate_factory), symmetry)
    with _collector_paused():
        search.run(stop_on_violation, max_states)
    return search.report


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Pause automatic garbage collection (if it is on) for the duration of a search.

    The search keeps every state it finds alive: hundreds of thousands of named tuples,
    which the collector never untracks (it untracks only plain tuples of scalars), so
    its passes over them would cost a quarter of the search's time. The search makes
    next to no reference cycles; whatever it leaves is collected after it.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class _Search:
    """The explored graph: states numbered in the order BFS finds them, with how each was first reached."""

    def __init__(self, model: Model, symmetry: bool) -> None:
        self.model = model
        self.symmetry = symmetry
        self.report = Report(dict(dataclasses.asdict(model.config), symmetry=symmetry))
        self.index: dict[tuple, int] = {}  # state key -> state number
        self.parent: list[int] = []
        self.via: list[Event | None] = []  # the event that first reached each state
        self.depth: list[int] = []
        self.worlds: list[World] = []
        self.started: list[bool] = []  # per expanded state: has the gate started?
        # The cooperative transitions (request, infer, train, publish), for liveness.
        self.coop_src: list[int] = []
        self.coop_dst: list[int] = []
        # States with a violating cooperative transition: liveness does not hold them
        # responsible for what lies beyond (it is not explored).
        self.cut_short: set[int] = set()
        self.seen_kinds: set[tuple[str, str]] = set()

    def key(self, gate: Any, world: World) -> tuple:
        """The state's dictionary key: up to renaming actors with ``symmetry``, where that applies."""
        if self.symmetry:
            try:
                return canonical_key(gate, world, self.model.index, self.model.config.weights)
            except Asymmetric:
                pass
        return gate_key(gate), world

    def path(self, i: int) -> tuple[Event, ...]:
        """The events from the initial state to state ``i`` (a shortest path)."""
        out = []
        while i > 0:
            out.append(self.via[i])
            i = self.parent[i]
        return tuple(reversed(out))

    def record(self, prop: str, message: str, events: tuple[Event, ...]) -> None:
        """Count a violation; keep the first of each kind (its message with numbers and details left out)."""
        self.report.violation_count += 1
        kind = (prop, "".join(c for c in message.split("(")[0] if not c.isdigit()))
        if kind not in self.seen_kinds:
            self.seen_kinds.add(kind)
            labels = [label for label, _ in replay(events, self.model.gate_factory,
                                                   **dataclasses.asdict(self.model.config))]
            self.report.violations.append(Violation(prop, message, events, tuple(labels)))

    def run(self, stop_on_violation: bool, max_states: int) -> None:
        t0 = time.perf_counter()
        report, model = self.report, self.model
        gate0, world0 = model.initial()
        self.index[self.key(gate0, world0)] = 0
        self.parent.append(-1)
        self.via.append(None)
        self.depth.append(0)
        self.worlds.append(world0)
        frontier: deque[tuple[int, Any]] = deque([(0, gate0)])
        while frontier:
            i, gate = frontier.popleft()
            world = self.worlds[i]
            self.started.append(bool(getattr(gate, "started", True)))  # BFS expands states in number order
            events = model.enabled(world)
            self.check_state(i, gate, world, events)
            if stop_on_violation and report.violations:
                report.complete = False
                break
            for event in events:
                gate2, world2, _, findings = model.apply(gate, world, event)
                report.transitions += 1
                if findings:
                    for prop, message in findings:
                        self.record(prop, message, self.path(i) + (event,))
                    if event.kind in COOPERATIVE:
                        self.cut_short.add(i)
                    if stop_on_violation:
                        report.complete = False
                        frontier.clear()
                        break
                    continue  # not explored past a violation
                key = self.key(gate2, world2)
                j = self.index.get(key)
                if j is None:
                    j = len(self.worlds)
                    if j >= max_states:
                        report.complete = False
                        frontier.clear()
                        break
                    self.index[key] = j
                    self.parent.append(i)
                    self.via.append(event)
                    self.depth.append(self.depth[i] + 1)
                    self.worlds.append(world2)
                    frontier.append((j, gate2))
                if event.kind in COOPERATIVE:
                    self.coop_src.append(i)
                    self.coop_dst.append(j)
        report.states = len(self.worlds)
        report.max_depth = max(self.depth)
        if report.complete:
            self.check_liveness()
        report.seconds = time.perf_counter() - t0

    def check_state(self, i: int, gate: Any, world: World, events: list[Event]) -> None:
        """Deadlock: a terminal state other than finished or abandoned, or every live actor held for good."""
        if not events:
            if world.finished:
                self.report.finished_states += 1
            elif (all(s.status == Status.OUT and s.joins_left == 0 for s in world.actors)
                  and not world.queue and world.pending is None):
                self.report.abandoned_states += 1
            else:
                self.record("deadlock", f"no event is enabled and the run is not finished ({world.describe()}; "
                                        f"{describe_gate(gate)})", self.path(i))
        elif not world.finished and self.started[i] and world.pending is None and not world.queue:
            live = [s.status for s in world.actors if s.status != Status.OUT]
            if live and all(s == Status.HELD for s in live):
                self.record("deadlock", f"every live actor is held and the trainer has nothing to do "
                                        f"({describe_gate(gate)})", self.path(i))

    def check_liveness(self) -> None:
        """Liveness and progress: backward reachability over the cooperative transitions."""
        worlds, started, n = self.worlds, self.started, len(self.worlds)
        preds: list[list[int]] = [[] for _ in range(n)]
        for s, d in zip(self.coop_src, self.coop_dst):
            preds[d].append(s)

        def can_reach(goal: list[bool]) -> list[bool]:
            """For each state: can the cooperative transitions lead it to a goal state?"""
            seen = list(goal)
            stack = [k for k in range(n) if goal[k]]
            while stack:
                d = stack.pop()
                for s in preds[d]:
                    if not seen[s]:
                        seen[s] = True
                        stack.append(s)
            return seen

        def held(k: int) -> list[str]:
            return [f"A{a}" for a, s in enumerate(worlds[k].actors) if s.status == Status.HELD]

        # Held requests: waiting for min_members before the gate starts is by design.
        no_one_held = [worlds[k].finished or not started[k] or k in self.cut_short or not held(k) for k in range(n)]
        ok = can_reach(no_one_held)
        bad = next((k for k in range(n) if not ok[k]), None)  # the smallest number is a shallowest state
        if bad is not None:
            self.record("liveness", f"after this trace no sequence of request/infer/train/publish releases "
                                    f"{', '.join(held(bad))} ({worlds[bad].describe()})", self.path(bad))
        finished = [worlds[k].finished or k in self.cut_short for k in range(n)]
        ok = can_reach(finished)
        bad = next((k for k in range(n) if not ok[k] and started[k]
                    and any(s.status != Status.OUT for s in worlds[k].actors)), None)
        if bad is not None:
            self.record("progress", f"after this trace the actors that stay can never finish the run "
                                    f"({worlds[bad].describe()})", self.path(bad))
