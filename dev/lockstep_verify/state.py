"""The model's state, apart from the gate: what the actors, the learner and the trainer hold.

Every type here is immutable and compares and hashes by value (NamedTuples and an
IntEnum), because a model state is a dictionary key of the search: two states are
the same state exactly when their gates freeze to the same image (``freeze.py``)
and their :class:`World` values are equal.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, NamedTuple


class Status(IntEnum):
    """Where an actor is in its cycle: out --join--> ready --request--> admitted (or held) --infer--> ready."""

    OUT = 0  # not connected: never joined, or left
    READY = 1  # connected, no request in flight
    HELD = 2  # its request waits in the gate for a ``release``
    ADMITTED = 3  # admitted; its inference has not run yet


class Event(NamedTuple):
    """One step of the system: ``kind`` taken by actor ``actor``, or by the trainer (actor -1)."""

    kind: str  # join, request, infer, leave (actors); train, publish (the trainer)
    actor: int

    def label(self) -> str:
        """How a trace shows the event before the gate's answer is appended."""
        return f"A{self.actor}.{self.kind}" if self.actor >= 0 else f"trainer.{self.kind}"


TRAINER = -1  # the ``actor`` of the trainer's events

# The events that actors which stay connected take, and the trainer's: liveness and
# progress are judged over these alone (with joins and leaves everyone could just leave).
COOPERATIVE = frozenset({"request", "infer", "train", "publish"})


class Sample(NamedTuple):
    """One step an actor took: its index in the unroll and the version inference used for it."""

    step: int
    stamp: int | None  # None once checked at inference (``exact_stamps=False``)


class Unroll(NamedTuple):
    """An actor's unroll of one phase so far, as the learner keeps it."""

    phase: int
    samples: tuple[Sample, ...]


class Pending(NamedTuple):
    """An admission whose inference has not run yet: what the gate granted."""

    version: int
    step: int
    phase: int


class ActorState(NamedTuple):
    """One actor: its status, the learner's record of its unroll, and what it is waiting for."""

    status: Status
    joins_left: int  # joins still allowed: 1 + reconnects at first, one fewer per join
    unroll: Unroll | None  # the current (unfinished) unroll; None before its step 0
    pending: Pending | None  # set while ADMITTED
    held: ReleaseCallback | None  # the callback of the held request, set while HELD


class CompleteUnroll(NamedTuple):
    """A complete unroll of a phase, filed by the learner until the phase closes."""

    phase: int
    actor: int
    samples: tuple[Sample, ...]


class ClosedBatch(NamedTuple):
    """A closed phase waiting for the trainer: the unrolls of the members the gate named, by actor."""

    phase: int
    unrolls: tuple[CompleteUnroll, ...]


class World(NamedTuple):
    """Everything in a model state but the gate."""

    actors: tuple[ActorState, ...]
    completed: tuple[CompleteUnroll, ...]  # complete unrolls of open phases, by (phase, actor)
    queue: tuple[ClosedBatch, ...]  # closed phases not yet trained, oldest first
    closed_next: int  # the next phase expected to close
    published: int  # the version last published to the gate
    snapshot: int  # the version inference uses (swapped before the gate hears of it)
    pending: int | None  # the version to publish next, once trained
    trained: int  # the next phase to train
    finished: bool  # the last phase is trained: the run is over

    def describe(self) -> str:
        """A one-line summary for violation messages."""
        actors = ", ".join(f"A{a} {s.status.name.lower()}" for a, s in enumerate(self.actors))
        return (f"actors [{actors}], phases closed < {self.closed_next}, published {self.published}, "
                f"trained < {self.trained}, queue {[batch.phase for batch in self.queue]}")


class Finding(NamedTuple):
    """A property a transition violated, with what went wrong."""

    prop: str  # safety | lag (on transitions); deadlock | liveness | progress (on states)
    message: str


class ReleaseCallback:
    """A held request's ``release``: the gate calls it, and it records the call in the model's sink.

    Identity tells held requests apart (a stale callback is another object), while
    equality, order and hash go by (actor, session), so that a frozen state does not
    depend on which object the gate holds. ``session`` counts the actor's joins, so a
    callback from before a leave never equals one from after.
    """

    __slots__ = ("actor", "session", "sink")

    def __init__(self, actor: int, session: int, sink: list[tuple[ReleaseCallback, Any]]) -> None:
        self.actor, self.session, self.sink = actor, session, sink

    def __call__(self, admission: Any) -> None:
        self.sink.append((self, admission))

    # Cloning a gate must keep its callbacks: they are the identity of held requests.
    def __copy__(self) -> ReleaseCallback:
        return self

    def __deepcopy__(self, memo: dict) -> ReleaseCallback:
        return self

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReleaseCallback) and (self.actor, self.session) == (other.actor, other.session)

    def __lt__(self, other: ReleaseCallback) -> bool:
        return (self.actor, self.session) < (other.actor, other.session)

    def __hash__(self) -> int:
        return hash((self.actor, self.session))

    def __repr__(self) -> str:
        return f"release(A{self.actor}#{self.session})"
