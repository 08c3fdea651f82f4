"""The transitions: one method per event, and what the learner does with the gate's answers.

A :class:`Transition` takes one event from one state: it calls the gate (a clone,
so the source state is left as it was) the way the learner would, plays the
learner's and trainer's part on a mutable copy of the :class:`World`, and checks the
safety and lag properties on everything that happens, collecting a
:class:`Finding` for each violation. The order of the calls and checks follows the
learner, so traces read like the run they stand for.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lockstep_verify.state import (
    TRAINER,
    ActorState,
    ClosedBatch,
    CompleteUnroll,
    Event,
    Finding,
    Pending,
    ReleaseCallback,
    Sample,
    Status,
    Unroll,
    World,
)

if TYPE_CHECKING:
    from lockstep_verify.model import Model

OUT, READY, HELD, ADMITTED = Status.OUT, Status.READY, Status.HELD, Status.ADMITTED  # short names


class Transition:
    """One event being taken: the gate to call, a mutable copy of the world, findings and notes."""

    def __init__(self, model: Model, gate: Any, world: World, event: Event, verbose: bool) -> None:
        self.model = model
        self.gate = gate  # already a clone: the event may change it
        self.sink = model.sink  # (callback, admission) for each release the gate called
        self.sink.clear()
        self.actors = list(world.actors)
        self.completed = list(world.completed)
        self.queue = list(world.queue)
        self.closed_next, self.published = world.closed_next, world.published
        self.snapshot, self.pending = world.snapshot, world.pending
        self.trained, self.finished = world.trained, world.finished
        self.event = event
        self.label = event.label()
        self.findings: list[Finding] = []
        self.notes: list[str] | None = [] if verbose else None  # what happened, for traces (replay)

    def run(self) -> None:
        """Take the event. An exception from the gate is a safety violation, reported like any other."""
        kind, a = self.event
        if a == TRAINER and kind in _TRAINER_EVENTS:
            take = functools.partial(_TRAINER_EVENTS[kind], self)
        elif a != TRAINER and kind in _ACTOR_EVENTS:
            take = functools.partial(_ACTOR_EVENTS[kind], self, a)
        else:
            raise ValueError(f"unknown event {self.event!r}")
        try:
            take()
        except Exception as err:
            self.bad("safety", f"{self.label} raised {type(err).__name__}: {err}")
        finally:
            self.sink.clear()
        if self.notes:
            self.label += " -> " + "; ".join(self.notes)

    def world(self) -> World:
        """The world after the event."""
        return World(tuple(self.actors), tuple(sorted(self.completed, key=_by_phase_and_actor)), tuple(self.queue),
                     self.closed_next, self.published, self.snapshot, self.pending, self.trained, self.finished)

    def bad(self, prop: str, message: str) -> None:
        """Record a violation of ``prop``."""
        self.findings.append(Finding(prop, message))

    def note(self, text: str) -> None:
        """Record what happened, for the trace label (only when verbose)."""
        if self.notes is not None:
            self.notes.append(text)

    # -- the actors' events ---------------------------------------------------------

    def join(self, a: int) -> None:
        """Actor ``a`` connects: the first time, or again after a leave (a rejoin, as the same member)."""
        state = self.actors[a]
        weights = self.model.config.weights
        if weights is None:
            self.gate.join(self.model.names[a])
        else:
            self.gate.join(self.model.names[a], weights[a])
        self.actors[a] = ActorState(READY, state.joins_left - 1, None, None, None)
        self.release_calls()  # a join may start the first phase

    def request(self, a: int) -> None:
        """Actor ``a`` asks to act; the request completes its unroll when it follows the last step."""
        state = self.actors[a]
        callback = ReleaseCallback(a, self.model.joins - state.joins_left, self.sink)
        result = self.gate.request(self.model.names[a], callback)
        if result.completed is not None:
            self.complete(a, result.completed)
        elif state.unroll is not None and len(state.unroll.samples) == self.model.steps:
            self.bad("safety", f"A{a}'s request after step {self.model.steps - 1} of phase {state.unroll.phase} "
                               f"did not complete its unroll")
        for closed in result.closed:
            self.close(closed)
        if result.admission is not None:
            self.admit(a, result.admission, "admitted")
        else:
            state = self.actors[a]
            self.actors[a] = ActorState(HELD, state.joins_left, state.unroll, None, callback)
            self.note("held")
        self.release_calls()

    def infer(self, a: int) -> None:
        """Actor ``a``'s forward pass: the sample is stamped with the version inference uses now."""
        state = self.actors[a]
        version, step, phase = state.pending
        stamp = self.snapshot
        self.note(f"sample (phase {phase}, step {step}) stamped v{stamp}")
        max_lag = self.model.max_lag
        if not 0 <= phase - stamp <= max_lag:
            self.bad("lag", f"A{a} inferred step {step} of phase {phase} with version {stamp}: "
                            f"lag {phase - stamp} outside [0, {max_lag}]")
        if stamp < version:
            self.bad("safety", f"A{a} inferred with version {stamp}, older than its admission's {version}")
        unroll = state.unroll if state.unroll is not None else Unroll(phase, ())
        # Without exact stamps the check above is the only one the stamp needs (the
        # structural checks tie the sample's phase to the version that trains it), so
        # it is dropped: states that differ only in stamps have the same futures.
        sample = Sample(step, stamp if self.model.config.exact_stamps else None)
        self.actors[a] = ActorState(READY, state.joins_left, Unroll(unroll.phase, unroll.samples + (sample,)),
                                    None, None)

    def leave(self, a: int) -> None:
        """Actor ``a`` disconnects in any joined state, dropping its unfinished unroll."""
        state = self.actors[a]
        dropped, closed = self.gate.leave(self.model.names[a])
        expect = (0 if state.unroll is None else len(state.unroll.samples)) + (state.status == ADMITTED)
        self.note(f"dropped {dropped}")
        if dropped != expect:
            self.bad("safety", f"leave of A{a} reported {dropped} dropped steps; its unfinished unroll "
                               f"had {expect}")
        self.actors[a] = ActorState(OUT, state.joins_left, None, None, None)
        for c in closed:
            self.close(c)
        self.release_calls()

    # -- the trainer's events ---------------------------------------------------------

    def train(self) -> None:
        """Train the oldest closed phase u, check its batch, and swap inference to version u + 1."""
        u, batch = self.queue.pop(0)
        self.note(f"phase {u} ({len(batch)} unroll(s))")
        if u != self.trained:
            self.bad("safety", f"trainer got phase {u}, but phase {self.trained} is the next to train")
        max_lag = self.model.max_lag
        for unroll in batch:
            if unroll.phase != u:
                self.bad("safety", f"version {u} trains A{unroll.actor}'s unroll of phase {unroll.phase}")
            problem = self.unroll_problem(unroll.samples)
            if problem:
                self.bad("safety", f"phase {u}: A{unroll.actor} contributes {problem}")
            for s, stamp in unroll.samples:
                if stamp is not None and not u - max_lag <= stamp <= u:
                    self.bad("safety", f"version {u} trains A{unroll.actor}'s step {s} sampled with version "
                                       f"{stamp}, outside [{u - max_lag}, {u}]")
        self.trained = u + 1
        if u >= self.model.last_phase:
            self.finished = True
            self.note("run finished")
        else:
            # The snapshot is swapped first, the gate told later (``publish``), as in the learner.
            self.snapshot = self.pending = u + 1
            self.note(f"snapshot v{u + 1}")

    def publish(self) -> None:
        """Tell the gate of the version the last ``train`` made, releasing what it makes admissible."""
        v = self.pending
        self.label = f"trainer.publish({v})"
        self.gate.publish(v)
        self.published, self.pending = v, None
        self.release_calls()

    # -- what the learner does with the gate's answers ---------------------------------

    def admit(self, a: int, admission: Any, how: str) -> None:
        """Actor ``a`` was admitted (at once, or ``how`` = "released" later): check the admission."""
        model = self.model
        state = self.actors[a]
        unroll = state.unroll
        version, step, phase = admission.version, admission.step, admission.phase
        if self.notes is not None:
            self.note(f"{how} A{a} (v{version}, phase {phase}, step {step})")
        if phase < self.closed_next:
            self.bad("safety", f"A{a} admitted into phase {phase}, which is already closed: "
                               f"its sample is never trained")
        if not phase - model.max_lag <= version <= phase:
            self.bad("safety", f"A{a} admitted for phase {phase} with version {version}, "
                               f"outside [{phase - model.max_lag}, {phase}] (max_lag {model.max_lag})")
        if version != self.published:
            self.bad("safety", f"A{a} admitted with version {version}, but version {self.published} is published")
        if model.max_lag == 0 and self.closed_next > self.published:
            self.bad("safety", f"strict mode: A{a} admitted between the close of phase {self.closed_next - 1} "
                               f"and publish({self.closed_next})")
        for c in self.completed:
            if c.phase == phase and c.actor == a:
                self.bad("safety", f"A{a} admitted again into phase {phase}, which it has already completed "
                                   f"(it would contribute more than T={model.steps} samples)")
        if not 0 <= step < model.steps:
            self.bad("safety", f"A{a} admitted as step {step}, outside 0..{model.steps - 1}")
        if step == 0:
            if unroll is not None:
                self.bad("safety", f"A{a} admitted as step 0 of phase {phase} while its unroll of phase "
                                   f"{unroll.phase} ({len(unroll.samples)} steps) is unfinished")
            unroll = Unroll(phase, ())
        elif unroll is None or unroll.phase != phase or len(unroll.samples) != step:
            self.bad("safety", f"A{a} admitted as step {step} of phase {phase}, but its unroll is "
                               f"{_show_unroll(unroll)}")
        self.actors[a] = ActorState(ADMITTED, state.joins_left, unroll, Pending(version, step, phase), None)

    def complete(self, a: int, u: int) -> None:
        """The gate says actor ``a``'s unroll of phase ``u`` is complete: the learner files it."""
        state = self.actors[a]
        unroll = state.unroll
        self.note(f"completed phase {u}")
        samples: tuple[Sample, ...] = () if unroll is None else unroll.samples
        if unroll is None or unroll.phase != u:
            self.bad("safety", f"the gate says A{a} completed phase {u}, but its unroll is {_show_unroll(unroll)}")
        else:
            problem = self.unroll_problem(samples)
            if problem:
                self.bad("safety", f"A{a} completed phase {u} with {problem}")
        if u < self.closed_next:
            self.bad("safety", f"A{a} completed phase {u} after it closed: the complete unroll is lost")
        if any(c.phase == u and c.actor == a for c in self.completed):
            self.bad("safety", f"A{a} completed phase {u} a second time")
        self.completed.append(CompleteUnroll(u, a, samples))
        self.actors[a] = state._replace(unroll=None)

    def close(self, closed: Any) -> None:
        """The gate closed a phase: check it, and assemble its batch from the members it names."""
        model = self.model
        u = closed.phase
        try:
            members = tuple(model.index[x] for x in closed.members)
        except (KeyError, TypeError):
            self.bad("safety", f"phase {u} closed with unknown members {closed.members!r}")
            members = ()
        if self.notes is not None:
            self.note(f"closed phase {u} {{{', '.join(f'A{x}' for x in members)}}}")
        if u != self.closed_next:
            self.bad("safety", f"phase {u} closed, but phase {self.closed_next} is the next to close")
        if len(set(members)) != len(members):
            self.bad("safety", f"phase {u} closed with a member listed twice: {closed.members}")
        for a, state in enumerate(self.actors):
            if state.status != OUT and state.unroll is not None and state.unroll.phase == u:
                self.bad("safety", f"phase {u} closed while A{a} still collects in it "
                                   f"({len(state.unroll.samples)} of {model.steps} steps): its unroll is lost")
        mine = [c for c in self.completed if c.phase == u]
        self.completed = [c for c in self.completed if c.phase != u]
        have = sorted(c.actor for c in mine)
        if have != sorted(set(members)):
            self.bad("safety", f"phase {u} closed with members {[f'A{x}' for x in sorted(members)]}, but the "
                               f"complete unrolls of it are from {[f'A{x}' for x in have]}")
        # The learner assembles the batch now, from the unrolls of the members the gate names.
        batch = tuple(sorted((c for c in mine if c.actor in members), key=_by_actor))
        self.queue.append(ClosedBatch(u, batch))
        self.closed_next = max(self.closed_next, u + 1)

    def release_calls(self) -> None:
        """Admit the held requests the gate released during this event, checking each was held."""
        for callback, admission in self.sink:
            a = callback.actor
            state = self.actors[a]
            if state.status != HELD or state.held is not callback:
                why = {OUT: "its member left", READY: "it was already released",
                       ADMITTED: "it was already released", HELD: "a newer request is held"}[state.status]
                self.bad("safety", f"release called for a request of A{a} (session {callback.session}) that is "
                                   f"not held: {why}")
                continue
            self.admit(a, admission, "released")
        self.sink.clear()

    def unroll_problem(self, samples: tuple[Sample, ...]) -> str | None:
        """Why a complete unroll's steps are wrong (T steps 0..T-1; with the cut-off, a prefix of them)."""
        model = self.model
        steps = tuple(s.step for s in samples)
        if steps == tuple(range(model.steps)):
            return None
        if (model.config.cutoff is not None and model.min_cut_steps <= len(steps) < model.steps
                and steps == tuple(range(len(steps)))):
            return None
        want = f"0..{model.steps - 1}" + (f" (or a prefix of at least {model.min_cut_steps})"
                                          if model.config.cutoff else "")
        return f"steps {list(steps)}, not {want} once each"


_ACTOR_EVENTS: dict[str, Callable[[Transition, int], None]] = {
    "join": Transition.join, "request": Transition.request, "infer": Transition.infer, "leave": Transition.leave}
_TRAINER_EVENTS: dict[str, Callable[[Transition], None]] = {"train": Transition.train, "publish": Transition.publish}


def _by_phase_and_actor(c: CompleteUnroll) -> tuple[int, int]:
    return c.phase, c.actor


def _by_actor(c: CompleteUnroll) -> int:
    return c.actor


def _show_unroll(unroll: Unroll | None) -> str:
    """An unroll as messages show it: (phase, ((step, stamp), ...))."""
    return "None" if unroll is None else str((unroll.phase, tuple(tuple(s) for s in unroll.samples)))
