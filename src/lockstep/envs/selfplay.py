"""Self-play: a turn-based PettingZoo game (the AEC API) as env slots seen from the learning player.

``pettingzoo:MODULE`` names a self-play game when MODULE has no ``parallel_env`` (a turn-based game, e.g.
``pettingzoo:pettingzoo.classic.connect_four_v3``). Every seat must observe and act in the same spaces:
one policy plays them all.

Each slot is one game seen from the *learning* player, whose seat alternates from game to game (slot ``i``
takes seat ``(i + games) % seats``), so the policy learns every side. One learning step is the learning
player's move, then the opponents' moves until it is the learning player's turn again or the game ends.
The step's reward is the learning player's reward summed over those plies, terminated when the game ended
at any of them (truncated when the game says so instead), and the observation is the learning player's,
with its action mask. A game that ended is reset in the same step (Gymnasium's same-step autoreset), and
where the learning seat moves second the opponents' first moves are played before the observation comes
back; ``infos["episode"]`` reports each game's return and learning moves, as ``envs.FinishedEpisodes`` does.

A game that ends before the learning player moved in it (the opponents' first moves decided it: a fold on
the first ply) is no episode of the learning player's: it has no step, so it adds no reward to any step (not
to the step that ended the game before it in the same slot), sets no done flag, has no ``infos["episode"]``
row and is no sample; it is counted apart, in ``decided_before_move`` (``episode_count`` counts the
episodes: the games played are their sum), and the next game begins at once. Any reward the learning player
gets in a game before its first move comes with that move's step, so that an episode's return is always the
sum of its steps' rewards. Invariants: a slot ends at most one episode per step, every episode has at least
one learning move, and each game's reward goes to a step of that game or to none.

Who moves for the opponents: ``opponent`` (obs, waiting) -> actions, called with the opponents' observations
of every slot [k, *obs] (a slot with no opponent to move sends the learning player's, to keep the shape)
and which slots wait [k] bool; the actions of the other slots are ignored. The actor passes its second
connection to the learner (which plays the opponents' snapshots, ``learner.opponents``), and with each
request the games decided before the learning player moved since the previous one (``take_decided``), which
the learner counts; the default plays uniformly random legal moves. ``stepping`` and ``resetting`` are the
same moves as generators that yield each request and take the actions back, so that an event loop can await
the opponent (``actor.inprocess``). No torch here: the actor steps these envs.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Generator
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

from lockstep.envs.spaces import slot_action

SCHEME = "pettingzoo"

Opponent = Callable[[Any, np.ndarray], np.ndarray]  # (obs [k, *obs], waiting [k] bool) -> actions [k]
Plies = Generator[tuple[Any, np.ndarray], np.ndarray, Any]  # yields requests, takes actions, returns the result


def game_module(name: str) -> Any:
    """The PettingZoo module ``name`` (``pettingzoo.classic.connect_four_v3``), or a ValueError saying why not."""
    try:
        return importlib.import_module(name)
    except ImportError as err:
        raise ValueError(f"cannot import the PettingZoo module {name!r} of env id '{SCHEME}:{name}' ({err}); "
                         "PettingZoo games need pettingzoo and the game's own extras (pip install pettingzoo)") from err


def is_game(env_id: str) -> bool:
    """Whether ``env_id`` names a self-play game: ``pettingzoo:MODULE`` of a turn-based game."""
    scheme, _, name = env_id.partition(":")
    return scheme == SCHEME and is_turn_based(name)


def is_turn_based(name: str) -> bool:
    """Whether ``pettingzoo:name`` is a self-play game: a module with ``env()`` (AEC) and no ``parallel_env``."""
    module = game_module(name)
    return hasattr(module, "env") and not hasattr(module, "parallel_env")


class RandomOpponent:
    """Uniformly random legal moves (the action mask of a Dict observation), reproducible from ``seed``."""

    def __init__(self, mask_key: str = "action_mask", seed: int = 0) -> None:
        self.mask_key, self.rng = mask_key, np.random.default_rng(seed)

    def __call__(self, obs: Any, waiting: np.ndarray) -> np.ndarray:
        mask = np.asarray(obs[self.mask_key], bool)  # [k, n]
        scores = self.rng.random(mask.shape) + mask  # a legal move always outscores an illegal one
        return scores.argmax(axis=1)


class SelfPlayVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` games of the PettingZoo module ``name``, each seen from its learning player (module docstring)."""

    def __init__(self, name: str, num_envs: int, opponent: Opponent | None = None,
                 kwargs: dict[str, Any] | None = None) -> None:
        module = game_module(name)
        self.games = [module.env(**(kwargs or {})) for _ in range(num_envs)]
        first = self.games[0]
        self.seats = list(first.possible_agents)
        spaces = {seat: (first.observation_space(seat), first.action_space(seat)) for seat in self.seats}
        for seat, pair in spaces.items():
            if pair != spaces[self.seats[0]]:
                raise ValueError(f"'{SCHEME}:{name}': seat {seat} observes {pair[0]} and acts in {pair[1]}, seat "
                                 f"{self.seats[0]} in {spaces[self.seats[0]]}; self-play needs every seat in the same "
                                 "spaces (one policy plays them all)")
        self.num_envs = num_envs
        self.single_observation_space, self.single_action_space = spaces[self.seats[0]]
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
        self.opponent: Opponent = opponent or RandomOpponent()
        self.games_played = np.zeros(num_envs, np.int64)  # per slot: games begun, which picks the learning seat
        self.learner = [self.seats[0]] * num_envs  # per slot: the learning player's seat in its current game
        self.episode_count = 0  # games that ended after the learning player moved in them: its episodes
        self.decided_before_move = 0  # games that ended before the learning player moved in them: no episode
        self.opponent_moves = 0  # plies the opponents played
        self._return = np.zeros(num_envs, np.float64)  # per slot, the current game's: the learning player's reward
        self._length = np.zeros(num_envs, np.int64)  # ... the learning player's moves
        self._plies = np.zeros(num_envs, np.int64)  # ... every seat's moves
        # per slot, the last game decided before the learning player moved and not yet taken (``take_decided``):
        # the learning player's return in it and its plies (0: none)
        self._decided_return = np.zeros(num_envs, np.float64)
        self._decided_plies = np.zeros(num_envs, np.int64)

    # -- the Gymnasium vector API, with ``self.opponent`` moving for the opponents ---------------------

    def reset(self, *, seed: int | list[int] | None = None, options: dict | None = None):
        return drive(self.resetting(seed), self.opponent)

    def step(self, actions):
        return drive(self.stepping(actions), self.opponent)

    def close_extras(self, **kwargs: Any) -> None:
        for game in self.games:
            game.close()

    # -- the same as generators of opponent requests --------------------------------------------------

    def resetting(self, seed: int | list[int] | None = None) -> Plies:
        seeds = seed if isinstance(seed, list) else [None if seed is None else seed + i for i in range(self.num_envs)]
        for i, game_seed in enumerate(seeds):
            self._begin(i, game_seed)
        ended = np.zeros(self.num_envs, bool)
        yield from self._opponents(ended, ended.copy(), np.zeros(self.num_envs), {})
        return self._observe(), {}

    def stepping(self, actions) -> Plies:
        reward = np.zeros(self.num_envs, np.float64)
        terminated, truncated = np.zeros(self.num_envs, bool), np.zeros(self.num_envs, bool)
        info: dict[str, Any] = {}
        for i in range(self.num_envs):
            if not self._length[i]:  # its first move of the game: what the game gave it before comes with it
                reward[i] += self._return[i]
            self._length[i] += 1
            self._ply(i, slot_action(actions, i), reward, terminated, truncated, info)
        yield from self._opponents(terminated, truncated, reward, info)
        return self._observe(), reward.astype(np.float32), terminated, truncated, info

    def take_decided(self) -> tuple[np.ndarray, np.ndarray]:
        """The games decided before the learning player moved (module docstring) since the last call: the learning
        player's return in each [d] float64 and its plies [d] int64 (the opponents', at least 1). Called at every
        opponent request it misses none: only the plies that answer a request are opponent moves, so a slot
        decides at most one such game between two requests."""
        slots = np.flatnonzero(self._decided_plies)
        returns, plies = self._decided_return[slots], self._decided_plies[slots]  # copies (fancy indexing)
        self._decided_plies[slots] = 0
        return returns, plies

    # -- one game ---------------------------------------------------------------------------------------

    def _begin(self, i: int, seed: int | None) -> None:
        """Start slot ``i``'s next game, the learning player in the next seat."""
        self.games[i].reset(seed=seed)  # None: a later game, from the game's own generator
        self.learner[i] = self.seats[int(i + self.games_played[i]) % len(self.seats)]
        self.games_played[i] += 1
        self._return[i], self._length[i], self._plies[i] = 0.0, 0, 0

    def _ply(self, i: int, action: Any, reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
             info: dict[str, Any]) -> None:
        """Play ``action`` for whoever moves in slot ``i``; a game that ends is recorded (an episode, or a game
        decided before the learning player moved: module docstring) and the next begun."""
        game, me = self.games[i], self.learner[i]
        game.step(int(action) if np.ndim(action) == 0 else action)
        self._plies[i] += 1
        gain = game.rewards.get(me, 0.0)
        self._return[i] += gain
        if self._length[i]:  # before the learning player's first move the step is the last game's, or none
            reward[i] += gain
        over_t, over_tr = any(game.terminations.values()), any(game.truncations.values())
        if not (over_t or over_tr):
            return
        if not self._length[i]:  # decided before the learning player moved: no step, no episode of its
            self.decided_before_move += 1
            self._decided_return[i], self._decided_plies[i] = self._return[i], self._plies[i]
            self._begin(i, None)
            return
        terminated[i], truncated[i] = over_t, over_tr and not over_t
        if truncated[i]:  # the value of a game cut short is bootstrapped from its last observation
            info.setdefault("final_obs", np.empty(self.num_envs, object))[i] = game.observe(me)
        episodes = info.setdefault("episode", {"r": np.zeros(self.num_envs), "l": np.zeros(self.num_envs, np.int64)})
        episodes["r"][i], episodes["l"][i] = self._return[i], self._length[i]
        info.setdefault("_episode", np.zeros(self.num_envs, bool))[i] = True
        self.episode_count += 1
        self._begin(i, None)

    def _opponents(self, terminated: np.ndarray, truncated: np.ndarray, reward: np.ndarray,
                   info: dict[str, Any]) -> Plies:
        """Ask for the opponents' moves, all waiting slots at once, until every slot is the learning player's turn."""
        while True:
            waiting = np.array([game.agent_selection != me for game, me in zip(self.games, self.learner)])
            if not waiting.any():
                return
            obs = [game.observe(game.agent_selection) for game in self.games]
            actions = yield concatenate(self.single_observation_space, obs,
                                        create_empty_array(self.single_observation_space, self.num_envs)), waiting
            for i in np.flatnonzero(waiting):
                self.opponent_moves += 1
                self._ply(i, slot_action(actions, i), reward, terminated, truncated, info)

    def _observe(self) -> Any:
        obs = [game.observe(me) for game, me in zip(self.games, self.learner)]
        return concatenate(self.single_observation_space, obs,
                           create_empty_array(self.single_observation_space, self.num_envs))


def drive(plies: Plies, opponent: Opponent) -> Any:
    """Run ``plies`` to its end, ``opponent`` answering each request; return what it returns."""
    try:
        request = next(plies)
        while True:
            request = plies.send(opponent(*request))
    except StopIteration as done:
        return done.value


class SelfPlayGame(gym.Env):
    """One game as a Gymnasium env (``envs.make_env``: evaluation, the hello's spaces): the learning player's
    view of a ``SelfPlayVectorEnv`` of one slot, against ``opponent`` (random legal moves by default).
    ``reset`` starts the next game (the seat alternates); the episode's last step returns the finished game's
    reward and its last observation is the next game's first, as the vector env's same-step reset leaves it."""

    def __init__(self, name: str, opponent: Opponent | None = None, **kwargs: Any) -> None:
        self.vec = SelfPlayVectorEnv(name, 1, opponent, kwargs)
        self.observation_space, self.action_space = self.vec.single_observation_space, self.vec.single_action_space
        self._started = False

    @property
    def opponent(self) -> Opponent:
        return self.vec.opponent

    @opponent.setter
    def opponent(self, opponent: Opponent) -> None:
        self.vec.opponent = opponent

    @property
    def learning_seat(self) -> str:
        return self.vec.learner[0]

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if self._started and seed is None:  # the step that ended the last game began the next one
            return self._one(self._last), {}
        self._started = True
        obs, info = self.vec.reset(seed=seed)
        self._last = obs
        return self._one(obs), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.vec.step(np.asarray([action]))
        self._last = obs
        return self._one(obs), float(reward[0]), bool(terminated[0]), bool(truncated[0]), {}

    def close(self) -> None:
        self.vec.close()

    def _one(self, obs: Any) -> Any:
        return {key: value[0] for key, value in obs.items()} if isinstance(obs, dict) else obs[0]


def make_game(name: str, **kwargs: Any) -> SelfPlayGame:
    """The env of the id ``pettingzoo:name`` for a turn-based game, built with ``kwargs`` (``env.kwargs``)."""
    return SelfPlayGame(name, **kwargs)
