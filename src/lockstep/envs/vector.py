"""The actor's vector env: Gymnasium's ``SyncVectorEnv`` in same-step autoreset, whose step keeps of the envs'
infos only what the actor sends.

Gymnasium's step batches every key of every env's info dict into arrays with masks, at every step (a MuJoCo
env reports six numbers a step: twelve small arrays made and filled in Python, about a quarter of Hopper's
step). The actor reads two things from them: the last observation of an episode that ended
(``infos["final_obs"]``, to bootstrap a truncation) and the statistics of the episodes that ended
(``infos["final_info"]["episode"]``, the envs' ``RecordEpisodeStatistics``). ``SameStepVectorEnv.step``
returns exactly those, in Gymnasium's layout, and the same observations, rewards and flags (tested against
``SyncVectorEnv``); everything else (reset, spaces, ``envs``, ``call``, render, close) is Gymnasium's.
"""

from __future__ import annotations

from copy import deepcopy
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import concatenate, iterate


class SameStepVectorEnv(SyncVectorEnv):
    """``SyncVectorEnv(env_fns, autoreset_mode=SAME_STEP)`` whose step's infos hold ``final_obs`` (an object
    array over the envs, set where an episode ended) and ``final_info`` with the ended episodes' ``episode``
    statistics and their mask ``_episode``; the other keys of the envs' infos are dropped."""

    def __init__(self, env_fns, copy: bool = True) -> None:
        super().__init__(env_fns, copy=copy, autoreset_mode=AutoresetMode.SAME_STEP)

    def step(self, actions) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        infos: dict[str, Any] = {}
        for i, (action, env) in enumerate(zip(iterate(self.action_space, actions), self.envs, strict=True)):
            obs, self._rewards[i], self._terminations[i], self._truncations[i], info = env.step(action)
            if self._terminations[i] or self._truncations[i]:
                self._ended(infos, i, obs, info)
                obs, _ = env.reset()
            self._env_obs[i] = obs
        self._observations = concatenate(self.single_observation_space, self._env_obs, self._observations)
        self._autoreset_envs = np.logical_or(self._terminations, self._truncations)
        return (deepcopy(self._observations) if self.copy else self._observations, np.copy(self._rewards),
                np.copy(self._terminations), np.copy(self._truncations), infos)

    def _ended(self, infos: dict[str, Any], i: int, obs: Any, info: dict[str, Any]) -> None:
        """File env ``i``'s last observation and episode statistics as ``SyncVectorEnv._add_info`` does."""
        if "final_obs" not in infos:
            infos["final_obs"] = np.full(self.num_envs, None, dtype=object)
        infos["final_obs"][i] = obs
        episode = info.get("episode")
        if not isinstance(episode, dict):
            return
        final = infos.setdefault("final_info", {})
        if "episode" not in final:
            final["episode"] = {key: np.zeros(self.num_envs, dtype=np.asarray(value).dtype)
                                for key, value in episode.items()}
            final["_episode"] = np.zeros(self.num_envs, dtype=bool)
        for key, value in episode.items():
            final["episode"][key][i] = value
        final["_episode"][i] = True
