"""Run metrics: episode statistics, ``metrics.csv``, TensorBoard events and ``summary.json``."""

from __future__ import annotations

import csv
import io
import json
import math
import threading
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

from lockstep.files import atomic_write

# metrics.csv columns, in order. Other tools read this file: add columns at the end.
COLUMNS = [
    "iteration", "policy_version", "env_steps", "wall_s", "sps", "episodes", "episode_return_mean",
    "episode_return_mean20", "episode_length_mean", "off_policy_samples", "policy_lag_mean", "policy_lag_max",
    "inference_batch_mean", "collect_s", "train_s", "dropped_transitions", "actors", "lr",
    "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction",
    "wasted_forward_passes", "rejected_rpcs", "torn_reads", "stalls", "torn_reads_used",
]


class EpisodeTracker:
    """Finished episodes from every actor; thread-safe.

    The *running mean* is the mean return of the last ``window`` episodes, defined only once
    ``window`` episodes have finished. It is the one quantity behind both "reached a target"
    checks: ``reached`` (the learner's ``run.stop_at_return``) and ``first_reached`` (when the
    running mean first crossed each threshold). A mean of fewer episodes is too noisy to stop on.
    """

    def __init__(self, thresholds: list[float], window: int = 20) -> None:
        self._lock = threading.Lock()
        self._returns: deque[float] = deque(maxlen=100)
        self._lengths: deque[int] = deque(maxlen=100)
        self._recent: deque[float] = deque(maxlen=window)
        self.window = window
        self.count = 0
        self.first_reached: dict[str, dict[str, float] | None] = {_key(t): None for t in thresholds}
        self._thresholds = sorted(thresholds)

    def add(self, returns: np.ndarray, lengths: np.ndarray, env_steps: int, wall_s: float) -> None:
        if not len(returns):
            return
        with self._lock:
            for r, n in zip(returns.tolist(), lengths.tolist(), strict=True):
                self._returns.append(r)
                self._lengths.append(n)
                self._recent.append(r)
                self.count += 1
                mean = self._running_mean()
                for t in self._thresholds:
                    if mean >= t and self.first_reached[_key(t)] is None:  # NaN (a partial window) never is
                        self.first_reached[_key(t)] = {"env_steps": env_steps, "wall_s": round(wall_s, 3)}

    def running_mean(self) -> float:
        """Mean return of the last ``window`` episodes; NaN while fewer than ``window`` have finished."""
        with self._lock:
            return self._running_mean()

    def reached(self, target: float) -> bool:
        """True when a full window of episodes has a mean return of at least ``target``."""
        return self.running_mean() >= target

    def _running_mean(self) -> float:
        if len(self._recent) < self.window:
            return math.nan
        return sum(self._recent) / self.window

    def state_dict(self) -> dict:
        with self._lock:
            return {"returns": list(self._returns), "lengths": list(self._lengths), "recent": list(self._recent),
                    "count": self.count, "first_reached": dict(self.first_reached)}

    def load_state_dict(self, state: dict) -> None:
        with self._lock:
            self._returns.extend(state["returns"])
            self._lengths.extend(state["lengths"])
            self._recent.extend(state["recent"])
            self.count = state["count"]
            self.first_reached.update(state["first_reached"])

    def stats(self) -> dict[str, float]:
        """The metrics.csv columns. ``episode_return_mean20`` is the mean of the last ``window`` (20)
        episodes, or of all of them while there are fewer: a curve from the first episode on. It is
        not the running mean that ``reached`` and ``first_reached`` use, which waits for a full window."""
        with self._lock:
            return {
                "episodes": self.count,
                "episode_return_mean": _mean(self._returns),
                "episode_return_mean20": _mean(self._recent),
                "episode_length_mean": _mean(self._lengths),
            }


def _key(threshold: float) -> str:
    return f"{threshold:g}"


def _mean(values) -> float:
    return float(np.mean(values)) if len(values) else math.nan


class MetricsWriter:
    """Writes one row per iteration to metrics.csv and TensorBoard.

    ``resume_after``: continue a run whose checkpoint is at that iteration, dropping
    any rows written after it, so the file has no gap and no duplicate.
    """

    def __init__(self, run_dir: Path, tensorboard: bool = True, resume_after: int | None = None) -> None:
        self.path = run_dir / "metrics.csv"
        exists = resume_after is not None and self.path.exists()
        if exists:
            with self.path.open(newline="") as f:
                rows = [r for r in csv.DictReader(f) if int(r["iteration"]) <= resume_after]
            text = io.StringIO(newline="")
            writer = csv.DictWriter(text, fieldnames=COLUMNS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
            atomic_write(self.path, text.getvalue())
        self._file = self.path.open("a" if exists else "w", newline="")
        self._csv = csv.DictWriter(self._file, fieldnames=COLUMNS, extrasaction="ignore")
        if not exists:
            self._csv.writeheader()
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(run_dir))

    def write(self, row: dict[str, Any]) -> None:
        self._csv.writerow({k: _fmt(row.get(k)) for k in COLUMNS})
        self._file.flush()
        if self._tb is not None:
            step = int(row["env_steps"])
            for key in COLUMNS[3:]:
                value = row.get(key)
                if isinstance(value, (int, float)) and not (isinstance(value, float) and math.isnan(value)):
                    self._tb.add_scalar(f"lockstep/{key}", value, step)

    def close(self) -> None:
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
