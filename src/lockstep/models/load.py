"""A trained policy rebuilt from stored parameters: the one way ``lockstep eval``, ``lockstep audit`` and evaluation
while training load one.

The network is the one the run's config names (``models.build_policy``, a user's ``model.policy``
factory included), with the stored parameters, frozen, beside the observation normalizer the
learner served that version with.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lockstep.algo.normalize import ObsNormalizer
from lockstep.config import Config
from lockstep.envs import SpaceSpec
from lockstep.models import Policy, build_policy


class PolicyMismatch(ValueError):
    """The stored parameters do not fit the network the config describes."""


def load_policy(config: Config, observation: SpaceSpec, action: SpaceSpec, parameters: dict[str, Any],
                obs_mean: np.ndarray | None, obs_var: np.ndarray | None, device: torch.device,
                source: str) -> tuple[Policy, ObsNormalizer]:
    """The config's network with ``parameters`` (a state dict read from ``source``), frozen for inference,
    and its normalizer (identity when ``obs_mean`` is None). Raises ``PolicyMismatch`` naming ``source``."""
    model = build_policy(observation, action, config.model, config.env.normalize_images).to(device)
    try:
        model.load_state_dict(parameters)
    except RuntimeError as err:
        raise PolicyMismatch(f"{source} does not hold the network the run's config (model:) describes for "
                             f"{config.env.id}: {str(err).splitlines()[0]}") from err
    model.eval().requires_grad_(False)
    return model, ObsNormalizer(obs_mean, obs_var, config.env.clip_obs, device)
