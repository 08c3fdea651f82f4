"""Checkpoints: everything a resumed run continues from, written atomically, loaded without pickled code.

A checkpoint holds only tensors, numbers, strings and plain containers (numpy arrays
travel as tensors, the config as a plain dict), so ``torch.load(weights_only=True)``
reads it and a checkpoint from elsewhere cannot run code.

The ``Checkpointer`` owns the policy: a periodic checkpoint every N iterations
and/or every M minutes, the newest K kept, and a final one at the end of a run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lockstep.common.files import atomic_write

_ARRAY = "__ndarray__"  # marks a numpy array stored as a tensor, so it loads back as an array


def _pack(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return {_ARRAY: torch.from_numpy(np.array(value))}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _pack(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_pack(v) for v in value)
    return value


def _unpack(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {_ARRAY}:
            return value[_ARRAY].numpy()
        return {k: _unpack(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_unpack(v) for v in value)
    return value


def save(state: dict, path: Path) -> Path:
    return atomic_write(path, lambda f: torch.save(_pack(state), f))


def load(path: Path, device: torch.device | str = "cpu") -> dict:
    return _unpack(torch.load(path, map_location=device, weights_only=True))


def periodic_path(directory: Path, iteration: int) -> Path:
    return directory / f"iter_{iteration:06d}.pt"


def prune(directory: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` periodic checkpoints."""
    found = sorted(directory.glob("iter_*.pt"))
    for old in found[:max(0, len(found) - keep)]:
        old.unlink()


def newest(directory: Path) -> tuple[Path, dict] | None:
    """The checkpoint with the highest iteration (periodic or final), loaded; None if there is none."""
    best = None
    for path in [*directory.glob("iter_*.pt"), directory / "final.pt"]:
        if path.exists():
            state = load(path)
            if best is None or state["trainer"]["iteration"] > best[1]["trainer"]["iteration"]:
                best = (path, state)
    return best


class Checkpointer:
    """When to checkpoint and how many to keep: every ``every`` iterations and/or ``minutes`` minutes, last ``keep``."""

    def __init__(self, directory: Path, every: int = 0, minutes: float = 0.0, keep: int = 3) -> None:
        self.directory, self.every, self.minutes, self.keep = directory, every, minutes, keep
        self._last = time.monotonic()

    def due(self, iteration: int) -> bool:
        by_count = bool(self.every) and iteration % self.every == 0
        by_time = bool(self.minutes) and time.monotonic() - self._last >= 60 * self.minutes
        return by_count or by_time

    def save_periodic(self, state: dict, iteration: int) -> Path:
        path = save(state, periodic_path(self.directory, iteration))
        prune(self.directory, self.keep)
        self._last = time.monotonic()
        return path

    def save_final(self, state: dict) -> Path:
        return save(state, self.directory / "final.pt")

    def newest(self) -> tuple[Path, dict]:
        found = newest(self.directory)
        if found is None:
            raise FileNotFoundError(f"nothing to resume: no checkpoint in {self.directory}")
        return found
