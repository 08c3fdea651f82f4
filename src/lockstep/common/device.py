"""Which torch device ``--device`` names."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    """``--device``: auto (CUDA when torch sees it, else the CPU), cpu, cuda or cuda:N."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"--device {name} was asked for, but torch sees no CUDA device; use --device auto or cpu")
    return torch.device(name)
