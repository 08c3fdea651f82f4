"""Departures: a diagnostic multi-agent env in PettingZoo's parallel API whose agents leave at different times.

``pettingzoo:lockstep.envs.departures`` (no PettingZoo install needed: the env speaks the API without
importing it). Three agents see a random cue bit each step and are paid 1 for saying it back
(Discrete(2)). ``a0`` terminates after 3 steps, ``a1`` after 6, and ``a2`` is truncated after 10, when the
episode ends and the next starts; so in every 10-step episode ``a0``'s slot is inactive for 7 steps and
``a1``'s for 4 (``envs.pettingzoo``). A random policy scores half of each agent's lifetime (1.5, 3, 5), the
best policy all of it (3, 6, 10).

Two variants for the edges of the slots (``env.kwargs``): ``mask_key`` gives each agent a Dict of its cue
vector (``cue``) and an action mask under that key (each step one of the two actions at random, or both), and
the env refuses an illegal action of an agent that is still there; ``nested`` puts the cue vector in a Tuple
beside a Dict holding the cue bit again (a Discrete leaf), as PettingZoo envs with composite observations do.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

LIFETIMES = {"a0": 3, "a1": 6, "a2": 10}  # steps each agent stays; the last one's is the episode's
TRUNCATED = "a2"  # leaves by truncation (its value is bootstrapped); the others terminate


class Departures:
    metadata = {"name": "departures_v0"}

    def __init__(self, mask_key: str = "", nested: bool = False) -> None:
        self.possible_agents = list(LIFETIMES)
        self.agents: list[str] = []
        self._mask_key, self._nested = mask_key, nested
        cue: gym.Space = gym.spaces.Box(0.0, 1.0, (3,), np.float32)
        if nested:
            cue = gym.spaces.Tuple((cue, gym.spaces.Dict({"bit": gym.spaces.Discrete(2)})))
        self._spaces = gym.spaces.Dict({"cue": cue, mask_key: gym.spaces.MultiBinary(2)}) if mask_key else cue
        self._legal: dict[str, np.ndarray] = {}
        self._rng = np.random.default_rng()
        self._t = 0
        self._cue: dict[str, int] = {}

    def observation_space(self, agent: str) -> gym.Space:
        return self._spaces

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(2)

    def _observe(self) -> dict:
        self._cue = {a: int(self._rng.integers(2)) for a in self.agents}
        observations = {}
        for a in self.agents:
            cue = np.array([self._cue[a], self._t / 10, self.possible_agents.index(a) / 2], np.float32)
            observations[a] = (cue, {"bit": self._cue[a]}) if self._nested else cue
            if self._mask_key:
                self._legal[a] = np.array([[1, 0], [0, 1], [1, 1]][self._rng.integers(3)], np.int8)
                observations[a] = {"cue": observations[a], self._mask_key: self._legal[a]}
        return observations

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents, self._t = list(self.possible_agents), 0
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions: dict[str, int]):
        for a in self.agents:
            if self._mask_key and not self._legal[a][int(actions[a])]:
                raise ValueError(f"agent {a} took action {int(actions[a])}, which its mask {self._legal[a]} forbids")
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


def parallel_env(mask_key: str = "", nested: bool = False) -> Departures:
    return Departures(mask_key, nested)
