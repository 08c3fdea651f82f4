"""Kinds: a diagnostic multi-agent env in PettingZoo's parallel API whose agents differ in their spaces.

``pettingzoo:lockstep.envs.kinds`` (no PettingZoo install needed: the env speaks the API without importing
it). Two kinds of agents, each paid only for acting on its own observation, so that several policies
(``policies``) are needed where the kinds differ and each policy must learn from its own agents' samples:

- ``scout_0`` and ``scout_1`` see a one-hot cue of 3 (Box(3,)) and are paid 1 for naming it (Discrete(3));
- ``pilot_0`` sees a cue bit among 4 distractors (Box(5,): the bit, then 4 random numbers) and is paid 1
  for saying it back (Discrete(2)).

Every agent is truncated after ``LENGTH`` steps, when the next episode starts. A random policy earns 1/3 of
the steps of a scout and 1/2 of a pilot's (8/3 and 4 per episode), the best policy every step (8).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

LENGTH = 8  # steps an episode
SCOUTS, PILOTS = ("scout_0", "scout_1"), ("pilot_0",)
CHOICES = {"scout": 3, "pilot": 2}  # each kind's actions


def _kind(agent: str) -> str:
    return agent.partition("_")[0]


class Kinds:
    metadata = {"name": "kinds_v0"}

    def __init__(self) -> None:
        self.possible_agents = [*SCOUTS, *PILOTS]
        self.agents: list[str] = []
        self._spaces = {"scout": gym.spaces.Box(0.0, 1.0, (3,), np.float32),
                        "pilot": gym.spaces.Box(-1.0, 1.0, (5,), np.float32)}
        self._rng = np.random.default_rng()
        self._t = 0
        self._cue: dict[str, int] = {}

    def observation_space(self, agent: str) -> gym.Space:
        return self._spaces[_kind(agent)]

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(CHOICES[_kind(agent)])

    def _observe(self) -> dict[str, np.ndarray]:
        observations = {}
        for agent in self.agents:
            kind = _kind(agent)
            cue = self._cue[agent] = int(self._rng.integers(CHOICES[kind]))
            if kind == "scout":
                observations[agent] = np.eye(3, dtype=np.float32)[cue]
            else:
                noise = self._rng.uniform(-1.0, 1.0, 4).astype(np.float32)
                observations[agent] = np.concatenate([[np.float32(cue)], noise]).astype(np.float32)
        return observations

    def reset(self, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        self.agents, self._t = list(self.possible_agents), 0
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions: dict[str, int]):
        self._t += 1
        rewards = {a: float(int(actions[a]) == self._cue[a]) for a in self.agents}
        ended = self._t >= LENGTH
        acting = list(self.agents)
        observations = self._observe()
        self.agents = [] if ended else acting
        return (observations, rewards, dict.fromkeys(acting, False), dict.fromkeys(acting, ended),
                {a: {} for a in acting})

    def close(self) -> None:
        pass


def parallel_env() -> Kinds:
    return Kinds()
