"""Who starts the actors of ``lockstep train`` (``actors.launcher``), and keeps them running.

local   actor processes on this host, spawned and restarted by ``launch.ActorSupervisor``
ray     Ray actors, placed and restarted by Ray (``launchers/ray.py``; the code inside each actor:
        ``launchers/ray_actor.py``, which imports no torch)

The learner runs in the ``lockstep train`` process either way, and ``launch.train`` drives a launcher
through the few calls of ``Launcher``.
"""

from __future__ import annotations

from typing import Protocol


class Launcher(Protocol):
    """The actors of one run, as ``launch.train`` sees them once they are started."""

    @property
    def restarts(self) -> int:
        """Restarts of dead actors so far (summary.json: ``actor_restarts``)."""

    def check(self, training: bool) -> None:
        """Called a few times a second: notice dead actors, and have them restarted while ``training``."""

    def all_exited(self) -> bool:
        """Every actor has ended (finished, refused, or dead for good) and none is due to restart."""

    def stop(self, grace_s: float = 5.0) -> None:
        """Wait up to ``grace_s`` for the actors to end on their own (training is over), then end the rest."""
