"""Small diagnostic tasks, registered as ``lockstep.envs.tasks:NAME`` env ids.

``Recall`` needs memory: an MLP policy cannot do better than chance, a recurrent one can
solve it. It is the suite's quick check that recurrent state reaches the right slot at the
right step, and a diagnostic for users wiring their own recurrent policy.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class Recall(gym.Env):
    """Remember a bit shown only at the first step, and say it after ``delay`` blank steps.

    Observation Box(0, 1, (3,)): [cue is 0, cue is 1, "answer now"]; the cue shows at step 0 only,
    the answer flag at the last step only. Action Discrete(2). Reward at the last step: +1 for the
    cue's value, -1 otherwise, 0 before. Chance (and the best a memoryless policy can do) is a mean
    return of 0; a policy that remembers gets 1.
    """

    def __init__(self, delay: int = 3) -> None:
        self.delay = delay
        self.observation_space = gym.spaces.Box(0.0, 1.0, (3,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._cue = 0
        self._t = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(3, np.float32)
        if self._t == 0:
            obs[self._cue] = 1.0
        if self._t == self.delay:
            obs[2] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._cue = int(self.np_random.integers(2))
        self._t = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self._t < self.delay:
            self._t += 1
            return self._obs(), 0.0, False, False, {}
        return self._obs(), 1.0 if int(action) == self._cue else -1.0, True, False, {}
