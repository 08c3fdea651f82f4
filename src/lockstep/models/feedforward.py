"""Feedforward policies: state size 0, so each step depends on its observation alone.

``ActorCritic`` is CleanRL's ``ppo.py`` layout (separate actor and critic MLPs on flat observations);
``LeafActorCritic`` is the same on a Dict or Tuple observation, after the per-leaf encoders;
``TorsoActorCritic`` puts a linear policy head and a linear value head on a shared torso (a CNN for
images). All answer the API of ``policy.Policy`` through ``features``.
"""

from __future__ import annotations

import torch
from torch import nn

from lockstep.envs import SpaceSpec
from lockstep.envs.spaces import GLOBAL_LEAF
from lockstep.models.encoders import LeafEncoders, flat_encoder
from lockstep.models.networks import layer, mlp
from lockstep.models.policy import Policy


class ActorCritic(Policy):
    """Separate actor and critic MLPs on flat observations (CleanRL's ``ppo.py`` layout and initialization)."""

    def __init__(self, observation: SpaceSpec, action: SpaceSpec, hidden: list[int],
                 activation: str = "tanh", init_log_std: float = 0.0) -> None:
        super().__init__(action, init_log_std)
        self.encode, obs_dim = flat_encoder(observation)  # a Discrete observation's one-hot, else None
        self.critic = mlp(obs_dim, hidden, 1, activation, 1.0)
        self.actor = mlp(obs_dim, hidden, self.action_dim, activation, 0.01)

    def _flat(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.flatten(1) if self.encode is None else self.encode(obs)  # [B, obs_dim]

    def features(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = self._flat(obs)
        return self.actor(flat), self.critic(flat).squeeze(-1)

    def value_after(self, obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        return self.critic(self._flat(obs)).squeeze(-1)  # the actor's half of the pass is not needed


class LeafActorCritic(Policy):
    """Separate actor and critic MLPs on the features of a Dict or Tuple observation's per-leaf encoders
    (``encoders.LeafEncoders``), initialized as ``ActorCritic``'s: Stable-Baselines3's ``MultiInputPolicy``
    layout, one features extractor under separate policy and value networks.

    A tree of vectors (Box, MultiBinary, one-hot Discrete leaves) has encoders without parameters: the two
    MLPs see the leaves' values side by side, as ``ActorCritic`` sees a flat vector, and nothing the value
    loss trains moves the policy. An image leaf's CNN is the one part both share (CleanRL's Atari agent,
    Stable-Baselines3's ``share_features_extractor``): docs/architecture.md#dict-and-tuple-observations
    gives the measurement. The value loss trains that CNN too.

    The actor never reads a ``global_state`` leaf (``envs.pettingzoo``: the env's state, for a centralized
    critic), so that acting needs the agent's own observation alone; with ``critic_input`` global the critic
    reads it beside every other leaf (MAPPO's critic: the state, the agent's one-hot id and its own observation),
    with ``own`` it reads what the actor reads.

    Its state-dict keys (``encoders.*``, ``actor.*``, ``critic.*``) are layout 2 of a tree's feedforward
    policy; layout 1, a trunk MLP shared by a linear policy head and a linear value head (``torso.*``, its
    heads ``actor.weight`` and ``critic.weight``), is refused by name when loaded, not mis-loaded.
    """

    def __init__(self, observation: SpaceSpec, action: SpaceSpec, hidden: list[int],
                 activation: str = "tanh", init_log_std: float = 0.0, critic_input: str = "own") -> None:
        super().__init__(action, init_log_std)
        self.encoders = LeafEncoders(observation)
        paths = self.encoders.paths
        if critic_input == "global" and GLOBAL_LEAF not in paths:
            raise ValueError(f"model.critic_input global reads the observation's {GLOBAL_LEAF!r} leaf, which a "
                             f"PettingZoo parallel env's slots carry with it; this observation has {list(paths)}")
        # positions of the leaves each MLP reads, in the spec's order
        self.actor_leaves = tuple(i for i, path in enumerate(paths) if path != GLOBAL_LEAF)
        self.critic_leaves = tuple(range(len(paths))) if critic_input == "global" else self.actor_leaves
        self.critic = mlp(self._width(self.critic_leaves), hidden, 1, activation, 1.0)
        self.actor = mlp(self._width(self.actor_leaves), hidden, self.action_dim, activation, 0.01)

    def _width(self, leaves: tuple[int, ...]) -> int:
        return sum(self.encoders.widths[self.encoders.paths[i]] for i in leaves)

    def _inputs(self, parts: list[torch.Tensor], leaves: tuple[int, ...]) -> torch.Tensor:
        return torch.cat([parts[i] for i in leaves], -1)  # [B, width of the leaves]

    def features(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        parts = self.encoders.features(obs)
        actor_in = self._inputs(parts, self.actor_leaves)
        critic_in = actor_in if self.critic_leaves == self.actor_leaves else self._inputs(parts, self.critic_leaves)
        return self.actor(actor_in), self.critic(critic_in).squeeze(-1)

    def value_after(self, obs: dict[str, torch.Tensor], state: torch.Tensor) -> torch.Tensor:
        # the actor's half of the pass is not needed
        return self.critic(self._inputs(self.encoders.features(obs), self.critic_leaves)).squeeze(-1)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args) -> None:
        # torch calls this hook wherever the policy sits, so every load (a resume, eval, audit) passes here
        if any(key.startswith(f"{prefix}torso.") for key in state_dict):
            raise RuntimeError(
                "these parameters are layout 1 of a Dict or Tuple observation's MLP policy (a trunk shared by the "
                "policy and value heads: torso.*, actor.weight), saved before lockstep gave structured observations "
                "separate actor and critic networks (layout 2: encoders.*, actor.N.*, critic.N.*); they cannot be "
                "loaded into this network: train the run again (a checkpoint of layout 1 does not resume either)")
        super()._load_from_state_dict(state_dict, prefix, *args)


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
