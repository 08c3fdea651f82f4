"""Small diagnostic tasks, registered as ``lockstep.envs.tasks:NAME`` env ids.

``Recall`` needs memory: an MLP policy cannot do better than chance, a recurrent one can
solve it. It is the suite's quick check that recurrent state reaches the right slot at the
right step, and a diagnostic for users wiring their own recurrent policy. ``SplitCartPole`` is
CartPole-v1 with its vector declared as a Dict: what a structured observation's policy learns against
the same vector flat. ``Slow`` is CartPole-v1 whose step takes milliseconds, as a simulator's does: what
``actors.vector: async`` is for (``lockstep bench vector``).
"""

from __future__ import annotations

import time

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


class SplitCartPole(gym.ObservationWrapper):
    """CartPole-v1 whose observation is a Dict of two Box leaves holding the same four numbers.

    Observation Dict(cart: Box((2,)) [position, velocity], pole: Box((2,)) [angle, angular velocity]),
    the bounds CartPole's; dynamics, rewards and the 500-step limit are CartPole-v1's.
    The leaves in path order (cart, pole) are the flat vector in its order: a policy for structured
    observations that learns worse here than on ``CartPole-v1`` with the same settings loses what the flat
    one has (``lockstep bench learn --suite dict-split``).
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(gym.make("CartPole-v1", **kwargs))
        low, high = self.env.observation_space.low, self.env.observation_space.high
        self.observation_space = gym.spaces.Dict({"cart": gym.spaces.Box(low[:2], high[:2], dtype=np.float32),
                                                  "pole": gym.spaces.Box(low[2:], high[2:], dtype=np.float32)})

    def observation(self, observation: np.ndarray) -> dict:
        return {"cart": observation[:2], "pole": observation[2:]}


class Glimpse(gym.Env):
    """A Dict observation (an image leaf, a vector leaf and a Discrete leaf): say which side of the image is lit.

    Observation Dict(image: Box(0, 255, (1, 5, 5), uint8), one pixel lit at 255 in the two left or the two
    right columns; clock: Box(0, 1, (2,), float32), the step's fraction of the episode and a constant 1;
    step: Discrete(length)). Action Discrete(2): 0 says left, 1 right; reward 1 when it is right, 0 otherwise;
    ``length`` steps an episode. Chance is a mean return of ``length / 2``, solving it ``length``. The
    suite's check that every leaf of a structured observation reaches the policy.
    """

    def __init__(self, length: int = 8) -> None:
        self.length = length
        self.observation_space = gym.spaces.Dict({
            "image": gym.spaces.Box(0, 255, (1, 5, 5), np.uint8),
            "clock": gym.spaces.Box(0.0, 1.0, (2,), np.float32),
            "step": gym.spaces.Discrete(length),
        })
        self.action_space = gym.spaces.Discrete(2)
        self._side = 0
        self._t = 0

    def _obs(self) -> dict:
        self._side = int(self.np_random.integers(2))
        image = np.zeros((1, 5, 5), np.uint8)
        column = int(self.np_random.integers(2)) + (3 if self._side else 0)
        image[0, int(self.np_random.integers(5)), column] = 255
        return {"image": image, "clock": np.array([self._t / self.length, 1.0], np.float32), "step": self._t}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[dict, float, bool, bool, dict]:
        reward = 1.0 if int(action) == self._side else 0.0
        self._t += 1
        done = self._t == self.length
        if done:
            self._t = 0
        return self._obs(), reward, done, False, {}


class Combination(gym.Env):
    """A MultiDiscrete action: find the one combination of choices that pays.

    Observation Box(0, 1, (1,)), always 1. Action MultiDiscrete(``nvec``, default [3, 4]); reward 1 when the
    action is ``target`` (default [2, 1]), 0 otherwise; ``length`` steps an episode. Chance is a mean return
    of ``length / prod(nvec)`` (8 / 12 by default), finding the combination ``length``. The suite's check that
    each dimension's Categorical learns, with the log-probs summed.
    """

    def __init__(self, nvec: tuple[int, ...] = (3, 4), target: tuple[int, ...] = (2, 1), length: int = 8) -> None:
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.MultiDiscrete(list(nvec))
        self.target, self.length = np.asarray(target), length
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._t = 0
        return np.ones(1, np.float32), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._t += 1
        reward = 1.0 if np.array_equal(np.asarray(action), self.target) else 0.0
        return np.ones(1, np.float32), reward, self._t == self.length, False, {}


class Knobs(gym.Env):
    """A Dict action of a Discrete, a Box and a MultiBinary part: press the right button, set the dial,
    flip the right switches.

    Observation Box(0, 1, (1,)), always 1. Action Dict(button: Discrete(3), dial: Box(-1, 1, (1,)),
    switches: MultiBinary(2)). Reward per step: 1 for button 2, 1 - |dial - 0.5| for the dial, 0.5 for
    each switch that matches [1, 0]; ``length`` steps an episode. ``last_action`` is the action the env
    was last stepped with (after the actor clipped its Box part).
    """

    def __init__(self, length: int = 8) -> None:
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Dict({"button": gym.spaces.Discrete(3),
                                             "dial": gym.spaces.Box(-1.0, 1.0, (1,), np.float32),
                                             "switches": gym.spaces.MultiBinary(2)})
        self.length = length
        self.last_action: dict | None = None
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._t = 0
        return np.ones(1, np.float32), {}

    def step(self, action: dict) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.last_action = action
        self._t += 1
        reward = (float(int(action["button"]) == 2) + 1.0 - abs(float(action["dial"][0]) - 0.5)
                  + 0.5 * float(np.sum(np.asarray(action["switches"]) == np.array([1, 0]))))
        return np.ones(1, np.float32), reward, self._t == self.length, False, {}


class Forbidden(gym.Env):
    """An action mask: pick the highest of the actions allowed this step, never a forbidden one.

    Observation Dict(action_mask: MultiBinary(n), 1 where an action is allowed, at least one each step;
    clock: Box(0, 1, (1,)), the step's fraction of the episode). Action Discrete(n); reward 1 for the highest
    allowed action, 0 for another allowed one, -1 for a forbidden one (``forbidden_taken`` counts them: a
    policy that honours the mask never takes one). ``length`` steps an episode.
    """

    def __init__(self, n: int = 5, length: int = 8) -> None:
        self.n, self.length = n, length
        self.observation_space = gym.spaces.Dict({"action_mask": gym.spaces.MultiBinary(n),
                                                  "clock": gym.spaces.Box(0.0, 1.0, (1,), np.float32)})
        self.action_space = gym.spaces.Discrete(n)
        self.forbidden_taken = 0
        self._mask = np.ones(n, np.int8)
        self._t = 0

    def _obs(self) -> dict:
        self._mask = (self.np_random.random(self.n) < 0.5).astype(np.int8)
        self._mask[int(self.np_random.integers(self.n))] = 1
        return {"action_mask": self._mask.copy(), "clock": np.array([self._t / self.length], np.float32)}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self._t = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[dict, float, bool, bool, dict]:
        action = int(action)
        if not self._mask[action]:
            self.forbidden_taken += 1
            reward = -1.0
        else:
            reward = 1.0 if action == int(np.flatnonzero(self._mask).max()) else 0.0
        self._t += 1
        done = self._t == self.length
        if done:
            self._t = 0
        return self._obs(), reward, done, False, {}


class Slow(gym.Wrapper):
    """CartPole-v1 (``kwargs`` for ``gym.make``) whose every step takes ``step_ms`` more milliseconds: asleep (an
    env that waits on a simulator or a device) or, with ``busy``, computing on the core (an env that simulates)."""

    def __init__(self, step_ms: float = 2.0, busy: bool = False, **kwargs) -> None:
        super().__init__(gym.make("CartPole-v1", **kwargs))
        self.step_s, self.busy = step_ms / 1000.0, busy

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self.busy:
            end = time.perf_counter() + self.step_s
            while time.perf_counter() < end:
                pass
        else:
            time.sleep(self.step_s)
        return self.env.step(action)
