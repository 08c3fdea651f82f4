"""lockstep: distributed PPO in the SEED architecture that stays on-policy.

``lockstep.train``, ``lockstep.load_config``, ``lockstep.Config`` and ``lockstep.Policy`` are the
Python API (``lockstep.api``). They load on first use: importing a submodule (an actor process
imports ``lockstep.actor``) never loads torch.
"""

from __future__ import annotations

from typing import Any

_API = {"train": "lockstep.api", "load_config": "lockstep.api", "Config": "lockstep.config",
        "Policy": "lockstep.models", "RecurrentPolicy": "lockstep.models", "SpaceSpec": "lockstep.envs"}

__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    if name in _API:
        import importlib

        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'lockstep' has no attribute {name!r}")
