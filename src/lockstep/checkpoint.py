"""Checkpoints: the trainer's full state, written atomically (temporary file, then rename)."""

from __future__ import annotations

import os
from pathlib import Path

import torch


def save(state: dict, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)
    return path


def load(path: Path, device: torch.device | str = "cpu") -> dict:
    return torch.load(path, map_location=device, weights_only=False)


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
