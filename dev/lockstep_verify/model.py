"""The model: its parameters, its initial state, the events enabled in a state, and how one is taken."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lockstep_verify.events import Transition
from lockstep_verify.freeze import clone_gate
from lockstep_verify.state import TRAINER, ActorState, Event, Finding, ReleaseCallback, Status, World


@dataclass(frozen=True)
class Config:
    """The size and options of a model (see the package docstring)."""

    actors: int = 2
    steps: int = 2  # T: steps per unroll
    versions: int = 3  # phases trained before the run finishes
    max_lag: int = 0  # the gate's bound; 0 is strict mode
    disconnects: bool = True  # actors may leave
    reconnects: int = 1  # joins after the first, per actor
    min_members: int = 1
    exact_stamps: bool = True  # keep each sample's stamp until the trainer checks it
    cutoff: float | None = None  # the gate's straggler cut-off
    min_unroll: float = 0.0
    start_version: int = 0
    weights: tuple[int, ...] | None = None  # env slots per actor (join's weight); None: all 1


class Model:
    """The system of :class:`Config` around gates made by ``gate_factory``.

    ``gate_factory(steps_per_phase, min_members, max_lag, **options)`` makes the gate
    (options: ``start_version``, ``cutoff``, ``min_unroll`` when the config sets them).
    """

    def __init__(self, config: Config, gate_factory: Callable[..., Any]) -> None:
        c = config
        if c.max_lag is None or c.max_lag < 0:
            raise ValueError("the model needs a bounded max_lag >= 0 (max_lag=None makes the state space infinite)")
        if c.actors < 1 or c.steps < 1 or c.versions < 1 or c.reconnects < 0:
            raise ValueError("actors, steps and versions must be >= 1, reconnects >= 0")
        if c.weights is not None and len(c.weights) != c.actors:
            raise ValueError(f"weights {c.weights} must name one weight per actor ({c.actors})")
        self.config = c
        self.gate_factory = gate_factory
        self.steps, self.max_lag = c.steps, c.max_lag
        self.last_phase = c.start_version + c.versions - 1  # training it finishes the run
        self.min_cut_steps = max(1, math.ceil(c.min_unroll * c.steps))  # the shortest unroll a cut may leave
        self.joins = 1 + (c.reconnects if c.disconnects else 0)
        self.names = tuple(f"A{a}" for a in range(c.actors))  # the gate's member ids
        self.index = {name: a for a, name in enumerate(self.names)}
        # Where release callbacks record their calls during one transition (one list,
        # reused: transitions are taken one at a time).
        self.sink: list[tuple[ReleaseCallback, Any]] = []

    def initial(self) -> tuple[Any, World]:
        """A fresh gate and the world before anything happened."""
        c = self.config
        options: dict[str, Any] = {}
        if c.start_version:
            options["start_version"] = c.start_version
        if c.cutoff is not None:
            options.update(cutoff=c.cutoff, min_unroll=c.min_unroll)
        gate = self.gate_factory(c.steps, c.min_members, c.max_lag, **options)
        actors = tuple(ActorState(Status.OUT, self.joins, None, None, None) for _ in range(c.actors))
        v = c.start_version
        return gate, World(actors, (), (), closed_next=v, published=v, snapshot=v, pending=None, trained=v,
                           finished=False)

    def enabled(self, world: World) -> list[Event]:
        """The events that may happen next, in a fixed order (actors by number, then the trainer)."""
        if world.finished:
            return []
        events = []
        for a, state in enumerate(world.actors):
            if state.status == Status.OUT:
                if state.joins_left > 0:
                    events.append(Event("join", a))
                continue
            if state.status == Status.READY:
                events.append(Event("request", a))
            elif state.status == Status.ADMITTED:
                events.append(Event("infer", a))
            if self.config.disconnects:
                events.append(Event("leave", a))
        # The trainer publishes what it trained before it trains the next phase.
        if world.pending is not None:
            events.append(Event("publish", TRAINER))
        elif world.queue:
            events.append(Event("train", TRAINER))
        return events

    def apply(self, gate: Any, world: World, event: Event,
              verbose: bool = False) -> tuple[Any, World, str, list[Finding]]:
        """Take ``event`` on a clone of ``gate``: (new gate, new world, label, findings).

        The label names the event and, with ``verbose``, what the gate answered and
        what the learner did with it.
        """
        transition = Transition(self, clone_gate(gate), world, event, verbose)
        transition.run()
        return transition.gate, transition.world(), transition.label, transition.findings
