"""Run metrics: episode statistics, ``metrics.csv``, TensorBoard events and ``summary.json``."""

from __future__ import annotations

import csv
import json
import math
import threading
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

# metrics.csv columns, in order. Other tools read this file: add columns at the end.
COLUMNS = [
    "iteration", "policy_version", "env_steps", "wall_s", "sps", "episodes", "episode_return_mean",
    "episode_return_mean20", "episode_length_mean", "off_policy_samples", "policy_lag_mean", "policy_lag_max",
    "inference_batch_mean", "collect_s", "train_s", "dropped_transitions", "actors", "lr",
    "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction",
    "wasted_forward_passes", "rejected_rpcs", "torn_reads", "stalls", "torn_reads_used",
]


class EpisodeTracker:
    """Finished episodes from every actor; thread-safe. Records when the running mean first crosses thresholds."""

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
            for r, n in zip(returns.tolist(), lengths.tolist()):
                self._returns.append(r)
                self._lengths.append(n)
                self._recent.append(r)
                self.count += 1
                if len(self._recent) == self.window:
                    mean = sum(self._recent) / self.window
                    for t in self._thresholds:
                        if mean >= t and self.first_reached[_key(t)] is None:
                            self.first_reached[_key(t)] = {"env_steps": env_steps, "wall_s": round(wall_s, 3)}

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
            with self.path.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
                writer.writeheader()
                writer.writerows(rows)
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
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=2, default=_json_default) + "\n")
    tmp.replace(path)


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    raise TypeError(f"not JSON serializable: {type(value)}")
