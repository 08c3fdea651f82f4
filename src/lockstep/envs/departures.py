"""Departures: a diagnostic multi-agent env in PettingZoo's parallel API whose agents leave at different times.

``pettingzoo:lockstep.envs.departures`` (no PettingZoo install needed: the env speaks the API without
importing it). Three agents see a random cue bit each step and are paid 1 for saying it back
(Discrete(2)). ``a0`` terminates after 3 steps, ``a1`` after 6, and ``a2`` is truncated after 10, when the
episode ends and the next starts; so in every 10-step episode ``a0``'s slot is inactive for 7 steps and
``a1``'s for 4 (``envs.pettingzoo``). A random policy scores half of each agent's lifetime (1.5, 3, 5), the
best policy all of it (3, 6, 10).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

LIFETIMES = {"a0": 3, "a1": 6, "a2": 10}  # steps each agent stays; the last one's is the episode's
TRUNCATED = "a2"  # leaves by truncation (its value is bootstrapped); the others terminate


class Departures:
    metadata = {"name": "departures_v0"}

    def __init__(self) -> None:
        self.possible_agents = list(LIFETIMES)
        self.agents: list[str] = []
        self._spaces = gym.spaces.Box(0.0, 1.0, (3,), np.float32)
        self._rng = np.random.default_rng()
        self._t = 0
        self._cue: dict[str, int] = {}

    def observation_space(self, agent: str) -> gym.Space:
        return self._spaces

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(2)

    def _observe(self) -> dict[str, np.ndarray]:
        self._cue = {a: int(self._rng.integers(2)) for a in self.agents}
        return {a: np.array([self._cue[a], self._t / 10, self.possible_agents.index(a) / 2], np.float32)
                for a in self.agents}

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents, self._t = list(self.possible_agents), 0
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions: dict[str, int]):
        self._t += 1
        rewards = {a: float(int(actions[a]) == self._cue[a]) for a in self.agents}
        ended = {a: self._t >= LIFETIMES[a] for a in self.agents}
        terminations = {a: ended[a] and a != TRUNCATED for a in self.agents}
        truncations = {a: ended[a] and a == TRUNCATED for a in self.agents}
        acting = list(self.agents)
        observations = self._observe()  # every agent that acted gets its next (or last) observation
        self.agents = [a for a in acting if not ended[a]]
        return observations, rewards, terminations, truncations, {a: {} for a in acting}

    def close(self) -> None:
        pass


def parallel_env() -> Departures:
    return Departures()
