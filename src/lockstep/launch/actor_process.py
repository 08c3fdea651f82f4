"""The first code a local actor process runs (``processes.ActorProcesses`` spawns it), before any heavy import.

An actor started by ``lockstep train`` must not outlive it. On Linux the kernel ends the actor when its
parent dies (``PR_SET_PDEATHSIG``), but only a parent that dies *after* the request: so it is made here,
first, before numpy, Gymnasium and gRPC load (seconds on a busy host), and then the parent is checked: one
that died in the meantime has left the actor to ``init``, and the actor exits at once. This module imports
the standard library only, and takes its options as a plain dict, so that unpickling them loads nothing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def main(options: dict, log_level: int, parent: int) -> None:
    """Entry point of a spawned actor: die with ``parent`` (its pid), then run the actor with ``options``."""
    die_with_parent(parent)
    from lockstep.actor import ActorOptions, process_main  # numpy, Gymnasium, gRPC: only now

    process_main(ActorOptions(**options), log_level)


def die_with_parent(parent: int) -> None:
    """Ask the kernel for SIGTERM when the parent dies (Linux); exit now if ``parent`` is already gone."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # after the request: a parent that dies from here on is covered by it
        print(f"lockstep actor {os.getpid()}: its parent {parent} is gone; exiting", file=sys.stderr)
        raise SystemExit(1)
