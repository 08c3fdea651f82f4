"""Partners: a diagnostic two-agent env in PettingZoo's parallel API whose value hangs on what only the other
agent sees.

``pettingzoo:lockstep.envs.partners`` (no PettingZoo install needed: the env speaks the API without importing
it). At every step each agent sees a fresh random bit of its own (Box(0, 1, (1,))) and says a bit
(Discrete(2)); it is paid 1 for saying its own bit back, plus its partner's bit. An episode is ``length`` steps
(``env.kwargs``; 1 by default, when a step's value is its reward). A critic that reads the agent's own
observation cannot know the partner's bit, so its value error keeps that bit's variance (1/4 a step); a
centralized one (``model.critic_input: global``) reads both bits in the global state and can be exact. The
global state is the two observations side by side (``envs.pettingzoo``), unless ``state`` is set: then the env
declares a ``state_space`` and a ``state()`` of its own (the two bits and the step's fraction of the episode), as
mpe2's envs do.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

AGENTS = ("left", "right")


class Partners:
    metadata = {"name": "partners_v0"}

    def __init__(self, length: int = 1, state: bool = False) -> None:
        self.possible_agents = list(AGENTS)
        self.agents: list[str] = []
        self.length = length
        if state:  # PettingZoo's parallel API declares a global state by its space
            self.state_space = gym.spaces.Box(0.0, 1.0, (3,), np.float32)
        self._rng = np.random.default_rng()
        self._bits = np.zeros(2, np.int64)
        self._t = 0

    def observation_space(self, agent: str) -> gym.Space:
        return gym.spaces.Box(0.0, 1.0, (1,), np.float32)

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(2)

    def state(self) -> np.ndarray:
        return np.array([*self._bits, self._t / self.length], np.float32)

    def _observe(self) -> dict[str, np.ndarray]:
        self._bits = self._rng.integers(2, size=2)
        return {agent: np.array([self._bits[i]], np.float32) for i, agent in enumerate(AGENTS)}

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents, self._t = list(self.possible_agents), 0
        return self._observe(), {agent: {} for agent in self.agents}

    def step(self, actions: dict[str, int]):
        said = [int(actions[agent]) for agent in AGENTS]
        rewards = {agent: float(said[i] == self._bits[i]) + float(self._bits[1 - i]) for i, agent in enumerate(AGENTS)}
        self._t += 1
        done = self._t >= self.length
        observations = self._observe()
        acting, self.agents = self.agents, [] if done else self.agents
        return (observations, rewards, dict.fromkeys(acting, done), dict.fromkeys(acting, False),
                {agent: {} for agent in acting})

    def close(self) -> None:
        pass


def parallel_env(length: int = 1, state: bool = False) -> Partners:
    return Partners(length, state)
