"""Feedforward policies: state size 0, so each step depends on its observation alone.

``ActorCritic`` is CleanRL's ``ppo.py`` layout (separate actor and critic MLPs on flat observations);
``TorsoActorCritic`` puts a linear policy head and a linear value head on a shared torso (a CNN for
images). Both answer the API of ``policy.Policy`` through ``features``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from lockstep.envs import SpaceSpec
from lockstep.models.networks import layer, mlp
from lockstep.models.policy import Policy


class ActorCritic(Policy):
    """Separate actor and critic MLPs on flat observations (CleanRL's ``ppo.py`` layout and initialization)."""

    def __init__(self, observation: SpaceSpec, action: SpaceSpec, hidden: list[int],
                 activation: str = "tanh", init_log_std: float = 0.0) -> None:
        super().__init__(action, init_log_std)
        obs_dim = int(np.prod(observation.shape))
        self.critic = mlp(obs_dim, hidden, 1, activation, 1.0)
        self.actor = mlp(obs_dim, hidden, self.action_dim, activation, 0.01)

    def features(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = obs.flatten(1)
        return self.actor(flat), self.critic(flat).squeeze(-1)

    def value_after(self, obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return self.critic(obs.flatten(1)).squeeze(-1)  # the actor's half of the pass is not needed


class TorsoActorCritic(Policy):
    """A shared torso (a CNN for images) with a linear policy head and a linear value head."""

    def __init__(self, torso: nn.Module, width: int, action: SpaceSpec, init_log_std: float = 0.0) -> None:
        super().__init__(action, init_log_std)
        self.torso = torso
        self.actor = layer(width, self.action_dim, 0.01)
        self.critic = layer(width, 1, 1.0)

    def features(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.torso(obs)
        return self.actor(hidden), self.critic(hidden).squeeze(-1)
