"""An honest env that is slow: CartPole whose every step takes seconds longer. A spawned actor reaches it as
``--env slow_env:make`` with tests/ on its PYTHONPATH (``SLOW_ENV_PATH``)."""

from __future__ import annotations

import os
import time

import gymnasium as gym

SLOW_ENV_PATH = os.path.dirname(os.path.abspath(__file__))  # the folder an actor's PYTHONPATH needs


class SlowSteps(gym.Wrapper):
    """``env`` whose every step sleeps ``step_s`` seconds first, as a heavy simulator's step does."""

    def __init__(self, env: gym.Env, step_s: float) -> None:
        super().__init__(env)
        self.step_s = step_s

    def step(self, action):
        time.sleep(self.step_s)
        return self.env.step(action)


def make(step_s: float = 2.0, **kwargs) -> gym.Env:
    """CartPole-v1 (its spaces, so a CartPole learner accepts it) with steps of ``step_s`` seconds."""
    return SlowSteps(gym.make("CartPole-v1", **kwargs), step_s)
