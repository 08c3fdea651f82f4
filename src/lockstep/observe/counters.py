"""The counters and clocks of a run: totals the learner counts, its training clock, and how fast a published
version releases the requests held for it. The learner's rooms update them; the report of each iteration
(``learner.report``) reads them into ``metrics.csv`` and ``summary.json``.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any


@dataclass
class Counters:
    """Totals over the run that the learner's own code counts (inference counts come from the backend)."""

    stalls: int = 0  # phases that collected for longer than the stall rule allows (learner.session.StallRule)
    dropped_transitions: int = 0  # collected, then discarded: unfinished unrolls, and what a resume or a stop lost
    off_policy_samples: int = 0
    transitions_collected: int = 0  # every action recorded; = trained + dropped at the end of a run
    collected_steps: int = 0  # transitions whose outcome came back: first_reached counts these
    skipped_updates: int = 0  # gradient steps not taken: their loss or gradient was not finite (ppo.optimize)
    evicted_actors: int = 0  # sessions ended by sync.step_deadline_s
    skipped_evaluations: int = 0  # evaluations due while the previous one still ran (run.eval_every)
    opponent_moves: int = 0  # self-play: moves the learner played for opponents (inference only, never trained)
    # self-play: games the opponents' moves decided before the learning player moved (no episode, no sample)
    games_decided_before_move: int = 0
    # seconds the actors' requests waited on the gate once training had started, summed over actors: divided by
    # (actors x wall_s), the share of the actors' time they were held (for training, the lag bound, a phase)
    actors_held_s: float = 0.0


# Counter columns of metrics.csv that hold an iteration's increase of a run total.
INCREASES = ("dropped_transitions", "stalls", "wasted_forward_passes", "rejected_rpcs", "torn_reads",
             "torn_reads_used", "skipped_updates", "evicted_actors", "skipped_evaluations")


# Inference counters that a resumed run carries on from its checkpoint.
CARRIED = ("wasted_forward_passes", "rejected_rpcs", "torn_reads", "torn_reads_used")


class Clock:
    """Wall seconds of training, across resumes: from the start of the first phase, plus earlier runs."""

    def __init__(self) -> None:
        self.offset = 0.0  # seconds of the run before a resume
        self._t0: float | None = None
        self.stopped_at: float | None = None  # wall_s when training ended, before shutdown work
        self.cpu_at_start = time.process_time()  # the process's CPU seconds when training started

    @property
    def started(self) -> bool:
        return self._t0 is not None

    def start(self) -> None:
        if self._t0 is None:
            self._t0 = time.perf_counter()
            self.cpu_at_start = time.process_time()

    @property
    def wall_s(self) -> float:
        if self.stopped_at is not None:
            return self.stopped_at
        return self.offset + (0.0 if self._t0 is None else time.perf_counter() - self._t0)

    def stop(self) -> None:
        self.stopped_at = self.wall_s


class ReleaseLatency:
    """Per phase, the seconds from publishing version v until the last request it released resumed.

    ``published(v)`` is stamped on the trainer thread just before the gate releases the requests held
    for v; each released request calls ``resumed(v)`` on the event loop once its coroutine runs again.
    A phase's figure is its latest resumption: how long the slowest held actor waited after v existed.
    It includes the loop's work between the wake-ups (the earlier released requests' way to the
    batcher), which is what grows with the number of actors. Requests released by anything but a
    publish (the first phase's start) have no stamp and are not counted.

    Releases of v are settled at ``published(v + 2)`` (a pipelined run may publish v + 1 before every
    release of v has resumed) and by ``summary``. One float per phase is kept for the percentiles.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stamps: dict[int, float] = {}  # version -> perf_counter() at its publish, until settled
        self._latest: dict[int, float] = {}  # version -> seconds to its latest resumption so far
        self.per_phase: list[float] = []  # settled phases' seconds, in publish order
        self.released = 0  # resumptions counted

    def published(self, version: int) -> None:
        now = time.perf_counter()
        with self._lock:
            self._settle(before=version - 1)
            self._stamps[version] = now

    def resumed(self, version: int) -> None:
        now = time.perf_counter()
        with self._lock:
            stamp = self._stamps.get(version)
            if stamp is not None:
                self._latest[version] = max(self._latest.get(version, 0.0), now - stamp)
                self.released += 1

    def summary(self) -> dict[str, Any]:
        """For summary.json: phases measured, requests released, and p50 / p99 / max / mean in ms."""
        with self._lock:
            self._settle(before=None)
            ms = sorted(1000 * s for s in self.per_phase)

        def rank(q: float) -> float | None:  # nearest rank: a value that was measured
            return round(ms[max(0, math.ceil(q * len(ms)) - 1)], 3) if ms else None
        return {"phases": len(ms), "released": self.released, "p50_ms": rank(0.5), "p99_ms": rank(0.99),
                "max_ms": rank(1.0), "mean_ms": round(sum(ms) / len(ms), 3) if ms else None}

    def _settle(self, before: int | None) -> None:
        for version in sorted(v for v in self._stamps if before is None or v < before):
            del self._stamps[version]
            if version in self._latest:
                self.per_phase.append(self._latest.pop(version))
