"""MinAtar (Young and Tian, 2019): five Atari-like games on a 10 x 10 grid, small enough to learn on a CPU.

``make_minatar(game)`` is what the env id ``minatar:GAME`` builds (``minatar:breakout``; the games are
``GAMES``): ``MinAtarEnv``, a Gymnasium env around the ``minatar`` package's ``Environment``, inside a time
limit of 10,000 agent steps (truncation; some games, Seaquest among them, can otherwise run very long).

- observation: Box(0, 1, (C, 10, 10), uint8), channels first, one channel per kind of object (C is 4 to 10)
- action: Discrete(n) over the game's minimal action set (3 to 6 actions; ``minimal_actions=False``: all 6)
- sticky actions with probability 0.1, MinAtar's default (``sticky_action_prob``); a new episode has no
  previous action to repeat
- ``reset(seed=s)`` seeds the game's random stream, which also decides the sticky actions

Training and evaluation use the same env. Imports ``minatar`` only when a game is made
(``pip install -e '.[minatar]'``), and never torch.
"""

from __future__ import annotations

import difflib
from typing import Any

import gymnasium as gym
import numpy as np

GAMES = ("asterix", "breakout", "freeway", "seaquest", "space_invaders")
MAX_EPISODE_STEPS = 10_000


class MinAtarEnv(gym.Env):
    """One MinAtar game as a Gymnasium env (module docstring)."""

    metadata = {"render_modes": []}

    def __init__(self, game: str, sticky_action_prob: float = 0.1, minimal_actions: bool = True,
                 difficulty_ramping: bool = True) -> None:
        check_game(game)
        try:
            from minatar import Environment
        except ImportError as err:
            raise ValueError(f"MinAtar env ids need minatar: pip install -e '.[minatar]' ({err})") from err
        self.game = Environment(game, sticky_action_prob=sticky_action_prob, difficulty_ramping=difficulty_ramping)
        self.actions = list(self.game.minimal_action_set()) if minimal_actions else list(range(self.game.num_actions()))
        rows, cols, channels = self.game.state_shape()
        self.observation_space = gym.spaces.Box(0, 1, (channels, rows, cols), np.uint8)
        self.action_space = gym.spaces.Discrete(len(self.actions))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self.game.seed(seed)
        self.game.reset()
        self.game.last_action = 0  # MinAtar keeps it across episodes: a seeded reset would not repeat without this
        return self._observation(), {}

    def step(self, action) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward, done = self.game.act(self.actions[int(action)])
        return self._observation(), float(reward), bool(done), False, {}

    def _observation(self) -> np.ndarray:
        return np.ascontiguousarray(self.game.state().transpose(2, 0, 1), dtype=np.uint8)  # [H, W, C] -> [C, H, W]


def make_minatar(game: str, training: bool = True, max_episode_steps: int = MAX_EPISODE_STEPS,
                 **kwargs) -> gym.Env:
    """The env of ``minatar:GAME``: ``MinAtarEnv(game, **kwargs)`` cut at ``max_episode_steps`` agent steps.
    ``training`` changes nothing: MinAtar is trained and evaluated on the same env."""
    return gym.wrappers.TimeLimit(MinAtarEnv(game, **kwargs), max_episode_steps)


def check_game(game: str) -> None:
    if game in GAMES:
        return
    close = difflib.get_close_matches(game, GAMES, n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise ValueError(f"unknown MinAtar game {game!r} in env id 'minatar:{game}': {hint}"
                     f"the games are {', '.join(GAMES)}")
