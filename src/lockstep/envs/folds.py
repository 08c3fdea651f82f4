"""Folds: a diagnostic two-player turn-based game in PettingZoo's AEC API whose first mover can end it at once.

``pettingzoo:lockstep.envs.folds`` (no PettingZoo install needed, as ``lockstep.envs.turns``). Two seats
move in turn, 2 plies each, 4 in a game; a move is 0 (fold) or 1 (stay), both always allowed by the
``action_mask``. A fold ends the game at once: the seat that folded gets -1, the other +1. A game nobody
folded in is a tie (0). Staying always is the best reply to anything: it never loses, and against random
moves it wins 3/4 of the games it moves first in, 1/2 of those it moves second in (where the opponent did
not fold at once), so 2/3 of the games it moves in when the seat alternates.

The first mover can fold on the game's first ply, so in self-play a game whose learning seat moves second
may be over before the learning player moves (half of them against random moves): the case
``envs.selfplay`` counts apart (games decided before the learning player moved).

Every observation says whose move it is and which ply: ``observation`` = [mover is seat 0, mover is seat 1,
ply / 4], as in ``turns``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

PLIES = 4  # a game's moves when nobody folds, both seats together
SEATS = ["player_0", "player_1"]
FOLD, STAY = 0, 1


class Folds:
    metadata = {"name": "folds_v0"}

    def __init__(self) -> None:
        self.possible_agents = list(SEATS)
        self._observation = gym.spaces.Dict({
            "observation": gym.spaces.Box(0.0, 1.0, (3,), np.float32),
            "action_mask": gym.spaces.Box(0, 1, (2,), np.int8)})
        self.reset()

    def observation_space(self, agent: str) -> gym.Space:
        return self._observation

    def action_space(self, agent: str) -> gym.Space:
        return gym.spaces.Discrete(2)

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        self.agents = list(SEATS)
        self.agent_selection = SEATS[0]
        self.ply = 0
        self.rewards = {seat: 0.0 for seat in SEATS}
        self.terminations = {seat: False for seat in SEATS}
        self.truncations = {seat: False for seat in SEATS}
        self.infos = {seat: {} for seat in SEATS}

    def observe(self, agent: str) -> dict[str, np.ndarray]:
        mover = SEATS.index(self.agent_selection)
        return {"observation": np.array([mover == 0, mover == 1, self.ply / PLIES], np.float32),
                "action_mask": np.ones(2, np.int8)}

    def step(self, action: int) -> None:
        mover = self.agent_selection
        self.ply += 1
        self.rewards = {seat: 0.0 for seat in SEATS}
        if int(action) == FOLD:
            self.rewards = {seat: -1.0 if seat == mover else 1.0 for seat in SEATS}
            self.terminations = {seat: True for seat in SEATS}
        elif self.ply == PLIES:
            self.terminations = {seat: True for seat in SEATS}
        self.agent_selection = SEATS[self.ply % 2]

    def close(self) -> None:
        pass


def env() -> Folds:
    return Folds()
