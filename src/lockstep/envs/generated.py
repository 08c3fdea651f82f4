"""Generated envs: any observation and action space lockstep takes, from a description that fits in a config.

``lockstep.envs.generated:Generated`` (one agent) and ``pettingzoo:lockstep.envs.generated`` (a parallel env
whose agents leave at random steps) are built from ``env.kwargs``, so that every actor, ``lockstep eval`` and
``lockstep audit`` rebuild the same spaces from the run's config. They check a run's plumbing, not its
learning: the suite's generated-space test drives every space kind through training, the audit and eval with
them (``tests/integration/test_generated_spaces.py``, ``lockstep bench spaces``), and a user can try the spaces
of their own env the same way before writing it::

    lockstep train --env lockstep.envs.generated:Generated --transport inprocess \\
        --env-kwargs "{observation: {dict: {pos: {box: [2, 3]}, cell: {discrete: 5}}}, action: {discrete: 3}}"

A space is described by a small dict (JSON and YAML as they are):

- ``{box: [2, 3]}``: a float32 Box of that shape in [-scale, scale] (``scale``, default 1; ``null``:
  unbounded, drawn from a normal); ``{box: [1, 8, 8], dtype: uint8}``: a uint8 Box in [0, 255];
- ``{discrete: 4}``; ``{multi_discrete: [3, 2]}`` (nested lists for more dimensions); ``{multi_binary: 5}`` or
  ``{multi_binary: [2, 3]}``;
- ``{dict: {key: description, ...}}`` and ``{tuple: [description, ...]}``.

Observations are random draws within the space, from the env's seed. ``mask: KEY`` adds an action mask
under KEY to a Dict observation (``env.action_mask_key``; ``mask_dtype: int8`` makes it an integer Box instead
of a MultiBinary): one number per choice of the action's categorical entries in the action's order, a random
non-empty set of choices of each entry allowed at each step, and an action outside it raises ``MaskViolation``,
so a run whose mask does not reach the policy stops at once. With no categorical entry in the action the mask
leaf is one number (lockstep refuses it as a mask, naming the leaf). The reward depends on the action only:
1 for each categorical entry at its highest allowed choice, less the mean squared distance of the Box parts
from their middle, averaged over the parts. An episode lasts ``length`` steps (truncated) unless it
terminates first, with probability ``end`` at each step.

The parallel env (``agents``, default 3) gives each agent the one observation space; every agent but the last
leaves at a random step of the episode (terminated or truncated at random), the last at ``length``.

Imported by the actor: no torch.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from lockstep.envs.spaces import action_entries, action_spec, leaf_choices


class MaskViolation(RuntimeError):
    """An action that the observation's mask did not allow."""


def space_of(description: Any) -> gym.Space:
    """The Gymnasium space of a description (module docstring); a ValueError naming what is wrong."""
    if not isinstance(description, dict) or len(set(description) - {"dtype", "scale"}) != 1:
        raise ValueError(f"a space description is a dict with one of box, discrete, multi_discrete, multi_binary, "
                         f"dict, tuple (box: also dtype and scale), got {description!r}")
    if "box" in description:
        shape = tuple(int(d) for d in description["box"])
        if description.get("dtype", "float32") == "uint8":
            return gym.spaces.Box(0, 255, shape, np.uint8)
        scale = description.get("scale", 1.0)
        bound = np.inf if scale is None else float(scale)
        return gym.spaces.Box(-bound, bound, shape, np.float32)
    if "discrete" in description:
        return gym.spaces.Discrete(int(description["discrete"]))
    if "multi_discrete" in description:
        return gym.spaces.MultiDiscrete(np.array(description["multi_discrete"], np.int64))
    if "multi_binary" in description:
        return gym.spaces.MultiBinary(description["multi_binary"])
    if "dict" in description:
        return gym.spaces.Dict({str(key): space_of(sub) for key, sub in description["dict"].items()})
    if "tuple" in description:
        return gym.spaces.Tuple([space_of(sub) for sub in description["tuple"]])
    raise ValueError(f"unknown space description {description!r}: one of box, discrete, multi_discrete, "
                     "multi_binary, dict, tuple")


class _Spaces:
    """What both envs share: the spaces with the mask leaf added, the draws, the mask check and the reward."""

    def __init__(self, observation: Any, action: Any, mask: str, mask_dtype: str) -> None:
        self.action_space = space_of(action)
        self._entries = action_entries(action_spec(self.action_space))  # (path, leaf, first, size)
        self.choices = [n for _, leaf, *_ in self._entries for n in leaf_choices(leaf)]
        inner = space_of(observation)
        self.mask = mask
        if mask:
            if not isinstance(inner, gym.spaces.Dict) or mask in inner.spaces:
                raise ValueError(f"mask {mask!r} is a key this env adds to a Dict observation: the observation "
                                 f"must be a Dict without that key, got {inner}")
            size = max(sum(self.choices), 1)
            leaf = (gym.spaces.MultiBinary(size) if mask_dtype == "multi_binary"
                    else gym.spaces.Box(0, 1, (size,), np.dtype(mask_dtype)))
            inner = gym.spaces.Dict({**inner.spaces, mask: leaf})
        self.observation_space = inner
        self.allowed = np.ones(sum(self.choices), bool)

    def draw(self, rng: np.random.Generator) -> Any:
        """A random observation within the space (the mask leaf: a random non-empty set per entry)."""
        if self.mask:
            self.allowed = np.zeros(sum(self.choices), bool)
            first = 0
            for n in self.choices:
                self.allowed[first:first + n] = rng.random(n) < 0.5
                self.allowed[first + int(rng.integers(n))] = True
                first += n
        return self._draw(self.observation_space, rng)

    def _draw(self, space: gym.Space, rng: np.random.Generator, key: str | None = None) -> Any:
        if isinstance(space, gym.spaces.Dict):
            return {k: self._draw(sub, rng, k) for k, sub in space.spaces.items()}
        if isinstance(space, gym.spaces.Tuple):
            return tuple(self._draw(sub, rng) for sub in space.spaces)
        if key is not None and key == self.mask:
            return (self.allowed if self.choices else np.ones(1, bool)).astype(space.dtype)
        if isinstance(space, gym.spaces.Discrete):
            return np.int64(rng.integers(space.n))
        if isinstance(space, gym.spaces.MultiDiscrete):
            return rng.integers(space.nvec).astype(space.dtype)
        if isinstance(space, gym.spaces.MultiBinary):
            return rng.integers(0, 2, space.shape).astype(space.dtype)
        if space.dtype == np.uint8:
            return rng.integers(0, 256, space.shape).astype(np.uint8)
        if np.isfinite(space.high).all():
            return rng.uniform(space.low, space.high).astype(np.float32)
        return rng.normal(size=space.shape).astype(np.float32)

    def reward(self, action: Any) -> float:
        """1 per categorical entry at its highest allowed choice, less the Box parts' squared distance from their
        middle, averaged over the parts; a MaskViolation for a choice the mask did not allow."""
        scores, first = [], 0
        for path, leaf, *_ in self._entries:
            value = np.asarray(_part(action, path))
            if leaf.kind == "box":
                bounded = np.isfinite(leaf.low) & np.isfinite(leaf.high)
                middle = np.where(bounded, (np.where(bounded, leaf.low, 0) + np.where(bounded, leaf.high, 0)) / 2, 0)
                scores.append(-float(np.mean(np.square(np.clip(value - middle, -10, 10)))))
                continue
            for n, choice in zip(leaf_choices(leaf), value.reshape(-1)):
                allowed = np.flatnonzero(self.allowed[first:first + n])
                if int(choice) not in allowed:
                    raise MaskViolation(f"action part {path or 'the action'!r} chose {int(choice)}, which the "
                                        f"mask {self.mask!r} did not allow (allowed: {allowed.tolist()})")
                scores.append(float(int(choice) == allowed[-1]))
                first += n
        return float(np.mean(scores))


def _part(action: Any, path: str) -> Any:
    """The part of an action at an action leaf's path: a Dict key, a Tuple index ``[i]``, or ``""`` for all."""
    if not path:
        return action
    return action[int(path[1:-1])] if path.startswith("[") else action[path]


class Generated(gym.Env):
    """One agent in generated spaces (module docstring)."""

    def __init__(self, observation: Any, action: Any, mask: str = "", mask_dtype: str = "multi_binary",
                 length: int = 8, end: float = 0.1) -> None:
        self._spaces = _Spaces(observation, action, mask, mask_dtype)
        self.observation_space = self._spaces.observation_space
        self.action_space = self._spaces.action_space
        self.length, self.end = length, end
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self._t = 0
        return self._spaces.draw(self.np_random), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        reward = self._spaces.reward(action)
        self._t += 1
        terminated = bool(self.np_random.random() < self.end)
        return self._spaces.draw(self.np_random), reward, terminated, self._t >= self.length, {}


class GeneratedParallel:
    """``agents`` agents in generated spaces, PettingZoo's parallel API (module docstring); every agent but the
    last leaves at a random step."""

    metadata = {"name": "generated_v0"}

    def __init__(self, observation: Any, action: Any, mask: str = "", mask_dtype: str = "multi_binary",
                 length: int = 8, agents: int = 3) -> None:
        self._spaces = _Spaces(observation, action, mask, mask_dtype)
        self.possible_agents = [f"agent_{i}" for i in range(agents)]
        self.agents: list[str] = []
        self.length = length
        self._rng = np.random.default_rng()
        self._t = 0
        self._leaves: dict[str, tuple[int, bool]] = {}  # agent -> (the step it leaves at, truncated)
        self._masks: dict[str, np.ndarray] = {}  # agent -> the choices its last observation allowed

    def observation_space(self, agent: str) -> gym.Space:
        return self._spaces.observation_space

    def action_space(self, agent: str) -> gym.Space:
        return self._spaces.action_space

    def _observe(self, agents: list[str]) -> dict[str, Any]:
        observations = {}
        for agent in agents:
            observations[agent] = self._spaces.draw(self._rng)
            self._masks[agent] = self._spaces.allowed
        return observations

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents, self._t = list(self.possible_agents), 0
        self._leaves = {a: (int(self._rng.integers(1, self.length)), bool(self._rng.random() < 0.5))
                        for a in self.possible_agents[:-1]}
        self._leaves[self.possible_agents[-1]] = (self.length, True)
        return self._observe(self.agents), {a: {} for a in self.agents}

    def step(self, actions: dict[str, Any]):
        self._t += 1
        rewards = {}
        for agent in self.agents:
            self._spaces.allowed = self._masks[agent]
            rewards[agent] = self._spaces.reward(actions[agent])
        ended = {a: self._t >= self._leaves[a][0] for a in self.agents}
        truncations = {a: ended[a] and self._leaves[a][1] for a in self.agents}
        terminations = {a: ended[a] and not truncations[a] for a in self.agents}
        acting = list(self.agents)
        observations = self._observe(acting)  # every agent that acted gets its next (or last) observation
        self.agents = [a for a in acting if not ended[a]]
        return observations, rewards, terminations, truncations, {a: {} for a in acting}

    def close(self) -> None:
        pass


def parallel_env(**kwargs) -> GeneratedParallel:
    return GeneratedParallel(**kwargs)
