"""Observations as the policy takes them: one tensor (a flat space) or a dict of them (a Dict or Tuple
space, one per leaf, keyed by its path: ``envs.spaces``). What acts on both goes through these two."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def leaf_map(fn: Callable[[Any], Any], obs: T) -> T:
    """``fn`` of every leaf: of the one tensor, or of each tensor of a dict, keeping the keys."""
    if isinstance(obs, dict):
        return {path: fn(value) for path, value in obs.items()}  # type: ignore[return-value]
    return fn(obs)


def first_leaf(obs: Any) -> Any:
    """A leaf to read the batch's shape and device from (every leaf has the same leading dimensions)."""
    return next(iter(obs.values())) if isinstance(obs, dict) else obs
