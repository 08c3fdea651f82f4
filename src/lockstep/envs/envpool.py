"""EnvPool as an actor's vector env: ``envpool:TASK`` (``envpool:Breakout-v5``, ``envpool:Pong-v5``).

EnvPool steps a batch of Atari games in C++ threads with the DQN preprocessing built in (no-op reset,
frame skip 4 with max-pooling, 84 x 84 grey by area interpolation, a 4-frame stack, fire reset,
episodic life and sign-clipped rewards for training), so an actor's Python work per step is one call.
``EnvpoolVector`` gives it the interface the actor's loop uses (``actor.EnvLoop``), with lockstep's
semantics where EnvPool's differ:

* Same-step autoreset. EnvPool resets a finished env on its *next* step; here the reset happens in
  the step that finished the episode (one extra call for the finished envs), so the observation
  returned is always one to act on, as with Gymnasium's ``SAME_STEP`` vector envs. The last
  observation of an episode cut by the time limit goes in ``infos["final_obs"]``.
* Episode statistics of whole games: the raw score (``info["reward"]``, before clipping) summed over
  every life, and the game's length in agent steps, in ``infos["episode"]`` / ``infos["_episode"]``.
* Seeds. EnvPool seeds all its envs from one number at construction; ``reset(seed=[s, ...])`` builds
  the pool again from the first seed (env i then uses seed + i).

The observation and action spaces are those of ``atari:<Game>NoFrameskip-v4`` (``wrappers/atari.py``),
so the learner's hello check accepts either backend and a single env for evaluation (``make_env``)
is the Gymnasium one. Imports ``envpool`` only when a pool is made (``pip install -e '.[envpool]'``),
and never torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

SUFFIX = "-v5"


def gymnasium_id(task: str) -> str:
    """The ``atari:`` id with the same spaces and preprocessing as EnvPool's ``task`` (Breakout-v5 ->
    atari:BreakoutNoFrameskip-v4): what a single env of ``envpool:TASK`` is (spaces, evaluation)."""
    if not task.endswith(SUFFIX):
        raise ValueError(f"envpool:{task}: lockstep runs EnvPool's Atari tasks, named GAME{SUFFIX} "
                         "(envpool:Breakout-v5, envpool:Pong-v5)")
    return f"atari:{task[: -len(SUFFIX)]}NoFrameskip-v4"


def _envpool():
    try:
        import envpool
    except ImportError as err:
        raise ValueError("envpool: env ids need EnvPool: pip install -e '.[envpool]' (or pip install envpool)") \
            from err
    return envpool


class EnvpoolVector:
    """``num_envs`` games of one EnvPool Atari task, stepped together (module docstring)."""

    metadata: dict[str, Any] = {}

    def __init__(self, task: str, num_envs: int, training: bool = True, seed: int = 0) -> None:
        gymnasium_id(task)  # a task lockstep can name
        self._envpool = _envpool()
        if task not in self._envpool.list_all_envs():
            raise ValueError(f"envpool:{task}: EnvPool has no such task")
        self.task, self.num_envs, self.training = task, num_envs, training
        self._make(seed)
        self.single_observation_space = self._pool.observation_space
        self.single_action_space = self._pool.action_space
        self.episode_count = 0
        self._returns = np.zeros(num_envs, np.float64)  # raw score of the game so far
        self._lengths = np.zeros(num_envs, np.int64)  # agent steps of the game so far

    def _make(self, seed: int) -> None:
        self._pool = self._envpool.make_gymnasium(
            self.task, num_envs=self.num_envs, seed=int(seed), episodic_life=self.training,
            reward_clip=self.training, repeat_action_probability=0.0, noop_max=30)

    def reset(self, seed: int | list[int] | None = None, options: dict | None = None):
        if seed is not None:
            self._make(seed[0] if isinstance(seed, (list, tuple, np.ndarray)) else seed)
        self._returns[:] = 0
        self._lengths[:] = 0
        obs, _ = self._pool.reset()
        return obs, {}

    def step(self, actions: np.ndarray):
        actions = np.asarray(actions)
        obs, reward, terminated, truncated, info = self._pool.step(actions)
        infos: dict[str, Any] = {}
        self._returns += info["reward"]  # the raw game score (``reward`` is clipped when training)
        self._lengths += 1
        game_over = (info["terminated"].astype(bool) | truncated) if self.training else (terminated | truncated)
        done = terminated | truncated
        if game_over.any():
            infos["episode"] = {"r": np.where(game_over, self._returns, 0.0),
                                "l": np.where(game_over, self._lengths, 0), "t": np.zeros(self.num_envs)}
            infos["_episode"] = game_over.copy()
            self.episode_count += int(game_over.sum())
            self._returns[game_over] = 0
            self._lengths[game_over] = 0
        if done.any():
            ids = np.flatnonzero(done).astype(np.int32)
            cut = truncated & ~terminated
            if cut.any():
                infos["final_obs"] = list(obs)  # indexed by env, as Gymnasium's vector envs do
            # EnvPool resets a finished env at its next step, whatever the action: take that step now
            fresh, *_ = self._pool.step(np.zeros(len(ids), actions.dtype), ids)
            obs = obs.copy()
            obs[ids] = fresh
        return obs, reward.astype(np.float32), terminated, truncated, infos

    def close(self) -> None:
        self._pool.close()
