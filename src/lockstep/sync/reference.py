"""Reference synchronizations: the flag-based designs users of SEED-style systems propose.

Implemented faithfully, spins and all, so that ``lockstep bench sync`` can measure
them against the admission gate on the real learner. Each guards two operations
on one policy whose parameters the trainer updates *in place*:

    infer(actor, forward)  run ``forward`` (one forward pass) for an actor's request;
                           return its result, or None for "no action, retry"
    train(update)          run ``update`` (a whole PPO update) and return its result

Between a check and the action it guards, each calls ``self.pause()``: a no-op
normally, a random sleep under ``--adversarial``, standing for the preemption that
can happen there in any real scheduler.

What goes wrong, by design (see docs/synchronization.md for the measurements):
    spin-flags    busy-waits on both sides; check-then-set on both sides is not
                  atomic, so an inference can start just after the trainer checked
                  the flags and read parameters mid-update (a torn read).
    spin-redo     busy-waits; a training that starts and ends within one forward
                  pass goes unnoticed (torn read); every redo wastes a forward pass.
    reject-retry  no spinning on the learner, but rejected RPCs and wasted forward
                  passes; the same blind spot as spin-redo.
    seqlock       the sound form of reject-retry: a counter that is odd while
                  training and changes with every update detects any overlap.
No reference strategy bounds how far a fast actor runs ahead, so samples collected
with version v can be trained by version v+1 or later (off-policy samples).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class ReferenceSync:
    name = ""

    def __init__(self, pause: Callable[[], None] | None = None) -> None:
        self.pause = pause or (lambda: None)
        self.spins = 0  # iterations of busy-wait loops
        self.wasted_forward_passes = 0  # forward passes whose result was thrown away
        self.rejected_rpcs = 0  # requests answered with "no action, retry"
        self._count_lock = threading.Lock()

    def _count(self, attr: str) -> None:
        with self._count_lock:
            setattr(self, attr, getattr(self, attr) + 1)

    def infer(self, actor: int, forward: Callable[[], T]) -> T | None:
        raise NotImplementedError

    def train(self, update: Callable[[], T]) -> T:
        raise NotImplementedError


class SpinFlags(ReferenceSync):
    """A ``training`` flag and an ``inferring[actor]`` flag per actor; both sides spin."""

    name = "spin-flags"

    def __init__(self, pause=None) -> None:
        super().__init__(pause)
        self.training = False
        self.inferring: dict[int, bool] = {}

    def infer(self, actor, forward):
        while self.training:
            self.spins += 1
        self.pause()
        self.inferring[actor] = True
        try:
            return forward()
        finally:
            self.inferring[actor] = False

    def train(self, update):
        self.training = True
        self.pause()
        while any(self.inferring.values()):
            self.spins += 1
        try:
            return update()
        finally:
            self.training = False


class _TrainingFlag(ReferenceSync):
    """One ``training`` flag, set for the whole update; how inference reads it is the subclass's design."""

    def __init__(self, pause=None) -> None:
        super().__init__(pause)
        self.training = False

    def train(self, update):
        self.training = True
        try:
            return update()
        finally:
            self.training = False


class SpinRedo(_TrainingFlag):
    """One ``training`` flag; inference spins while it is set and redoes a pass it saw set afterwards."""

    name = "spin-redo"

    def infer(self, actor, forward):
        while True:
            while self.training:
                self.spins += 1
            self.pause()
            result = forward()
            if not self.training:
                return result
            self._count("wasted_forward_passes")


class RejectRetry(_TrainingFlag):
    """One ``training`` flag, checked before and after the pass; if set, answer "no action" and the actor retries."""

    name = "reject-retry"

    def infer(self, actor, forward):
        if self.training:
            self._count("rejected_rpcs")
            return None
        self.pause()
        result = forward()
        if self.training:
            self._count("wasted_forward_passes")
            self._count("rejected_rpcs")
            return None
        return result


class SeqLock(ReferenceSync):
    """A sequence counter, odd while the parameters are being written; read before and after the pass."""

    name = "seqlock"

    def __init__(self, pause=None) -> None:
        super().__init__(pause)
        self.sequence = 0

    def infer(self, actor, forward):
        before = self.sequence
        if before & 1:
            self._count("rejected_rpcs")
            return None
        self.pause()
        result = forward()
        if self.sequence != before:
            self._count("wasted_forward_passes")
            self._count("rejected_rpcs")
            return None
        return result

    def train(self, update):
        self.sequence += 1  # odd: writing
        try:
            return update()
        finally:
            self.sequence += 1  # even again, and different from any value a reader saw before


REFERENCE = {cls.name: cls for cls in (SpinFlags, SpinRedo, RejectRetry, SeqLock)}
