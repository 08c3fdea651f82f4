"""The Python API: train from code, with the built-in policies or your own network.

    import lockstep

    config = lockstep.load_config("cartpole-cleanrl")    # a preset name or a YAML file
    config.ppo.total_steps = 100_000
    summary = lockstep.train(config, policy=make_policy)  # make_policy(observation, action, model) -> Policy

``policy`` is a factory, defined at the top level of a module or a script, so that the audit
(``lockstep audit``), evaluation (``lockstep eval``) and a resumed run can build the same network
again from the run's config.yaml: ``train`` records where it lives in ``model.policy``. The protocol
a policy follows is ``lockstep.Policy`` (docs/custom-policy.md).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lockstep import config as config_lib
from lockstep.config import Config


def load_config(source: str | Path | None = None, **overrides: Any) -> Config:
    """A preset (by name) or a YAML file, or the built-in defaults; ``overrides`` by dotted key with
    ``.`` written as ``__``: ``load_config("cartpole-cleanrl", ppo__lr=1e-3)``."""
    config = config_lib.load(source) if source is not None else Config()
    for key, value in overrides.items():
        config_lib.set_value(config, key.replace("__", "."), value)
    return config


def policy_reference(factory: Callable[..., Any]) -> str:
    """Where ``factory`` lives, as ``model.policy`` records it: ``module:name``, or ``file.py:name`` for a
    factory defined in a script. A lambda or a function defined inside another cannot be found again."""
    name = getattr(factory, "__qualname__", "")
    if not name or "<" in name:
        raise ValueError(f"policy {factory!r} must be a function or class defined at the top level of a module or "
                         "script (lockstep builds it again from the run's config for the audit and evaluation)")
    module = inspect.getmodule(factory)
    if module is None:
        raise ValueError(f"cannot tell which module defines policy {factory!r}")
    if module.__name__ == "__main__":
        path = getattr(module, "__file__", None)
        if path is None:
            raise ValueError("a policy defined in an interactive session cannot be built again from the run's "
                             "config; define it in a module or script file")
        return f"{Path(path).resolve()}:{name}"
    return f"{module.__name__}:{name}"


def train(config: Config | str | Path, policy: Callable[..., Any] | None = None,
          run_dir: str | Path | None = None) -> dict[str, Any]:
    """Train as ``lockstep train`` does (a learner here, its actors as ``actors.transport`` says) and
    return the run's summary (summary.json). ``policy``: your network's factory (module docstring).
    Raises ``lockstep.learner.RunFailed`` from the error when the learner's own code failed (your network's
    forward pass, say): summary.json records it, and the run's books end at its last completed iteration."""
    from lockstep.launch.local import train as launch_train  # torch: loaded only when training

    if not isinstance(config, Config):
        config = load_config(config)
    if policy is not None:
        config.model.policy = policy_reference(policy)
    if run_dir is not None:
        config.run.run_dir = str(run_dir)
    run = config_lib.name_run(config)
    config.validate()
    return launch_train(config, run)
