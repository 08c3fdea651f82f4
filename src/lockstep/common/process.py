"""A child process's tie to its parent (local actors, the evaluation process): standard library only."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


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
