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


def latest(directory: Path) -> Path | None:
    """The newest checkpoint in ``directory`` by iteration number, or None."""
    found = sorted(directory.glob("iter_*.pt"))
    return found[-1] if found else None
