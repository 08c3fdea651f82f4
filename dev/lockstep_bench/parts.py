"""``python -m lockstep_bench.parts [--out JSON] [--collect-only] LOCKSTEP_TRAIN_ARGS ...``: where a learner's time
per message goes, in thread CPU.

Runs ``lockstep train`` (through ``lockstep_bench.train``, so ``--collect-only`` works) with each function of
``PARTS`` wrapped in the learner process: every call adds the CPU time of the calling thread
(``time.thread_time``, kernel time included) to that function's total. At exit it prints a table (calls,
seconds, µs per call) and writes it to ``--out`` as JSON. Actor processes are not timed.

How to read it: the functions nest (``Session.step`` holds ``Batcher.infer``, which holds
``PolicySnapshot.step``), so totals do not add up. A coroutine's total includes what its thread ran while it
was suspended: for ``_Peer.frame`` (the shared-memory server waiting for an actor's next frame) that is the
event loop's own work of the wake-up (``EpollSelector.select``, the ``_Peer._readable`` callback, the task's
resumption), not the wait itself, which costs no CPU. Thread CPU rather than wall time, so that the figures
of two transports compare the work done, not the waits between. A timed call costs ~1.4 µs more (two
``thread_time`` reads), which nested parts add up.

    python -m lockstep_bench.parts --out parts.json --collect-only --config C.yaml --transport shm --run-dir D
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import json
import sys
import time
from pathlib import Path
from typing import Any

# (module, class or None for a module-level function, name): the per-message path of each transport
PARTS = (
    ("lockstep.learner.session", "Session", "step"),
    ("lockstep.learner.inference", "Batcher", "infer"),
    ("lockstep.learner.inference", "PolicySnapshot", "step"),
    ("lockstep.actor", "EnvLoop", "step"),  # in-process actors only: the env runs on the learner's thread
    ("lockstep.actor.inprocess", None, "check_step"),
    ("lockstep.transport.shm.server", "ShmFraming", "decode"),
    ("lockstep.transport.shm.server", None, "check_step"),
    ("lockstep.transport.shm.server", "ShmFraming", "reply"),
    ("lockstep.transport.shm.server", "_Peer", "frame"),
    ("lockstep.transport.shm.server", "_Peer", "_readable"),
    ("lockstep.transport.shm.server", "_Peer", "send"),
    ("selectors", "EpollSelector", "select"),
    ("lockstep.transport.grpc.server", None, "_deserialize"),  # grpc.aio calls it per request, on the loop
    ("lockstep.transport.grpc.server", "GrpcFraming", "decode"),
    ("lockstep.transport.grpc.server", "GrpcFraming", "reply"),
    ("lockstep.learner.trainer", "Trainer", "train"),
)


class Timers:
    """Thread-CPU totals and call counts per wrapped function."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def wrap(self, owner: Any, name: str, label: str) -> None:
        """Replace ``owner.name`` (a class or a module) by a timed wrapper."""
        fn = getattr(owner, name)
        self.seconds[label], self.calls[label] = 0.0, 0
        clock = time.thread_time

        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def timed(*args, **kwargs):
                start = clock()
                try:
                    return await fn(*args, **kwargs)
                finally:
                    self.seconds[label] += clock() - start
                    self.calls[label] += 1
        else:
            @functools.wraps(fn)
            def timed(*args, **kwargs):
                start = clock()
                try:
                    return fn(*args, **kwargs)
                finally:
                    self.seconds[label] += clock() - start
                    self.calls[label] += 1
        setattr(owner, name, timed)

    def rows(self) -> list[dict[str, Any]]:
        """One row per function that was called, the largest total first."""
        rows = [{"part": label, "calls": self.calls[label], "seconds": round(seconds, 4),
                 "us_per_call": round(1e6 * seconds / self.calls[label], 1)}
                for label, seconds in self.seconds.items() if self.calls[label]]
        return sorted(rows, key=lambda row: -row["seconds"])


def install(parts=PARTS) -> Timers:
    timers = Timers()
    for module, cls, name in parts:
        owner = importlib.import_module(module)
        if cls is not None:
            owner = getattr(owner, cls)
        timers.wrap(owner, name, f"{cls}.{name}" if cls else f"{module.rsplit('.', 1)[-1]}.{name}")
    return timers


def markdown(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| part | calls | thread CPU s | µs per call |", "|---|---|---|---|"]
    return lines + [f"| `{r['part']}` | {r['calls']:,} | {r['seconds']:.3f} | {r['us_per_call']:,.1f} |" for r in rows]


def main(argv: list[str] | None = None) -> int:
    own = argparse.ArgumentParser(prog="python -m lockstep_bench.parts", add_help=False)  # -h: lockstep train's
    own.add_argument("--out", type=Path)
    args, rest = own.parse_known_args(argv)
    timers = install()
    from lockstep_bench import train

    try:
        return train.main(rest)
    finally:  # also when the run failed: what it did until then
        rows = timers.rows()
        print("\n".join(markdown(rows)), file=sys.stderr)
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":  # not in the actor processes, which import this module as __mp_main__
    sys.exit(main())
