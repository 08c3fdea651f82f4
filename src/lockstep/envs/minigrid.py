"""MiniGrid (Chevalier-Boisvert et al., 2023): small grid worlds with keys, doors and goals.

``make_minigrid(env_id)`` is what the env id ``minigrid:ENV`` builds (``minigrid:MiniGrid-DoorKey-5x5-v0``):
the registered MiniGrid env, whose observation is a Dict of

- ``image``: the agent's 7 x 7 view, [7, 7, 3] of (object, colour, state) codes per cell; declared here as
  MultiDiscrete([11, 6, 3] per cell), uint8, since the codes name kinds of things rather than intensities:
  the policy one-hot encodes each (``models.encoders``) instead of scaling them as pixels
- ``direction``: Discrete(4), where the agent faces
- ``mission``: a Text, which lockstep cannot encode: leave it out with ``env.obs_keys: [image, direction]``

Action: Discrete(7). Reward 1 - 0.9 * steps / max_steps on reaching the goal, else 0; episodes are cut at
the env's ``max_steps`` (250 on DoorKey-5x5). Importing ``minigrid`` registers its envs, so the factory
imports it when an env is made, in whichever process makes it (``pip install -e '.[minigrid]'``), and
never torch. Training and evaluation use the same env.
"""

from __future__ import annotations

import difflib

import gymnasium as gym
import numpy as np


def make_minigrid(env_id: str, training: bool = True, **kwargs) -> gym.Env:
    """The env of ``minigrid:ENV``: ``gym.make(ENV, **kwargs)`` with its image declared as grid codes
    (module docstring). ``training`` changes nothing."""
    try:
        # importing the minigrid package registers the MiniGrid-* ids in this process
        from minigrid.core.constants import COLOR_TO_IDX, OBJECT_TO_IDX, STATE_TO_IDX
    except ImportError as err:
        raise ValueError(f"MiniGrid env ids need minigrid: pip install -e '.[minigrid]' ({err})") from err
    if env_id not in gym.registry:
        ids = [name for name in gym.registry if name.startswith("MiniGrid-") or name.startswith("BabyAI-")]
        close = difflib.get_close_matches(env_id, ids, n=3, cutoff=0.6)
        hint = f"did you mean {' or '.join(close)}?" if close else "MiniGrid ids look like MiniGrid-DoorKey-5x5-v0"
        raise ValueError(f"unknown MiniGrid env {env_id!r} in env id 'minigrid:{env_id}': {hint}")
    return GridCodes(gym.make(env_id, **kwargs), (len(OBJECT_TO_IDX), len(COLOR_TO_IDX), len(STATE_TO_IDX)))


class GridCodes(gym.ObservationWrapper):
    """A MiniGrid env whose ``image`` leaf is declared MultiDiscrete of ``codes`` (object, colour, state) per
    cell instead of a Box(0, 255): the same values, the space that says what they are."""

    def __init__(self, env: gym.Env, codes: tuple[int, int, int]) -> None:
        super().__init__(env)
        spaces = dict(env.observation_space.spaces)
        image = spaces["image"]
        nvec = np.broadcast_to(np.asarray(codes), image.shape)  # [7, 7, 3]
        spaces["image"] = gym.spaces.MultiDiscrete(nvec, dtype=np.uint8)
        self.observation_space = gym.spaces.Dict(spaces)

    def observation(self, observation: dict) -> dict:
        return observation
