"""The first code a local actor process runs (``processes.ActorProcesses`` spawns it), before any heavy import.

An actor started by ``lockstep train`` must not outlive it. On Linux the kernel ends the actor when its
parent dies (``PR_SET_PDEATHSIG``), but only a parent that dies *after* the request: so it is made here,
first, before numpy, Gymnasium and gRPC load (seconds on a busy host), and then the parent is checked: one
that died in the meantime has left the actor to ``init``, and the actor exits at once. This module imports
the standard library only, and takes its options as a plain dict, so that unpickling them loads nothing.
"""

from __future__ import annotations

import multiprocessing

from lockstep.common.process import die_with_parent


def main(options: dict, log_level: int, parent: int) -> None:
    """Entry point of a spawned actor: die with ``parent`` (its pid), then run the actor with ``options``."""
    die_with_parent(parent)
    # spawned as a daemon, which multiprocessing forbids to start processes; an actor whose envs run in processes
    # of their own (actors.vector async) starts them, and they die with it as it dies with its parent
    multiprocessing.current_process().daemon = False
    from lockstep.actor import ActorOptions, process_main  # numpy, Gymnasium, gRPC: only now

    process_main(ActorOptions(**options), log_level)
