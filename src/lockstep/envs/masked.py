"""Partially observed control: an env with its velocities hidden, for recurrent policies.

``make_masked(env_id)`` is what the env id ``masked:ENV`` builds (``masked:CartPole-v1``): ``gym.make(env_id)``
with the observation cut down to the entries ``KEPT`` lists for it, so that a policy must infer velocities
from what it remembers. The observation stays a float32 Box with the inner env's bounds on the kept entries;
actions, rewards and the reward threshold are the inner env's. To mask another env, add a line to ``KEPT``.
"""

from __future__ import annotations

import difflib

import gymnasium as gym
import numpy as np

KEPT: dict[str, tuple[int, ...]] = {
    "CartPole-v1": (0, 2),  # cart position, pole angle (of position, velocity, angle, angular velocity)
    "Pendulum-v1": (0, 1),  # cos and sin of the angle (of cos, sin, angular velocity)
}


class KeepEntries(gym.ObservationWrapper):
    """Observe only the entries ``indices`` of a 1-D Box observation."""

    def __init__(self, env: gym.Env, indices: tuple[int, ...]) -> None:
        super().__init__(env)
        space = env.observation_space
        if not (isinstance(space, gym.spaces.Box) and len(space.shape) == 1):
            raise ValueError(f"KeepEntries takes 1-D Box observations, got {space}")
        self.indices = np.asarray(indices, np.int64)
        self.observation_space = gym.spaces.Box(space.low[self.indices], space.high[self.indices], dtype=space.dtype)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[self.indices]


def make_masked(env_id: str, training: bool = True, **kwargs) -> gym.Env:
    """The env of ``masked:ENV``: ``gym.make(env_id, **kwargs)`` observing only ``KEPT[env_id]``.
    ``training`` changes nothing: the same env is trained and evaluated on."""
    check_env(env_id)
    return KeepEntries(gym.make(env_id, **kwargs), KEPT[env_id])


def check_env(env_id: str) -> None:
    if env_id in KEPT:
        return
    close = difflib.get_close_matches(env_id, list(KEPT), n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise ValueError(f"no velocity mask for {env_id!r} in env id 'masked:{env_id}': {hint}"
                     f"masked envs are {', '.join(KEPT)} (add one to lockstep.envs.masked.KEPT)")
