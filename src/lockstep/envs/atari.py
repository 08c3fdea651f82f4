"""Atari 2600 games through the ALE, preprocessed as in DQN (Mnih et al., 2015) and CleanRL's ``ppo_atari.py``.

``make_atari(game)`` is what the env id ``atari:GAME`` builds (``atari:BreakoutNoFrameskip-v4``). From the
emulator outwards (``wrap_atari``):

- ``NoopReset``: after a reset, 1 to 30 no-op frames, drawn from the env's own ``np_random`` (a seeded reset
  repeats them)
- ``MaxAndSkip``: each action held for 4 frames, rewards summed; the observation is the pixel-wise max of the
  last two frames (the ALE draws some sprites only on alternate frames)
- ``RecordEpisodeStatistics`` (Gymnasium's): the episode statistics the actor reports, below the two
  wrappers that change them, so they are the raw score of a whole game (all lives) and its length in agent
  steps, the steps the wrappers above take after a reset included
- ``EpisodicLife``, training only: a lost life ends the episode; only a game over resets the game
- ``FireReset``, for games with a FIRE action: press it after every reset (Breakout waits for it); when
  evaluating, also after a lost life
- ``ClipReward``, training only: the sign of the reward
- ``ResizeFrame``: 84 x 84 by area averaging, in numpy
- ``FrameStack``: the last 4 frames, oldest first, channels first: Box(0, 255, (4, 84, 84), uint8)

The emulator gives greyscale frames itself (``obs_type="grayscale"``) and skips no frames (``frameskip=1``,
also for ``ALE/...-v5`` ids, whose own skip would compound ours); sticky actions are as the id defines them
(none for ``NoFrameskip-v4``, 0.25 for ``-v5``). ``training=False`` is the env to evaluate a policy on: same
observations and actions, one episode per game, unclipped rewards.

Imports ``ale_py`` only when a game is made (``pip install -e '.[atari]'``), and never torch.
"""

from __future__ import annotations

import difflib
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

ATARI_ENTRY_POINT = "ale_py.env:AtariEnv"
NOOP = 0  # the ALE's action 0 is NOOP in every game's minimal action set


def _ale(env: gym.Env):
    return env.unwrapped.ale


class NoopReset(gym.Wrapper):
    """Start each game after a random number (1 to ``noop_max``) of no-op frames, so that a deterministic
    emulator does not start every episode from the same state."""

    def __init__(self, env: gym.Env, noop_max: int = 30) -> None:
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings()
        if meanings[NOOP] != "NOOP":
            raise ValueError(f"action {NOOP} of {env.spec.id if env.spec else env} is {meanings[NOOP]}, not NOOP")
        self.noop_max = noop_max

    def reset(self, **kwargs) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        for _ in range(int(self.np_random.integers(1, self.noop_max + 1))):
            obs, _, terminated, truncated, info = self.env.step(NOOP)
            if terminated or truncated:
                obs, info = self.env.reset()
        return obs, info


class MaxAndSkip(gym.Wrapper):
    """Hold each action for ``skip`` frames; return the summed reward and the pixel-wise max of the last two
    frames, or the only frame when the game ended on the first."""

    def __init__(self, env: gym.Env, skip: int = 4) -> None:
        super().__init__(env)
        self.skip = skip

    def step(self, action) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        total = 0.0
        previous = last = None
        for _ in range(self.skip):
            previous = last
            last, reward, terminated, truncated, info = self.env.step(action)
            total += float(reward)
            if terminated or truncated:
                break
        obs = last if previous is None else np.maximum(previous, last)
        return obs, total, terminated, truncated, info


class EpisodicLife(gym.Wrapper):
    """End the episode when a life is lost, so that the value of losing one is learnt directly; the game
    goes on, and only a game over (or a seeded reset) resets the emulator."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = terminated or truncated
        lives = _ale(self).lives()
        if 0 < lives < self.lives:  # at 0 lives the game itself is over
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs) -> tuple[np.ndarray, dict[str, Any]]:
        if self.game_over or kwargs.get("seed") is not None:
            obs, info = self.env.reset(**kwargs)
        else:  # one no-op to move on from the frame where the life was lost
            obs, _, terminated, truncated, info = self.env.step(NOOP)
            if terminated or truncated:
                obs, info = self.env.reset()
        self.game_over = False
        self.lives = _ale(self).lives()
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE after every reset: games like Breakout do not start until it is pressed, and a policy that
    never learnt to press it would wait until the time limit. Training resets after every lost life
    (``EpisodicLife``); without it, ``on_life_loss=True`` presses FIRE after a lost life as well."""

    def __init__(self, env: gym.Env, on_life_loss: bool = False) -> None:
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings()
        if "FIRE" not in meanings:
            raise ValueError(f"{env.spec.id if env.spec else env} has no FIRE action: {meanings}")
        self.fire = meanings.index("FIRE")
        self.on_life_loss = on_life_loss
        self.lives = 0

    def reset(self, **kwargs) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        obs, _, terminated, truncated, info = self.env.step(self.fire)
        if terminated or truncated:
            obs, info = self.env.reset()
        self.lives = _ale(self).lives()
        return obs, info

    def step(self, action) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = _ale(self).lives()
        if self.on_life_loss and lives < self.lives and not (terminated or truncated):
            obs, fire_reward, terminated, truncated, info = self.env.step(self.fire)
            reward = float(reward) + float(fire_reward)
        self.lives = lives
        return obs, reward, terminated, truncated, info


class ClipReward(gym.RewardWrapper):
    """Train on the sign of the reward (-1, 0, 1), so that one learning rate suits games with any score scale."""

    def reward(self, reward: SupportsFloat) -> float:
        return float(np.sign(float(reward)))


def area_weights(size_in: int, size_out: int) -> np.ndarray:
    """[size_out, size_in] weights that shrink one axis by area averaging: output pixel i covers input
    coordinates [i * s, (i + 1) * s) with s = size_in / size_out, and averages the input pixels in it, each
    weighted by the length it overlaps. Every row sums to 1."""
    if not 0 < size_out <= size_in:
        raise ValueError(f"area averaging shrinks: cannot resize {size_in} pixels to {size_out}")
    scale = size_in / size_out
    edges = np.arange(size_out + 1) * scale  # output pixel boundaries in input coordinates
    pixel = np.arange(size_in)
    overlap = np.minimum(edges[1:, None], pixel[None, :] + 1) - np.maximum(edges[:-1, None], pixel[None, :])
    overlap[overlap < 1e-9] = 0.0  # rounding at edges that fall on a pixel boundary
    return (overlap / scale).astype(np.float32)


def _taps(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The nonzero weights of each row of ``weights`` (one run of neighbours) as [out, k] input indices and
    [out, k] weights, k the longest run; shorter rows are padded with weight 0."""
    nonzero = weights > 0
    taps = int(nonzero.sum(axis=1).max())
    index = nonzero.argmax(axis=1)[:, None] + np.arange(taps)
    inside = index < weights.shape[1]
    index = np.minimum(index, weights.shape[1] - 1)
    return index, np.where(inside, np.take_along_axis(weights, index, axis=1), 0.0).astype(np.float32)


class AreaResize:
    """Shrink frames [..., H, W] of uint8 to [..., height, width] by area averaging (OpenCV's INTER_AREA), rounded
    to the nearest integer: ``area_weights(H, height) @ frame @ area_weights(W, width).T`` on each of the leading
    axes (an RGB frame's channels), summed over the 2 or 3 nonzero weights in each row rather than by a BLAS matrix
    product, which in an actor busy with other envs costs a hundred times more (its threads wait for cores)."""

    def __init__(self, size_in: tuple[int, int], size_out: tuple[int, int]) -> None:
        self.row_index, self.row_weight = _taps(area_weights(size_in[0], size_out[0]))  # [height, k]
        self.col_index, self.col_weight = _taps(area_weights(size_in[1], size_out[1]))  # [width, k]

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        rows = np.einsum("...hkw,hk->...hw", frame[..., self.row_index, :], self.row_weight)  # [..., height, W]
        out = np.einsum("...hwk,wk->...hw", rows[..., self.col_index], self.col_weight)  # [..., height, width]
        return np.clip(np.rint(out), 0, 255).astype(np.uint8, order="C")  # einsum's own order is not C's


class ResizeFrame(gym.ObservationWrapper):
    """Shrink a 2-D uint8 frame to ``height`` x ``width`` by area averaging (``AreaResize``)."""

    def __init__(self, env: gym.Env, height: int = 84, width: int = 84) -> None:
        super().__init__(env)
        space = env.observation_space
        if not (isinstance(space, gym.spaces.Box) and len(space.shape) == 2 and space.dtype == np.uint8):
            raise ValueError(f"ResizeFrame takes 2-D uint8 (greyscale) frames, got {space}")
        self.resize = AreaResize(space.shape, (height, width))
        self.observation_space = gym.spaces.Box(0, 255, (height, width), np.uint8)

    def observation(self, frame: np.ndarray) -> np.ndarray:
        return self.resize(frame)


class FrameStack(gym.Wrapper):
    """The last ``size`` observations stacked on a new first axis, oldest first; a reset fills the stack
    with the reset observation."""

    def __init__(self, env: gym.Env, size: int = 4) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box):
            raise ValueError(f"FrameStack takes Box observations, got {space}")
        self.frames = np.zeros((size, *space.shape), space.dtype)
        self.observation_space = gym.spaces.Box(
            np.repeat(space.low[None], size, axis=0), np.repeat(space.high[None], size, axis=0), dtype=space.dtype
        )

    def reset(self, **kwargs) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self.frames[:] = obs
        return self.frames.copy(), info  # a copy: the caller may keep it (a vector env's final_obs does)

    def step(self, action) -> tuple[np.ndarray, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.frames[:-1] = self.frames[1:]
        self.frames[-1] = obs
        return self.frames.copy(), reward, terminated, truncated, info


def wrap_atari(env: gym.Env, training: bool = True, noop_max: int = 30, skip: int = 4, size: int = 84,
               stack: int = 4) -> gym.Env:
    """The preprocessing stack (module docstring) around an ALE env made with ``frameskip=1`` and
    ``obs_type="grayscale"``. ``training=False``: no episodic life and no reward clipping, for evaluation."""
    env = NoopReset(env, noop_max)
    env = MaxAndSkip(env, skip)
    env = gym.wrappers.RecordEpisodeStatistics(env)
    if training:
        env = EpisodicLife(env)
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireReset(env, on_life_loss=not training)
    if training:
        env = ClipReward(env)
    env = ResizeFrame(env, size, size)
    return FrameStack(env, stack)


def make_atari(game: str, training: bool = True, **kwargs) -> gym.Env:
    """The env of ``atari:GAME``: ``gym.make(game)`` (kwargs go to it, e.g. ``repeat_action_probability``)
    inside ``wrap_atari``. Raises ValueError if ale_py is missing or ``game`` is not an ALE game."""
    register_atari()
    check_game(game)
    return wrap_atari(gym.make(game, obs_type="grayscale", frameskip=1, **kwargs), training=training)


def register_atari() -> None:
    """Register the ALE's Gymnasium ids, or say how to install them."""
    try:
        import ale_py
    except ImportError as err:
        raise ValueError(f"Atari env ids need ale-py: pip install -e '.[atari]' ({err})") from err
    gym.register_envs(ale_py)


def atari_games() -> list[str]:
    """Every registered Gymnasium id of an ALE game (after ``register_atari``)."""
    return sorted(env_id for env_id, spec in gym.registry.items() if spec.entry_point == ATARI_ENTRY_POINT)


def check_game(game: str) -> None:
    spec = gym.registry.get(game)
    if spec is not None and spec.entry_point == ATARI_ENTRY_POINT:
        return
    by_lower = {env_id.lower(): env_id for env_id in atari_games()}
    close = [by_lower[m] for m in difflib.get_close_matches(game.lower(), list(by_lower), n=10, cutoff=0.6)]
    suggestions = list(dict.fromkeys(_dqn_id(env_id) for env_id in close))[:3]
    hint = f"closest: {', '.join(suggestions)}" if suggestions else "e.g. PongNoFrameskip-v4, BreakoutNoFrameskip-v4"
    raise ValueError(f"unknown Atari game {game!r} in env id 'atari:{game}': not a Gymnasium id of ale_py ({hint})")


def _dqn_id(env_id: str) -> str:
    """The ``NoFrameskip-v4`` id of the game of ``env_id`` (the DQN setting) where there is one."""
    name = env_id.removeprefix("ALE/").split("-")[0].removesuffix("NoFrameskip")
    return f"{name}NoFrameskip-v4" if f"{name}NoFrameskip-v4" in gym.registry else env_id
