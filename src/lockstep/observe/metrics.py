"""Run metrics: episode statistics, ``metrics.csv``, TensorBoard events and ``summary.json``."""

from __future__ import annotations

import bisect
import csv
import io
import json
import math
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lockstep.common.files import atomic_write

# metrics.csv columns, in order. Other tools read this file: add columns at the end.
COLUMNS = [
    "iteration", "policy_version", "env_steps", "wall_s", "sps", "episodes", "episode_return_mean",
    "episode_return_mean20", "episode_length_mean", "off_policy_samples", "policy_lag_mean", "policy_lag_max",
    "inference_batch_mean", "collect_s", "train_s", "dropped_transitions", "actors", "lr",
    "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction",
    "wasted_forward_passes", "rejected_rpcs", "torn_reads", "stalls", "torn_reads_used", "skipped_updates",
    "evicted_actors", "skipped_evaluations", "eval_return_mean", "eval_return_std", "eval_iteration", "eval_env_steps",
    "eval_win_rate_random", "eval_win_rate_oldest", "eval_oldest_version", "team_episodes", "team_return_mean",
    "eval_team_return_mean", "games", "games_decided_before_move", "vtrace_truncated",
    "policy_lag_p50", "policy_lag_p90", "policy_lag_at_bound",
]
# An evaluation while training's columns: empty except in the row written after it finished; its values
# belong to the version of eval_iteration (eval_env_steps), TensorBoard's event for them is at that step.
# A self-play game's also have its win rates against random moves and the oldest pool member, and that
# member's version; a PettingZoo parallel env's its mean team return (eval_return_* are per agent there).
EVAL_COLUMNS = ("eval_return_mean", "eval_return_std", "eval_iteration", "eval_env_steps",
                "eval_win_rate_random", "eval_win_rate_oldest", "eval_oldest_version", "eval_team_return_mean")

POLICY_PREFIX = "policy/"
# a run of several policies: these columns of each policy, in metrics.csv and TensorBoard, as policy/NAME/KEY, after
# COLUMNS (the learner's report writes them; a sweep's objective may name one)
POLICY_COLUMNS = ("version", "samples", "episode_return_mean", "policy_loss", "value_loss", "entropy", "approx_kl",
                  "clip_fraction")
# ... and after every policy's of those (metrics.csv's columns are only ever appended to): its learning rate (0 for a
# frozen policy) and whether it skipped the phase (1: no valid sample, no update; its version moved on unchanged)
POLICY_COLUMNS_ADDED = ("lr", "skipped")


Key = tuple[int, ...]  # where an episode stands in the order of episodes: (step counter, actor id, index)
LAST = 100  # episodes behind episode_return_mean and episode_length_mean


class EpisodeTracker:
    """Finished episodes from every actor, in an order that does not depend on timing; thread-safe.

    Order. Messages, and the episodes they report, arrive in an order that depends on timing. So
    each ``add`` carries a sort key (the learner's: (step counter, actor id)), its i-th episode is
    ordered by (*key, i), and ``add`` only queues episodes: whenever statistics are read (``stats``,
    ``running_mean``, ``reached``, ``state_dict``) the queue is merged, in key order, into the kept
    episodes. Invariants:

    * the windows (the last ``LAST`` episodes, the last ``window``) are the episodes with the largest
      keys of all added, in key order: a function of the set of (key, return, length) added, whatever
      the order of the ``add`` calls and whenever statistics were read;
    * ``first_reached`` is checked episode by episode as the queue is merged, in key order, so which
      episode first crosses a threshold is reproducible wherever the reads happen at points where
      the set of added episodes is fixed. The strict learner reads after training and before it
      publishes the next version, while every actor is held, so there it is. The recorded
      ``env_steps`` (transitions collected by all actors when that episode's message arrived) and
      ``wall_s`` are *not* reproducible: they depend on how far the other actors had got by then.

    The *running mean* is the mean return of the last ``window`` episodes, defined only once
    ``window`` episodes have finished. It is the one quantity behind both "reached a target"
    checks: ``reached`` (the learner's ``run.stop_at_return``) and ``first_reached`` (when the
    running mean first crossed each threshold). A mean of fewer episodes is too noisy to stop on.
    """

    def __init__(self, thresholds: list[float], window: int = 20) -> None:
        self._lock = threading.Lock()
        self.window = window
        self._keep = max(LAST, window)
        self._kept: list[tuple[Key, float, int]] = []  # (key, return, length), key order, the last _keep
        self._queue: list[tuple[Key, float, int, int, float]] = []  # (key, return, length, env_steps, wall_s)
        self._calls = 0  # the key of a call without one: arrival order
        self.count = 0  # episodes merged
        self.first_reached: dict[str, dict[str, float] | None] = {_key(t): None for t in thresholds}
        self._thresholds = sorted(thresholds)

    def add(self, returns: np.ndarray, lengths: np.ndarray, env_steps: int, wall_s: float,
            key: Key | None = None) -> None:
        """Queue one message's finished episodes: returns [e], lengths [e] (in env order).

        ``key``: their place in the order; None orders by the calls (arrival order, fine in one process).
        ``env_steps`` and ``wall_s`` are what ``first_reached`` records if one of them crosses a threshold.
        """
        if not len(returns):
            return
        with self._lock:
            base = (self._calls,) if key is None else tuple(int(k) for k in key)
            self._calls += 1
            for i, (r, n) in enumerate(zip(returns.tolist(), lengths.tolist(), strict=True)):
                self._queue.append(((*base, i), r, n, env_steps, wall_s))

    def _merge(self) -> None:
        """Move the queue into the kept episodes in key order, checking the thresholds after each (lock held)."""
        if not self._queue:
            return
        queue, self._queue = sorted(self._queue, key=lambda e: e[0]), []
        kept = self._kept
        for key, r, n, env_steps, wall_s in queue:
            if kept and key < kept[-1][0]:  # only when a read came before an earlier key's message
                bisect.insort(kept, (key, r, n), key=lambda e: e[0])
            else:
                kept.append((key, r, n))
            self.count += 1
            if any(self.first_reached[_key(t)] is None for t in self._thresholds):
                mean = self._running_mean()
                for t in self._thresholds:
                    if mean >= t and self.first_reached[_key(t)] is None:  # NaN (a partial window) never is
                        self.first_reached[_key(t)] = {"env_steps": env_steps, "wall_s": round(wall_s, 3)}
        del kept[:-self._keep]

    def running_mean(self) -> float:
        """Mean return of the last ``window`` episodes in key order; NaN while fewer than ``window`` have finished."""
        with self._lock:
            self._merge()
            return self._running_mean()

    def reached(self, target: float) -> bool:
        """True when a full window of episodes (the same ordered window) has a mean return of at least ``target``."""
        return self.running_mean() >= target

    def _running_mean(self) -> float:
        if len(self._kept) < self.window:
            return math.nan
        return sum(r for _, r, _ in self._kept[-self.window:]) / self.window  # summed in key order

    def state_dict(self) -> dict:
        with self._lock:
            self._merge()
            kept = self._kept
            return {"returns": [r for _, r, _ in kept], "lengths": [n for _, _, n in kept],
                    "keys": [list(k) for k, _, _ in kept], "recent": [r for _, r, _ in kept[-self.window:]],
                    "count": self.count, "first_reached": dict(self.first_reached)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state_dict()``; a state without keys keeps its order, before every new episode."""
        returns, lengths = list(state["returns"]), list(state["lengths"])
        keys = [tuple(k) for k in state["keys"]] if "keys" in state else [(-1, i) for i in range(len(returns))]
        with self._lock:
            self._merge()
            self._kept = sorted(self._kept + list(zip(keys, returns, lengths)), key=lambda e: e[0])
            del self._kept[:-self._keep]
            self.count = state["count"]
            self.first_reached.update(state["first_reached"])

    def stats(self) -> dict[str, float]:
        """The metrics.csv columns, over the ordered windows. ``episode_return_mean20`` is the mean of the
        last ``window`` (20) episodes, or of all of them while there are fewer: a curve from the first
        episode on. It is not the running mean that ``reached`` and ``first_reached`` use, which waits
        for a full window."""
        with self._lock:
            self._merge()
            last = self._kept[-LAST:]
            return {
                "episodes": self.count,
                "episode_return_mean": _mean([r for _, r, _ in last]),
                "episode_return_mean20": _mean([r for _, r, _ in self._kept[-self.window:]]),
                "episode_length_mean": _mean([n for _, _, n in last]),
            }


def _key(threshold: float) -> str:
    return f"{threshold:g}"


def _mean(values) -> float:
    return float(np.mean(values)) if len(values) else math.nan


def add_counts(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Two histograms of lag (samples per lag 0, 1, ...) added, the shorter padded with zeros."""
    total = np.zeros(max(len(a), len(b)), np.int64)
    total[:len(a)] += a
    total[:len(b)] += b
    return total


def lag_distribution(counts: Sequence[int], bound: int | None) -> dict[str, float | int | None]:
    """The lag's distribution over one batch's samples (``counts[k]``: the samples of lag k) as metrics.csv's
    columns: its median and 90th percentile in versions, and the fraction of the samples at the strategy's bound
    (how often the bound held an actor back, or nearly: None for strict, whose bound is 0, and an unbounded
    design); TensorBoard gets the fraction of every lag too (``policy_lag/K``). None where nothing was trained."""
    total = sum(counts)
    if not total:
        return {"policy_lag_p50": None, "policy_lag_p90": None, "policy_lag_at_bound": None}
    cumulative = np.cumsum(counts)
    return {
        "policy_lag_p50": int(np.searchsorted(cumulative, 0.5 * total)),
        "policy_lag_p90": int(np.searchsorted(cumulative, 0.9 * total)),
        "policy_lag_at_bound": (counts[bound] / total if bound < len(counts) else 0.0) if bound else None,
        **{f"policy_lag/{k}": n / total for k, n in enumerate(counts)},
    }


class MetricsWriter:
    """Writes one row per iteration to metrics.csv and TensorBoard.

    ``resume_after``: continue a run whose checkpoint is at that iteration, dropping
    any rows written after it, so the file has no gap and no duplicate.
    """

    def __init__(self, run_dir: Path, tensorboard: bool = True, resume_after: int | None = None,
                 extra: list[str] | tuple[str, ...] = ()) -> None:
        self.path = run_dir / "metrics.csv"
        self.columns = [*COLUMNS, *extra]  # extra: a run's own columns after the standard ones (several policies)
        exists = resume_after is not None and self.path.exists()
        if exists:
            with self.path.open(newline="") as f:
                rows = [r for r in csv.DictReader(f) if int(r["iteration"]) <= resume_after]
            text = io.StringIO(newline="")
            writer = csv.DictWriter(text, fieldnames=self.columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
            atomic_write(self.path, text.getvalue())
        self._file = self.path.open("a" if exists else "w", newline="")
        self._csv = csv.DictWriter(self._file, fieldnames=self.columns, extrasaction="ignore")
        if not exists:
            self._csv.writeheader()
        self._tb = None
        if tensorboard:
            from tensorboard.compat.proto import event_pb2, summary_pb2
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            self._tb = EventFileWriter(str(run_dir))  # events.out.tfevents.*, written by a background thread
            self._event, self._summary = event_pb2.Event, summary_pb2.Summary

    def write(self, row: dict[str, Any]) -> None:
        self._csv.writerow({k: _fmt(row.get(k)) for k in self.columns})
        self._file.flush()
        if self._tb is not None:
            # One event per row with every scalar in it (TensorBoard reads each value as its own tag's
            # point): a tenth of the cost of an event per scalar, and the row is on the training path.
            # an action of several parts' entropies; the fraction of the samples of each lag
            per_part = [key for key in row if key.startswith(("entropy/", "policy_lag/"))]
            self._scalars(row, [key for key in self.columns[3:] if key not in EVAL_COLUMNS] + per_part,
                          int(row["env_steps"]))
            if row.get("eval_env_steps") is not None:
                self._scalars(row, EVAL_COLUMNS[:2] + EVAL_COLUMNS[4:6] + EVAL_COLUMNS[7:], int(row["eval_env_steps"]))

    def _scalars(self, row: dict[str, Any], keys, step: int) -> None:
        """One TensorBoard event at ``step`` with the row's numbers of ``keys``."""
        values = [self._summary.Value(tag=f"lockstep/{key}", simple_value=float(value)) for key in keys
                  if isinstance(value := row.get(key), (int, float)) and not math.isnan(value)]
        self._tb.add_event(self._event(wall_time=time.time(), step=step, summary=self._summary(value=values)))

    def sync(self) -> None:
        """Make every row written so far durable (fsync): before a checkpoint that claims them."""
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        self.sync()
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def _fmt(value: Any) -> Any:
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:.6g}"
    return value


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    atomic_write(path, json.dumps(summary, indent=2, default=_json_default) + "\n")


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    raise TypeError(f"not JSON serializable: {type(value)}")
