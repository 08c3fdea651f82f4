"""Who starts the actors of ``lockstep train``, and keeps them running: one ``Launcher`` interface.

processes   actor processes on this host, spawned and restarted here (``launch/processes.py``)
inprocess   env loops as tasks on the learner's event loop, ``actors.transport: inprocess``
            (``launch/inprocess.py``; the transport itself: ``actor/inprocess.py``)
ray         Ray actors, placed and restarted by Ray (``launch/ray.py``; the code inside each actor:
            ``launch/ray_actor.py``, which imports no torch), ``actors.launcher: ray``

One ``RestartPolicy`` (``launch/restart.py``) decides for all of them when a dead actor is restarted.
The learner runs in the ``lockstep train`` process whichever launcher runs, and never starts actors
itself: ``launch.local.train`` drives the launcher through the calls of ``Launcher``. Under torchrun
each rank is one such process, with its own learner and its own launcher.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from lockstep.learner.wiring import Learner


class ActorsGone(RuntimeError):
    """Every actor of the run exited and none is due to restart: no one is left to collect a phase, so the run
    failed (its summary says so); the actors' own lines in the log above say why each ended."""


class Launcher(Protocol):
    """The actors of one run, as ``launch.local.train`` drives them."""

    @property
    def restarts(self) -> int:
        """Restarts of dead actors so far (summary.json: ``actor_restarts``)."""

    def prepare(self) -> None:
        """Called once the learner is built, before it serves (Ray starts here: ``ray.init`` forks, and
        gRPC's threads do not survive a fork)."""

    def start(self, learner: Learner) -> None:
        """Start the actors of ``learner``, which listens (its port, its same-host address, its loop)."""

    def check(self, training: bool) -> None:
        """Called a few times a second: notice dead actors, and have them restarted while ``training``."""

    def all_exited(self) -> bool:
        """Every actor has ended (finished, refused, or dead for good) and none is due to restart."""

    def stop(self, grace_s: float = 5.0) -> None:
        """Wait up to ``grace_s`` for the actors to end on their own (training is over), then end the rest;
        safe to call when ``start`` was not."""
