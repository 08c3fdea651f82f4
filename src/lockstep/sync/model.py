"""An exhaustive explicit-state model checker for the admission gate (``gate.py``).

The checker drives the *real* :class:`~lockstep.sync.gate.AdmissionGate` (or a
subclass: any ``factory(steps_per_phase, min_members, max_lag, **options)``)
through every interleaving of the events of a small system laid out like the
learner, and checks the protocol's properties on every transition and every
reachable state. The gate
never blocks -- ``request`` admits or holds, and a held request's ``release`` is
called later from ``join``, ``leave`` or ``publish`` -- so one event is one gate call
and the reachable states form a finite graph that breadth-first search enumerates.

The system
    actors   N of them, each a state machine
                 out --join--> ready --request--> admitted --infer--> ready --request--> ...
                                          \\--> held --(release)--> admitted
             ``infer`` is an event of its own, taken any time after the admission
             and before the actor's next request; it stamps the sample with the
             version inference uses *at that moment* (the learner's snapshot), so a
             publish may fall between an admission and its inference. With
             ``disconnects`` an actor may ``leave`` in any joined state (ready, held,
             admitted) and join again, as the same member, up to ``reconnects``
             times.
    learner  keeps each actor's current unroll (begun by an admission of step 0, as
             ``learner._Session`` does), files it as complete when a request
             returns ``completed``, and assembles a phase's batch when the gate
             closes it, from the complete unrolls of ``ClosedPhase.members``.
    trainer  ``train`` takes the oldest closed phase u, checks its batch, and swaps
             the inference snapshot to version u + 1; ``publish`` then calls
             ``gate.publish(u + 1)``. They are two events, as in the learner
             (snapshot first, then the gate), so inference may already run on u + 1
             before the gate has heard of it. Training phase ``versions - 1``
             finishes the run (no publish); this bounds the state space.

A state is the gate's internal state frozen into a hashable tuple -- started,
published, next_close, members as (member, phase, steps, first_phase), held members
with their callbacks, open phases with the members that completed them, and any
other attribute a gate grows, frozen generically -- plus the environment's state
(actors, complete unrolls, the trainer's queue and versions). The gate object is
cloned for each transition (its lock replaced by a fresh one). BFS with a visited
set gives shortest counterexamples; a violating transition is reported with its
trace and not explored further.

Options
    symmetry      actors are interchangeable (the gate uses member ids only as dict
                  keys and to order its answers), so states equal up to renaming
                  actors are one state: up to N! fewer. The canonical form
                  attributes to each member everything in the gate that names it
                  (members are the strings "A0", "A1", ..., so names can be told from
                  numbers) and falls back to the plain key for any shape it cannot
                  attribute; actors with different ``weights`` are never merged.
    exact_stamps  True: each sample keeps its stamp until the trainer checks it.
                  False: the stamp is checked at inference against the sample's
                  phase (which is the version that will train it: the structural
                  checks below tie the unroll's phase, the completed phase, the
                  closed phase and the trained version together) and then dropped
                  from the state; the trainer still checks each unroll's phase and
                  steps. Stamps are write-only data, so this merges only states whose
                  futures are the same; it cuts K=2 from 10^6 states to 5*10^4.
    cutoff, min_unroll, start_version, weights
                  passed on to the gate (``weights`` to ``join``): the straggler
                  cut-off then allows an unroll of ceil(min_unroll*T)..T steps.
    stop_on_violation, max_states
                  end the search early (the report is then not ``complete``).

Properties (``Violation.prop``)
    safety    on every transition:
              * every sample trained by version u was produced by a version in
                [u - max_lag, u] (strict: exactly u); every admission for phase u
                carries the published version, and it lies in [u - max_lag, u];
              * each member contributes exactly T samples, steps 0..T-1 once each
                (with the cut-off: a prefix of at least ceil(min_unroll*T)), to
                each closed phase it is in; a complete unroll is never lost (a
                closed phase's members are exactly the members with a complete
                unroll of it); nothing is admitted into, or completed in, a phase
                already closed; a member is never admitted again into a phase it has
                completed; a phase never closes while a live member's unroll of it
                is unfinished; an admission continues the member's unroll (step 0
                only after the last one completed);
              * phases close in order, each once; the trainer gets them in order;
              * ``release`` is called at most once per held request, and only while
                that request is held (never after its member left);
              * strict mode: nothing is admitted between the close of phase v and
                ``publish(v + 1)``;
              * ``leave`` reports as dropped exactly the steps of the unfinished unroll;
              * the gate raises nothing.
    lag       at inference: 0 <= phase - stamp <= max_lag (pipelined: lag <= K).
    deadlock  no reachable state, unfinished, with the gate started, where every
              live actor (at least one) is held and the trainer has nothing to
              train or publish; no terminal state but "finished" and "abandoned"
              (no actor joined, none may join again).
    liveness  of held requests: from every reachable state, the actors that stay
              (events request, infer, train, publish: nobody joins or leaves)
              reach a state where no live actor is held, or the run is finished, or
              the gate has not started (waiting for ``min_members`` is by design).
              Backward reachability over the explored graph. (With joins and leaves
              allowed it would hold trivially: everyone can leave.)
    progress  from every reachable state where the gate has started and some actor
              is joined, those same events can finish the run.

Sizes and times (``python -m lockstep.sync.model`` prints this table for
``STANDARD``; one core of a shared 2-core VM, CPython 3.11, load ~2; T=2 and
min_members 1 unless noted; "rejoin" = reconnects per actor; every row "ok" for
gate.py as of this writing):

    config                                                 states  transitions    s
    strict, 2 actors, 3 versions, rejoin 1                   3463        11060   0.2
    strict, 2 actors, 3 versions, rejoin 1, min_members 2    1992         6275   0.1
    strict, 2 actors, 3 versions, rejoin 2, sym              4237        13816   0.2
    strict, 3 actors, 3 versions, rejoin 1, sym, st@inf     23093       110206   2.6
    pipelined K=1, 2 actors, 3 versions, rejoin 1, sym      42611       164782   4.1
    pipelined K=1, 2 actors, 3 versions, rejoin 0, sym       5412        19256   0.5
    pipelined K=1, 2 actors, 3 versions, no leave            7628        16247   0.4
    pipelined K=2, 2 actors, 3 versions, rejoin 1, sym, st@inf  47490   172327   4.4
    pipelined K=2, 2 actors, 3 versions, rejoin 0, sym, st@inf   4588    15185   0.3
    pipelined K=1, 3 actors, 2 versions, rejoin 0, sym, st@inf   9421    41286   1.0
    strict, cutoff 0.6, weights (2, 1), rejoin 1             6494        20286   0.4
    pipelined K=1, cutoff 0.6, weights (2, 1), st@inf        4825        14761   0.3
    strict, 3 actors, T=3, 2 versions, cutoff 0.5, min_unroll 0.5, sym, st@inf
                                                             2075         8967   0.2
    ("sym" = symmetry, "st@inf" = exact_stamps=False.) Run once by hand, also ok:
    pipelined K=1, 2 actors, rejoin 1, no reductions          84724 states     16 s
    pipelined K=2, 2 actors, rejoin 1, sym, exact stamps     990384 states    390 s
    pipelined K=2, 2 actors, T=1, 5 versions, rejoin 2, sym  959392 states    170 s
    pipelined K=1, 3 actors, 3 versions, rejoin 1, sym, st@inf 327883 states  130 s
    pipelined K=1, 2 actors, T=3, 4 versions, rejoin 2, sym, st@inf 87071     9 s
    strict, 3 actors, 3 versions, rejoin 2, sym, st@inf       79438 states     12 s
    pipelined K=1, 3 actors, 2 versions, rejoin 1, cutoff 0.6, weights (2, 1, 1),
        sym, st@inf                                           764581 states    150 s

History: the checker found the rejoin bug in an earlier gate.py -- in pipelined
mode a member that completed phase u+1 while phase u was still collecting, then
left and rejoined, was put back into phase u+1 (``_joining_phase`` looked only at
the phases of present members) and collected it a second time: 2T admissions in
one phase, the first unroll silently replaced. Shortest trace (K=1, 11 events):
A0 joins and takes step 0 of phase 0; A1 joins (into phase 1), takes its two
steps, completes phase 1 (held for phase 2), leaves, rejoins, and is admitted as
step 0 of phase 1 again. gate.py now counts phases with complete unrolls in
``_joining_phase`` (and closes an abandoned phase that such a phase waits beyond);
tests/test_sync_model.py keeps the old rule as a planted bug.

tests/test_sync_model.py runs the smaller configurations above (about 25 s on one
core), and checks that planted bugs are caught with a (shortest) trace: a gate
ignoring max_lag, one closing a phase too early, one never closing an abandoned
phase, one keeping a held request after its member left, one releasing twice, one
whose publish releases nobody, one cutting stragglers below min_unroll, and the
old rejoin rule.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lockstep.sync.gate import AdmissionGate

OUT, READY, HELD, ADMITTED = 0, 1, 2, 3
_STATUS = {OUT: "out", READY: "ready", HELD: "held", ADMITTED: "admitted"}
_COOPERATIVE = frozenset({"request", "infer", "train", "publish"})  # the events of actors that stay

_LockType = type(threading.Lock())
_RLockType = type(threading.RLock())

Event = tuple[str, int]  # (kind, actor); actor -1 for the trainer's events


# -----------------------------------------------------------------------------------
# Report
# -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    prop: str  # safety | lag | deadlock | liveness | progress
    message: str
    events: tuple[Event, ...]  # from the initial state (BFS: a shortest such trace)
    trace: tuple[str, ...]  # the same events, labelled with what the gate answered

    def format(self) -> str:
        lines = [f"[{self.prop}] {self.message}", f"  trace ({len(self.trace)} events):"]
        lines += [f"    {i + 1:3d}. {e}" for i, e in enumerate(self.trace)]
        return "\n".join(lines)


@dataclass
class Report:
    config: dict[str, Any]
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
    mode = "strict" if c["max_lag"] == 0 else f"pipelined K={c['max_lag']}"
    disc = f"leave, {c['reconnects']} rejoin" if c["disconnects"] else "no leave"
    extra = "".join([f", min_members {c['min_members']}" if c["min_members"] != 1 else "",
                     f", cutoff {c['cutoff']} min_unroll {c['min_unroll']}" if c.get("cutoff") is not None else "",
                     f", start v{c['start_version']}" if c.get("start_version") else "",
                     f", weights {list(c['weights'])}" if c.get("weights") else "",
                     "" if c.get("exact_stamps", True) else ", stamps at inference",
                     ", symmetry" if c.get("symmetry") else ""])
    return f"{mode}, {c['actors']} actors, T={c['steps']}, {c['versions']} versions, {disc}{extra}"


# -----------------------------------------------------------------------------------
# Cloning and freezing the gate
# -----------------------------------------------------------------------------------
#
# Nothing here depends on the gate's attribute names: the gate is cloned and frozen
# by the shape of what it holds (dicts, sets, lists, plain objects, scalars), so the
# checker keeps working as gate.py grows. Members are named "A0", "A1", ... (strings,
# so that anything in the gate that names a member can be told from a phase or a
# count: symmetry reduction relies on it).


class _Release:
    """A held request's callback: it records its calls in the model's sink.

    Identity tells held requests apart (a stale callback is another object);
    equality and hash are (actor, session), so frozen states stay canonical.
    """

    __slots__ = ("actor", "session", "sink")

    def __init__(self, actor: int, session: int, sink: list) -> None:
        self.actor, self.session, self.sink = actor, session, sink

    def __call__(self, admission: Any) -> None:
        self.sink.append((self, admission))

    def __copy__(self) -> _Release:
        return self

    def __deepcopy__(self, memo: dict) -> _Release:
        return self

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Release) and (self.actor, self.session) == (other.actor, other.session)

    def __lt__(self, other: _Release) -> bool:
        return (self.actor, self.session) < (other.actor, other.session)

    def __hash__(self) -> int:
        return hash((self.actor, self.session))

    def __repr__(self) -> str:
        return f"release(A{self.actor}#{self.session})"


_SCALARS = frozenset({int, float, bool, type(None)})
_ATOMIC = frozenset({int, float, str, bool, type(None), bytes, _Release})
_LOCKS = frozenset({_LockType, _RLockType})


def _clone(v: Any) -> Any:
    """A deep copy of gate state: containers and plain objects copied, locks renewed, callbacks kept."""
    t = type(v)
    if t in _ATOMIC or t is tuple or t is frozenset:
        return v
    if t is dict:
        return {k: x if type(x) in _ATOMIC else _clone(x) for k, x in v.items()}
    if t is set:
        return set(v)
    if t is list:
        return [_clone(x) for x in v]
    kind = _KIND.get(t)
    if kind is None:
        kind = _KIND[t] = _kind(t, v)
    if kind == "object":
        new = object.__new__(t)
        new.__dict__.update({k: x if type(x) in _ATOMIC else _clone(x) for k, x in v.__dict__.items()})
        return new
    if kind == "immutable":
        return v
    if t is _LockType:
        return threading.Lock()
    if t is _RLockType:
        return threading.RLock()
    return copy.deepcopy(v)


_KIND: dict[type, str] = {}


def _kind(t: type, v: Any) -> str:
    if dataclasses.is_dataclass(t) and t.__dataclass_params__.frozen:
        return "immutable"
    if getattr(v, "__dict__", None) is not None and not callable(v) and not hasattr(t, "__slots__"):
        return "object"
    return "other"


def clone_gate(gate: Any) -> Any:
    """A copy of ``gate`` that shares nothing mutable with it (fresh locks; callbacks are kept)."""
    new = object.__new__(type(gate))
    new.__dict__.update({k: x if type(x) in _ATOMIC else _clone(x) for k, x in gate.__dict__.items()})
    return new


def _freeze(v: Any) -> Any:
    """A hashable, canonical image of a value: dicts and sets sorted, objects by their attributes."""
    t = type(v)
    if t in _ATOMIC:
        return v
    if t is dict:
        items = [(k, x if type(x) in _ATOMIC else _freeze(x)) for k, x in v.items()]
        return ("{}",) + tuple(_sorted(items))
    if t is set or t is frozenset:
        return ("set",) + tuple(_sorted([x if type(x) in _ATOMIC else _freeze(x) for x in v]))
    if t is list or t is tuple:
        return tuple(_freeze(x) for x in v)
    if t in _LOCKS:
        return None
    d = getattr(v, "__dict__", None)
    if d is not None and not callable(v):
        return (t.__name__,) + tuple((k, x if type(x) in _ATOMIC else _freeze(x)) for k, x in d.items())
    return repr(v)


def _sorted(items: list) -> list:
    try:
        return sorted(items)
    except TypeError:
        return sorted(items, key=repr)


def gate_key(gate: Any) -> tuple:
    """The gate's internal state as a hashable tuple: every attribute but its locks, frozen.

    For AdmissionGate: started, published, next_close, members with their phase,
    steps, first phase (and budget, weight), held members with their callbacks, open
    phases with the members that completed them; plus the constants.
    """
    return tuple((k, x if type(x) in _ATOMIC else _freeze(x)) for k, x in gate.__dict__.items()
                 if type(x) not in _LOCKS)


class _Asymmetric(Exception):
    """The gate holds a member's name somewhere the canonical form cannot attribute it."""


def _plain(v: Any) -> Any:
    """Freeze a value that must not name a member (a callback stands for its session)."""
    t = type(v)
    if t in _SCALARS:
        return v
    if t is _Release:
        return ("release", v.session)
    d = getattr(v, "__dict__", None)
    if d is not None and all(type(x) in _SCALARS for x in d.values()) and not callable(v):
        return (t.__name__,) + tuple(d.items())  # a plain record of numbers: names nobody
    if _names_a_member(v):
        raise _Asymmetric(v)
    return _freeze(v)


def _names_a_member(v: Any) -> bool:
    t = type(v)
    if t is str:
        return True
    if t in _SCALARS or t is _Release or t in _LOCKS:
        return False
    if t is dict:
        return any(_names_a_member(k) or _names_a_member(x) for k, x in v.items())
    if t in (set, frozenset, list, tuple):
        return any(_names_a_member(x) for x in v)
    d = getattr(v, "__dict__", None)
    if d is not None and not callable(v):
        return any(_names_a_member(x) for x in d.values())
    return True  # unknown: assume it may


def _canonical(gate: Any, env: tuple, index: dict[str, int], weights: tuple[int, ...] | None) -> tuple:
    """The state's key up to renaming actors: a global part and the sorted per-actor parts.

    Everything that names a member -- a key of a dict of the gate (its entry, its held
    callback), a key or element of a dict or set inside one of the gate's objects (the
    phases it completed), the environment's entries for it -- is attributed to that
    member; two states get the same key exactly when one is the other with actors
    renamed. Raises _Asymmetric for shapes it cannot attribute (the caller then uses
    the plain key).
    """
    mine: list[list[Any]] = [[] for _ in env[_ACT]]
    glob: list[Any] = []
    for k, x in gate.__dict__.items():
        t = type(x)
        if t in _SCALARS:
            glob.append(x)
        elif t in _LOCKS:
            continue
        elif t is dict:
            others = []
            for key, v in x.items():
                if type(key) is str:
                    mine[_actor(key, index)].append((k, _plain(v)))
                elif type(key) in _SCALARS:
                    others.append((key, _parts(k, key, v, mine, index)))
                else:
                    raise _Asymmetric(key)
            glob.append((k, tuple(_sorted(others))))
        elif t is set or t is frozenset:
            for m in x:
                mine[_actor(m, index)].append((k,))
        else:
            glob.append((k, _plain(x)))
    for (u, a), samples in env[_COMPLETED]:
        mine[a].append(("completed", u, samples))
    for qi, (u, batch) in enumerate(env[_QUEUE]):
        for e in batch:
            mine[e[0]].append(("queue", qi, e[1:]))
    sigs = []
    for a, (status, jl, unroll, adm, tok) in enumerate(env[_ACT]):
        sigs.append(((weights[a] if weights else 1, status, jl, unroll or (), adm or (),
                      -1 if tok is None else tok.session),) + tuple(_sorted(mine[a])))
    return (("sym",) + tuple(glob) + (tuple(u for u, _ in env[_QUEUE]),)
            + env[_CLOSED_NEXT:] + tuple(_sorted(sigs)))


def _actor(name: Any, index: dict[str, int]) -> int:
    a = index.get(name) if type(name) is str else None
    if a is None:
        raise _Asymmetric(name)
    return a


def _parts(attr: str, key: Any, obj: Any, mine: list[list[Any]], index: dict[str, int]) -> Any:
    """An object kept under a non-member key (a phase): attribute its member-keyed parts."""
    d = getattr(obj, "__dict__", None)
    if d is None or callable(obj):
        return _plain(obj)
    out = []
    for f, v in d.items():
        t = type(v)
        if t is dict and all(type(m) is str for m in v):
            for m, w in v.items():
                mine[_actor(m, index)].append((attr, key, f, _plain(w)))
            out.append((f, "{}"))
        elif (t is set or t is frozenset) and all(type(m) is str for m in v):
            for m in v:
                mine[_actor(m, index)].append((attr, key, f))
            out.append((f, "set"))
        else:
            out.append((f, _plain(v)))
    return tuple(out)


def describe_gate(gate: Any) -> str:
    def show(v: Any) -> str:
        d = getattr(v, "__dict__", None)
        if d is not None and not callable(v):
            return "(" + " ".join(f"{k}={show(x)}" for k, x in d.items()) + ")"
        if type(v) is dict:
            items = sorted(v.items(), key=lambda i: repr(i[0]))
            return "{" + ", ".join(f"{show(k)}: {show(x)}" for k, x in items) + "}"
        if type(v) in (set, frozenset):
            return "{" + ", ".join(sorted(map(show, v))) + "}"
        return str(v)

    return "gate: " + " ".join(f"{k.lstrip('_')}={show(x)}" for k, x in gate.__dict__.items()
                               if type(x) not in _LOCKS and k not in _CONSTANTS)


_CONSTANTS = frozenset({"steps_per_phase", "min_members", "max_lag", "cutoff", "min_cut_steps"})


# -----------------------------------------------------------------------------------
# The environment
# -----------------------------------------------------------------------------------
#
# Env is a tuple:
#   actors       tuple of (status, joins_left, unroll, admission, token), one per actor
#                  unroll     None or (phase, ((step, stamp), ...)): the current unroll
#                             (stamp None when exact_stamps is off)
#                  admission  None or (version, step, phase): admitted, not inferred yet
#                  token      the _Release of the held request (status HELD), else None
#   completed    tuple of ((phase, member), samples), sorted: complete unrolls of open phases
#   queue        tuple of (phase, ((member, phase, samples), ...)): closed, not yet trained
#   closed_next  the next phase expected to close
#   published    the version last published to the gate
#   snapshot     the version inference uses (swapped before publish)
#   pending      the version to publish next, or None
#   trained      the next phase to train
#   finished     the run is over

_ACT, _COMPLETED, _QUEUE, _CLOSED_NEXT, _PUBLISHED, _SNAPSHOT, _PENDING, _TRAINED, _FINISHED = range(9)


def _first(x: tuple) -> Any:
    return x[0]


class _Step:
    """One transition being computed: a mutable copy of the env, its violations and notes."""

    def __init__(self, model: _Model, env: tuple, verbose: bool) -> None:
        self.m = model
        self.actors = list(env[_ACT])
        self.completed = list(env[_COMPLETED])
        self.queue = list(env[_QUEUE])
        self.closed_next, self.published, self.snapshot, self.pending, self.trained, self.finished = env[3:]
        self.violations: list[tuple[str, str]] = []
        self.notes: list[str] | None = [] if verbose else None

    def bad(self, prop: str, message: str) -> None:
        self.violations.append((prop, message))

    def note(self, text: str) -> None:
        if self.notes is not None:
            self.notes.append(text)

    def env(self) -> tuple:
        return (tuple(self.actors), tuple(sorted(self.completed, key=_first)), tuple(self.queue),
                self.closed_next, self.published, self.snapshot, self.pending, self.trained, self.finished)

    # -- what the learner does with the gate's answers -----------------------------

    def admit(self, a: int, adm: Any, how: str) -> None:
        m = self.m
        _, jl, unroll, _, _ = self.actors[a]
        version, step, phase = adm.version, adm.step, adm.phase
        if self.notes is not None:
            self.note(f"{how} A{a} (v{version}, phase {phase}, step {step})")
        if phase < self.closed_next:
            self.bad("safety", f"A{a} admitted into phase {phase}, which is already closed: "
                               f"its sample is never trained")
        if not phase - m.max_lag <= version <= phase:
            self.bad("safety", f"A{a} admitted for phase {phase} with version {version}, "
                               f"outside [{phase - m.max_lag}, {phase}] (max_lag {m.max_lag})")
        if version != self.published:
            self.bad("safety", f"A{a} admitted with version {version}, but version {self.published} is published")
        if m.max_lag == 0 and self.closed_next > self.published:
            self.bad("safety", f"strict mode: A{a} admitted between the close of phase {self.closed_next - 1} "
                               f"and publish({self.closed_next})")
        for k, _ in self.completed:
            if k == (phase, a):
                self.bad("safety", f"A{a} admitted again into phase {phase}, which it has already completed "
                                   f"(it would contribute more than T={m.steps} samples)")
        if not 0 <= step < m.steps:
            self.bad("safety", f"A{a} admitted as step {step}, outside 0..{m.steps - 1}")
        if step == 0:
            if unroll is not None:
                self.bad("safety", f"A{a} admitted as step 0 of phase {phase} while its unroll of phase "
                                   f"{unroll[0]} ({len(unroll[1])} steps) is unfinished")
            unroll = (phase, ())
        elif unroll is None or unroll[0] != phase or len(unroll[1]) != step:
            self.bad("safety", f"A{a} admitted as step {step} of phase {phase}, but its unroll is {unroll}")
        self.actors[a] = (ADMITTED, jl, unroll, (version, step, phase), None)

    def unroll_problem(self, samples: tuple) -> str | None:
        """Why a complete unroll's steps are wrong (T steps 0..T-1; with the cut-off, a prefix of them)."""
        m = self.m
        steps = tuple(s for s, _ in samples)
        if steps == tuple(range(m.steps)):
            return None
        if m.cutoff is not None and m.min_cut_steps <= len(steps) < m.steps and steps == tuple(range(len(steps))):
            return None
        want = f"0..{m.steps - 1}" + (f" (or a prefix of at least {m.min_cut_steps})" if m.cutoff else "")
        return f"steps {list(steps)}, not {want} once each"

    def complete(self, a: int, u: int) -> None:
        status, jl, unroll, adm, tok = self.actors[a]
        self.note(f"completed phase {u}")
        samples: tuple = () if unroll is None else unroll[1]
        if unroll is None or unroll[0] != u:
            self.bad("safety", f"the gate says A{a} completed phase {u}, but its unroll is {unroll}")
        else:
            problem = self.unroll_problem(samples)
            if problem:
                self.bad("safety", f"A{a} completed phase {u} with {problem}")
        if u < self.closed_next:
            self.bad("safety", f"A{a} completed phase {u} after it closed: the complete unroll is lost")
        if any(k == (u, a) for k, _ in self.completed):
            self.bad("safety", f"A{a} completed phase {u} a second time")
        self.completed.append(((u, a), samples))
        self.actors[a] = (status, jl, None, adm, tok)

    def close(self, closed: Any) -> None:
        m = self.m
        u = closed.phase
        try:
            members = tuple(m.index[x] for x in closed.members)
        except (KeyError, TypeError):
            self.bad("safety", f"phase {u} closed with unknown members {closed.members!r}")
            members = ()
        if self.notes is not None:
            self.note(f"closed phase {u} {{{', '.join(f'A{x}' for x in members)}}}")
        if u != self.closed_next:
            self.bad("safety", f"phase {u} closed, but phase {self.closed_next} is the next to close")
        if len(set(members)) != len(members):
            self.bad("safety", f"phase {u} closed with a member listed twice: {closed.members}")
        for a, (status, _, unroll, _, _) in enumerate(self.actors):
            if status != OUT and unroll is not None and unroll[0] == u:
                self.bad("safety", f"phase {u} closed while A{a} still collects in it "
                                   f"({len(unroll[1])} of {m.steps} steps): its unroll is lost")
        mine = [(k[1], k[0], s) for k, s in self.completed if k[0] == u]
        self.completed = [(k, s) for k, s in self.completed if k[0] != u]
        have = sorted(a for a, _, _ in mine)
        if have != sorted(set(members)):
            self.bad("safety", f"phase {u} closed with members {['A%d' % x for x in sorted(members)]}, but the "
                               f"complete unrolls of it are from {['A%d' % x for x in have]}")
        # The learner assembles the batch now, from the unrolls of the members the gate names.
        batch = tuple(sorted((x for x in mine if x[0] in members), key=_first))
        self.queue.append((u, batch))
        self.closed_next = max(self.closed_next, u + 1)

    def release_calls(self, sink: list) -> None:
        for tok, adm in sink:
            a = tok.actor
            status, _, _, _, held = self.actors[a]
            if status != HELD or held is not tok:
                why = {OUT: "its member left", READY: "it was already released",
                       ADMITTED: "it was already released", HELD: "a newer request is held"}[status]
                self.bad("safety", f"release called for a request of A{a} (session {tok.session}) that is "
                                   f"not held: {why}")
                continue
            self.admit(a, adm, "released")
        sink.clear()


@dataclass(frozen=True)
class _Config:
    actors: int = 2
    steps: int = 2
    versions: int = 3
    max_lag: int = 0
    disconnects: bool = True
    reconnects: int = 1
    min_members: int = 1
    exact_stamps: bool = True
    cutoff: float | None = None
    min_unroll: float = 0.0
    start_version: int = 0
    weights: tuple[int, ...] | None = None  # env slots per actor (join's weight); None: all 1


class _Model:
    def __init__(self, c: _Config, gate_factory: Callable[..., Any]) -> None:
        if c.max_lag is None or c.max_lag < 0:
            raise ValueError("the model needs a bounded max_lag >= 0 (max_lag=None makes the state space infinite)")
        if c.actors < 1 or c.steps < 1 or c.versions < 1 or c.reconnects < 0:
            raise ValueError("actors, steps and versions must be >= 1, reconnects >= 0")
        self.c = c
        self.n, self.steps, self.max_lag = c.actors, c.steps, c.max_lag
        self.last_phase = c.start_version + c.versions - 1  # training it finishes the run
        self.cutoff = c.cutoff
        self.min_cut_steps = max(1, math.ceil(c.min_unroll * c.steps))
        self.joins = 1 + (c.reconnects if c.disconnects else 0)
        if c.weights is not None and len(c.weights) != c.actors:
            raise ValueError(f"weights {c.weights} must name one weight per actor ({c.actors})")
        self.names = tuple(f"A{a}" for a in range(c.actors))  # the gate's member ids
        self.index = {name: a for a, name in enumerate(self.names)}
        self.gate_factory = gate_factory
        self.sink: list = []

    def initial(self) -> tuple[Any, tuple]:
        c = self.c
        extra: dict[str, Any] = {}
        if c.start_version:
            extra["start_version"] = c.start_version
        if c.cutoff is not None:
            extra.update(cutoff=c.cutoff, min_unroll=c.min_unroll)
        gate = self.gate_factory(c.steps, c.min_members, c.max_lag, **extra)
        actors = tuple((OUT, self.joins, None, None, None) for _ in range(self.n))
        s = c.start_version
        return gate, (actors, (), (), s, s, s, None, s, False)

    def events(self, env: tuple) -> list[Event]:
        if env[_FINISHED]:
            return []
        evs = []
        for a, (status, jl, _, _, _) in enumerate(env[_ACT]):
            if status == OUT:
                if jl > 0:
                    evs.append(("join", a))
                continue
            if status == READY:
                evs.append(("request", a))
            elif status == ADMITTED:
                evs.append(("infer", a))
            if self.c.disconnects:
                evs.append(("leave", a))
        if env[_PENDING] is not None:
            evs.append(("publish", -1))
        elif env[_QUEUE]:
            evs.append(("train", -1))
        return evs

    def apply(self, gate: Any, env: tuple, event: Event,
              verbose: bool = False) -> tuple[Any, tuple, str, list[tuple[str, str]]]:
        """Run ``event`` on a clone of ``gate``: (new gate, new env, label, violations)."""
        kind, a = event
        g = clone_gate(gate)
        st = _Step(self, env, verbose)
        sink = self.sink
        sink.clear()
        label = f"A{a}.{kind}" if a >= 0 else f"trainer.{kind}"
        try:
            if kind == "join":
                _, jl, _, _, _ = st.actors[a]
                if self.c.weights is None:
                    g.join(self.names[a])
                else:
                    g.join(self.names[a], self.c.weights[a])
                st.actors[a] = (READY, jl - 1, None, None, None)
                st.release_calls(sink)
            elif kind == "request":
                _, jl, unroll, _, _ = st.actors[a]
                tok = _Release(a, self.joins - jl, sink)
                res = g.request(self.names[a], tok)
                if res.completed is not None:
                    st.complete(a, res.completed)
                elif unroll is not None and len(unroll[1]) == self.steps:
                    st.bad("safety", f"A{a}'s request after step {self.steps - 1} of phase {unroll[0]} "
                                     f"did not complete its unroll")
                for c in res.closed:
                    st.close(c)
                if res.admission is not None:
                    st.admit(a, res.admission, "admitted")
                else:
                    _, jl, unroll, _, _ = st.actors[a]
                    st.actors[a] = (HELD, jl, unroll, None, tok)
                    st.note("held")
                st.release_calls(sink)
            elif kind == "infer":
                _, jl, unroll, adm, _ = st.actors[a]
                version, step, phase = adm
                stamp = st.snapshot
                st.note(f"sample (phase {phase}, step {step}) stamped v{stamp}")
                if not 0 <= phase - stamp <= self.max_lag:
                    st.bad("lag", f"A{a} inferred step {step} of phase {phase} with version {stamp}: "
                                  f"lag {phase - stamp} outside [0, {self.max_lag}]")
                if stamp < version:
                    st.bad("safety", f"A{a} inferred with version {stamp}, older than its admission's {version}")
                if unroll is None:
                    unroll = (phase, ())
                sample = (step, stamp if self.c.exact_stamps else None)
                st.actors[a] = (READY, jl, (unroll[0], unroll[1] + (sample,)), None, None)
            elif kind == "leave":
                status, jl, unroll, _, _ = st.actors[a]
                dropped, closed = g.leave(self.names[a])
                expect = (0 if unroll is None else len(unroll[1])) + (status == ADMITTED)
                st.note(f"dropped {dropped}")
                if dropped != expect:
                    st.bad("safety", f"leave of A{a} reported {dropped} dropped steps; its unfinished unroll "
                                     f"had {expect}")
                st.actors[a] = (OUT, jl, None, None, None)
                for c in closed:
                    st.close(c)
                st.release_calls(sink)
            elif kind == "train":
                u, batch = st.queue.pop(0)
                st.note(f"phase {u} ({len(batch)} unroll(s))")
                if u != st.trained:
                    st.bad("safety", f"trainer got phase {u}, but phase {st.trained} is the next to train")
                for member, phase, samples in batch:
                    if phase != u:
                        st.bad("safety", f"version {u} trains A{member}'s unroll of phase {phase}")
                    problem = st.unroll_problem(samples)
                    if problem:
                        st.bad("safety", f"phase {u}: A{member} contributes {problem}")
                    for s, stamp in samples:
                        if stamp is not None and not u - self.max_lag <= stamp <= u:
                            st.bad("safety", f"version {u} trains A{member}'s step {s} sampled with version "
                                             f"{stamp}, outside [{u - self.max_lag}, {u}]")
                st.trained = u + 1
                if u >= self.last_phase:
                    st.finished = True
                    st.note("run finished")
                else:
                    st.snapshot = st.pending = u + 1
                    st.note(f"snapshot v{u + 1}")
            elif kind == "publish":
                v = st.pending
                label = f"trainer.publish({v})"
                g.publish(v)
                st.published, st.pending = v, None
                st.release_calls(sink)
            else:
                raise ValueError(f"unknown event {event!r}")
        except Exception as err:  # noqa: BLE001 - any exception from the gate is a finding
            st.bad("safety", f"{label} raised {type(err).__name__}: {err}")
        finally:
            sink.clear()
        if st.notes:
            label += " -> " + "; ".join(st.notes)
        return g, st.env(), label, st.violations


# -----------------------------------------------------------------------------------
# Search
# -----------------------------------------------------------------------------------


def replay(events: Sequence[Event], gate_factory: Callable[..., Any] = AdmissionGate,
           **config: Any) -> list[tuple[str, list[tuple[str, str]]]]:
    """Run ``events`` from the initial state of the model ``config`` (as for ``check``).

    Returns [(label, violations)], one per event; raises ValueError if an event is
    not enabled where it is taken.
    """
    model = _Model(_Config(**config), gate_factory)
    gate, env = model.initial()
    out = []
    for ev in events:
        if tuple(ev) not in model.events(env):
            raise ValueError(f"event {ev} is not enabled after {[label for label, _ in out]}")
        gate, env, label, bad = model.apply(gate, env, tuple(ev), verbose=True)
        out.append((label, bad))
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
    cfg = _Config(actors, steps, versions, max_lag, disconnects, reconnects if disconnects else 0, min_members,
                  exact_stamps, cutoff, min_unroll, start_version, None if weights is None else tuple(weights))
    model = _Model(cfg, gate_factory)
    config = dataclasses.asdict(cfg)
    report = Report(config)
    t0 = time.perf_counter()

    gate0, env0 = model.initial()
    config["symmetry"] = sym = symmetry

    def state_key(gate: Any, env: tuple) -> tuple:
        if sym:
            try:
                return _canonical(gate, env, model.index, cfg.weights)
            except _Asymmetric:
                pass
        return gate_key(gate), env

    index: dict[tuple, int] = {state_key(gate0, env0): 0}
    parent: list[int] = [-1]
    via: list[Event | None] = [None]  # the event that first reached each state
    depth: list[int] = [0]
    envs: list[tuple] = [env0]
    started: list[bool] = []  # per expanded state (BFS expands in index order)
    coop_src: list[int] = []
    coop_dst: list[int] = []
    sink_states: set[int] = set()  # states with a violating cooperative transition: liveness goals
    seen_kinds: set[tuple[str, str]] = set()
    frontier: deque[tuple[int, Any]] = deque([(0, gate0)])

    def path(i: int) -> tuple[Event, ...]:
        out = []
        while i > 0:
            out.append(via[i])
            i = parent[i]
        return tuple(reversed(out))

    def record(prop: str, message: str, events: tuple[Event, ...]) -> None:
        report.violation_count += 1
        kind = (prop, "".join(c for c in message.split("(")[0] if not c.isdigit()))
        if kind not in seen_kinds:
            seen_kinds.add(kind)
            labels = [label for label, _ in replay(events, gate_factory, **dataclasses.asdict(cfg))]
            report.violations.append(Violation(prop, message, events, tuple(labels)))

    while frontier:
        i, gate = frontier.popleft()
        env = envs[i]
        started.append(bool(getattr(gate, "started", True)))
        evs = model.events(env)
        if not evs:
            if env[_FINISHED]:
                report.finished_states += 1
            elif all(s == OUT and jl == 0 for s, jl, *_ in env[_ACT]) and not env[_QUEUE] and env[_PENDING] is None:
                report.abandoned_states += 1
            else:
                record("deadlock", f"no event is enabled and the run is not finished ({describe_env(env)}; "
                                   f"{describe_gate(gate)})", path(i))
        elif not env[_FINISHED] and started[i] and env[_PENDING] is None and not env[_QUEUE]:
            live = [s for s, *_ in env[_ACT] if s != OUT]
            if live and all(s == HELD for s in live):
                record("deadlock", f"every live actor is held and the trainer has nothing to do "
                                   f"({describe_gate(gate)})", path(i))
        if stop_on_violation and report.violations:
            report.complete = False
            break
        for ev in evs:
            g2, env2, _, bad = model.apply(gate, env, ev)
            report.transitions += 1
            if bad:
                for prop, message in bad:
                    record(prop, message, path(i) + (ev,))
                if ev[0] in _COOPERATIVE:
                    sink_states.add(i)
                if stop_on_violation:
                    report.complete = False
                    frontier.clear()
                    break
                continue  # not explored past a violation
            key = state_key(g2, env2)
            j = index.get(key)
            if j is None:
                j = len(envs)
                if j >= max_states:
                    report.complete = False
                    frontier.clear()
                    break
                index[key] = j
                parent.append(i)
                via.append(ev)
                depth.append(depth[i] + 1)
                envs.append(env2)
                frontier.append((j, g2))
            if ev[0] in _COOPERATIVE:
                coop_src.append(i)
                coop_dst.append(j)

    report.states = len(envs)
    report.max_depth = max(depth)
    if report.complete:
        _check_liveness(envs, started, coop_src, coop_dst, sink_states, path, record)
    report.seconds = time.perf_counter() - t0
    return report


def _check_liveness(envs: list[tuple], started: list[bool], coop_src: list[int], coop_dst: list[int],
                    sink_states: set[int], path: Callable, record: Callable) -> None:
    """Backward reachability over the cooperative transitions (request, infer, train, publish)."""
    n = len(envs)
    preds: list[list[int]] = [[] for _ in range(n)]
    for s, d in zip(coop_src, coop_dst):
        preds[d].append(s)

    def can_reach(goal: list[bool]) -> list[bool]:
        seen = list(goal)
        stack = [k for k in range(n) if goal[k]]
        while stack:
            d = stack.pop()
            for s in preds[d]:
                if not seen[s]:
                    seen[s] = True
                    stack.append(s)
        return seen

    def statuses(k: int) -> list[int]:
        return [s for s, *_ in envs[k][_ACT]]

    held_goal = [envs[k][_FINISHED] or not started[k] or k in sink_states or HELD not in statuses(k)
                 for k in range(n)]
    ok = can_reach(held_goal)
    bad = next((k for k in range(n) if not ok[k]), None)  # the smallest index is a shallowest state
    if bad is not None:
        held = [f"A{a}" for a, s in enumerate(statuses(bad)) if s == HELD]
        record("liveness", f"after this trace no sequence of request/infer/train/publish releases "
                           f"{', '.join(held)} ({describe_env(envs[bad])})", path(bad))
    fin_goal = [envs[k][_FINISHED] or k in sink_states for k in range(n)]
    ok = can_reach(fin_goal)
    bad = next((k for k in range(n) if not ok[k] and started[k] and any(s != OUT for s in statuses(k))), None)
    if bad is not None:
        record("progress", f"after this trace the actors that stay can never finish the run "
                           f"({describe_env(envs[bad])})", path(bad))


def describe_env(env: tuple) -> str:
    acts = ", ".join(f"A{a} {_STATUS[s]}" for a, (s, *_) in enumerate(env[_ACT]))
    return (f"actors [{acts}], phases closed < {env[_CLOSED_NEXT]}, published {env[_PUBLISHED]}, "
            f"trained < {env[_TRAINED]}, queue {[u for u, _ in env[_QUEUE]]}")


# -----------------------------------------------------------------------------------
# Standard configurations
# -----------------------------------------------------------------------------------

STANDARD: tuple[dict[str, Any], ...] = (
    dict(actors=2, steps=2, versions=3, max_lag=0),
    dict(actors=2, steps=2, versions=3, max_lag=0, min_members=2),
    dict(actors=2, steps=2, versions=3, max_lag=0, reconnects=2, symmetry=True),
    dict(actors=3, steps=2, versions=3, max_lag=0, symmetry=True, exact_stamps=False),
    dict(actors=2, steps=2, versions=3, max_lag=1, symmetry=True),
    dict(actors=2, steps=2, versions=3, max_lag=1, reconnects=0, symmetry=True),
    dict(actors=2, steps=2, versions=3, max_lag=1, disconnects=False),
    dict(actors=2, steps=2, versions=3, max_lag=2, symmetry=True, exact_stamps=False),
    dict(actors=2, steps=2, versions=3, max_lag=2, reconnects=0, symmetry=True, exact_stamps=False),
    dict(actors=3, steps=2, versions=2, max_lag=1, reconnects=0, symmetry=True, exact_stamps=False),
    dict(actors=2, steps=2, versions=3, max_lag=0, cutoff=0.6, weights=(2, 1)),
    dict(actors=2, steps=2, versions=3, max_lag=1, cutoff=0.6, weights=(2, 1), reconnects=0, exact_stamps=False),
    dict(actors=3, steps=3, versions=2, max_lag=0, cutoff=0.5, min_unroll=0.5, reconnects=0, symmetry=True,
         exact_stamps=False),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lockstep.sync.model",
                                     description="Exhaustively model-check the admission gate "
                                                 "(with no options: the standard configurations).")
    parser.add_argument("--actors", type=int)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--versions", type=int, default=3)
    parser.add_argument("--max-lag", type=int, default=0)
    parser.add_argument("--reconnects", type=int, default=1)
    parser.add_argument("--min-members", type=int, default=1)
    parser.add_argument("--cutoff", type=float)
    parser.add_argument("--min-unroll", type=float, default=0.0)
    parser.add_argument("--no-disconnects", action="store_true")
    parser.add_argument("--stamps-at-inference", action="store_true", help="exact_stamps=False")
    parser.add_argument("--symmetry", action="store_true")
    parser.add_argument("--traces", action="store_true", help="print the counterexample traces")
    args = parser.parse_args(argv)
    if args.actors is not None:
        configs = [dict(actors=args.actors, steps=args.steps, versions=args.versions, max_lag=args.max_lag,
                        reconnects=args.reconnects, min_members=args.min_members, cutoff=args.cutoff,
                        min_unroll=args.min_unroll, disconnects=not args.no_disconnects,
                        exact_stamps=not args.stamps_at_inference, symmetry=args.symmetry)]
    else:
        configs = list(STANDARD)
    rows, reports = [], []
    for c in configs:
        r = check(**c)
        reports.append(r)
        rows.append((config_name(r.config), str(r.states), str(r.transitions), f"{r.seconds:.2f}", r.result()))
        print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    head = ("config", "states", "transitions", "seconds", "result")
    widths = [max(len(x[k]) for x in rows + [head]) for k in range(5)]
    for row in [head, tuple("-" * w for w in widths)] + rows:
        print("  ".join(x.ljust(w) if k in (0, 4) else x.rjust(w) for k, (x, w) in enumerate(zip(row, widths))))
    if args.traces or args.actors is not None:
        for r in reports:
            for v in r.violations:
                print(f"\n{config_name(r.config)}\n{v.format()}")
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
