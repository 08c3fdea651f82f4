"""Playing whole episodes of a policy on one env: the one episode loop of ``lockstep eval`` (``tools.eval``) and
of evaluation while training (``learner.evaluation``).

How it plays (``play``): one env,
``envs.make_env(env_id, training=False)`` (for ``atari:`` ids one episode per game and raw scores),
episodes one after another. Actions are sampled as the learner samples them
(``inference.act``) from counter-based noise of ``--seed``; with
``--deterministic`` they are the mode (argmax for Discrete, the Gaussian's mean for Box). The env is
reset with ``--seed`` once, so the same seed plays the same episodes. The policy's state (recurrent
policies) is zeroed at each episode start. Box actions are clipped to the space's bounds, as the actor clips them.

Video (``--video DIR``): the env renders ``rgb_array`` frames (one after the reset and one per step, so an
episode of L steps has L + 1 frames where the env counts every step it takes; Atari's reset presses
no-ops and FIRE that count in the episode length but show no frame) written as ``DIR/episode-NNN.mp4``
by imageio with imageio-ffmpeg (``pip install -e '.[video]'``). MuJoCo renders through OpenGL: without
a display, ``MUJOCO_GL=egl`` (set here when unset and there is no display) renders headless with a
GPU's EGL or Mesa's; ``MUJOCO_GL=osmesa`` is the fallback where EGL is missing. Classic-control envs draw
with pygame, told ``SDL_VIDEODRIVER=dummy`` in the same case so that SDL does not look for a display.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from lockstep import config as config_lib
from lockstep.algo import noise
from lockstep.algo.normalize import ObsNormalizer, as_tensors
from lockstep.envs import SpaceSpec, action_spec, env_actions, make_env, stack_records, to_records, with_action_mask
from lockstep.learner.inference import act
from lockstep.models import Policy
from lockstep.observe.run_dir import NotARunDir, RunDir

VIDEO_INSTALL = "pip install -e '.[video]'"
ATARI_FPS = 15  # the ALE runs at 60 frames a second and each agent step holds its action for wrap_atari's 4


class EvalError(Exception):
    """Nothing to evaluate, or no way to: the message says what is missing and how to get it."""


@dataclass
class Episode:
    ret: float  # the return the env recorded (Atari: the raw game score)
    length: int  # steps the env recorded
    frames: int = 0  # frames in the video, 0 without one
    video: str | None = None


def outcomes(returns) -> dict[str, float]:
    """A two-player game's win, draw and loss rates: the learning player's return above, at or below 0."""
    returns = np.asarray(returns, np.float64)
    return {"win_rate": float(np.mean(returns > 0)), "draw_rate": float(np.mean(returns == 0)),
            "loss_rate": float(np.mean(returns < 0))}


def load_config(run_dir: Path) -> config_lib.Config:
    """The run directory's config; an ``EvalError`` where it holds none."""
    try:
        return RunDir(run_dir).config()
    except NotARunDir as err:
        raise EvalError(str(err)) from err


def env_specs(env, env_config: config_lib.EnvConfig) -> tuple[SpaceSpec, SpaceSpec]:
    """The observation and action specs of ``env`` as the run's actors described them: the Dict keys of
    ``env.obs_keys`` kept, the action mask leaf marked."""
    act_spec = action_spec(env.action_space)
    obs_spec = with_action_mask(SpaceSpec.from_space(env.observation_space, env_config.obs_keys), act_spec,
                                env_config.action_mask_key)
    return obs_spec, act_spec


def play(env, env_id: str, model: Policy, normalize: ObsNormalizer, specs: tuple[SpaceSpec, SpaceSpec],
         episodes: int, deterministic: bool, seed: int, device: torch.device, video_dir: Path | None = None,
         on_episode=None) -> list[Episode]:
    """The one episode loop (``lockstep eval`` and evaluation while training): ``episodes`` episodes of ``model``
    on ``env`` (made by ``make(env_id, video_dir is not None)``; ``specs`` from ``env_specs``), reset with ``seed``
    once (module docstring). ``on_episode(i, episode)`` is called as each ends."""
    obs_spec, act_spec = specs
    player = _Player(model, normalize, act_spec, deterministic, seed, device, obs_spec)
    writer = _VideoWriter(video_dir, _fps(env_id, env)) if video_dir is not None else None
    played = []
    obs, _ = env.reset(seed=seed)
    for i in range(episodes):
        if i:
            obs, _ = env.reset()
        episode = _play(env, player, obs, writer, i)
        played.append(episode)
        if on_episode is not None:
            on_episode(i, episode)
    return played


def make(env_id: str, render: bool, kwargs: dict | None = None):
    """One env of ``env_id`` as evaluation plays it (``training=False``), rendering ``rgb_array`` frames when
    ``render``, built with ``kwargs`` (``env.kwargs``); an ``EvalError`` that says why it cannot be made."""
    try:
        return _make_env(env_id, render, kwargs or {})
    except (ValueError, gym.error.Error) as err:  # an env package this machine lacks, ...
        raise EvalError(f"cannot make {env_id}: {err}") from err


def _make_env(env_id: str, render: bool, kwargs: dict):
    if not render:
        return make_env(env_id, training=False, **kwargs)
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        os.environ.setdefault("MUJOCO_GL", "egl")  # read when MuJoCo makes its first GL context, below
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame (classic control) draws off screen, silently
    try:
        env = make_env(env_id, training=False, render_mode="rgb_array", **kwargs)
    except TypeError as err:  # a factory without render_mode
        raise EvalError(f"cannot record {env_id}: its factory does not take render_mode ({err})") from err
    if "rgb_array" not in env.metadata.get("render_modes", []):
        env.close()
        raise EvalError(f"cannot record {env_id}: it does not render rgb_array frames")
    return env


def _fps(env_id: str, env) -> float:
    if env_id.startswith("atari:"):
        return ATARI_FPS
    return float(env.metadata.get("render_fps") or 30)


class _Player:
    """Chooses actions for one env: sampled with the learner's noise, or the mode."""

    def __init__(self, model: Policy, normalize: ObsNormalizer, action: SpaceSpec, deterministic: bool,
                 seed: int, device: torch.device, observation: SpaceSpec) -> None:
        self.model, self.normalize, self.device, self.deterministic = model, normalize, device, deterministic
        self.observation = observation  # a Dict or Tuple observation is turned into records, as the actor does
        self.action = action
        self.keys = noise.slot_keys(seed, 0, 1)
        self.steps = 0
        self.state = model.initial_state(1)  # [1, S]

    def start_episode(self) -> None:
        self.state = self.model.initial_state(1)

    def __call__(self, obs: np.ndarray) -> Any:
        batch = stack_records([obs], self.observation)  # [1, *obs]; records for a Dict or Tuple observation
        if self.deterministic:
            action, self.state = self._mode(batch)
        else:
            uniform = noise.uniform(self.keys, np.array([self.steps], np.uint64), self.model.noise_width)
            action, _, _, self.state = act(self.model, self.normalize, batch, uniform, self.state, self.device)
        self.steps += 1
        # as the actor makes them of the learner's actions: Box parts clipped (the policy's mean may lie
        # outside), flat vectors cut into the space's parts; then the one env's
        chosen = env_actions(action, self.action)
        if self.action.discrete:
            return int(chosen[0])
        if isinstance(chosen, dict):
            return {path: part[0] for path, part in chosen.items()}
        if isinstance(chosen, tuple):
            return tuple(part[0] for part in chosen)
        return chosen[0]

    def _mode(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The most likely action: obs [1, *obs] -> action [1, *act], next state [1, S]."""
        with torch.inference_mode():
            x = self.normalize(as_tensors(batch, self.device))
            action, after = self.model.mode(x, torch.as_tensor(self.state, device=self.device))
            return action.cpu().numpy(), after.cpu().numpy()


def _play(env, player: _Player, obs: np.ndarray, writer: _VideoWriter | None, index: int) -> Episode:
    player.start_episode()
    if writer is not None:
        writer.open(index)
        writer.add(env.render())
    total, steps = 0.0, 0
    while True:
        obs, reward, terminated, truncated, info = env.step(player(obs))
        total, steps = total + float(reward), steps + 1
        if writer is not None:
            writer.add(env.render())
        if terminated or truncated:
            break
    recorded = info.get("episode")
    episode = Episode(float(recorded["r"]), int(recorded["l"])) if recorded else Episode(total, steps)
    if writer is not None:
        episode.video, episode.frames = writer.close()
    return episode


class _VideoWriter:
    """One mp4 per episode, written frame by frame (an episode's frames need not fit in memory)."""

    def __init__(self, directory: Path, fps: float) -> None:
        try:
            import imageio.v2 as imageio
            import imageio_ffmpeg  # noqa: F401  (imageio finds ffmpeg through it)
        except ImportError as err:
            raise EvalError(f"--video needs imageio and imageio-ffmpeg: {VIDEO_INSTALL} ({err})") from err
        self._imageio, self.directory, self.fps = imageio, directory, fps
        directory.mkdir(parents=True, exist_ok=True)
        self._writer, self._path, self._frames = None, None, 0

    def open(self, index: int) -> None:
        self._path = self.directory / f"episode-{index:03d}.mp4"
        # macro_block_size=1: frames keep their size (padded to even, as yuv420p needs) instead of being rescaled
        self._writer = self._imageio.get_writer(self._path, fps=self.fps, codec="libx264", quality=8,
                                                macro_block_size=1, pixelformat="yuv420p")
        self._frames = 0

    def add(self, frame: np.ndarray) -> None:
        h, w = frame.shape[:2]
        if h % 2 or w % 2:
            frame = np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")
        self._writer.append_data(frame)
        self._frames += 1

    def close(self) -> tuple[str, int]:
        self._writer.close()
        return str(self._path), self._frames


class ModelOpponent:
    """A policy moving for a self-play game's opponents (``envs.selfplay.Opponent``), sampled as the learner
    samples, from noise of its own stream."""

    def __init__(self, model: Policy, normalize: ObsNormalizer, observation: SpaceSpec, seed: int,
                 device: torch.device) -> None:
        self.model, self.normalize, self.observation, self.device = model, normalize, observation, device
        self.keys = noise.slot_keys(seed, 1 << 40, 1)
        self.moves = 0

    def __call__(self, obs: Any, waiting: np.ndarray) -> np.ndarray:
        records = to_records(obs, self.observation)  # [k]
        k = len(records)
        uniform = noise.uniform(np.repeat(self.keys, k), np.full(k, self.moves, np.uint64), self.model.noise_width)
        self.moves += 1
        return act(self.model, self.normalize, records, uniform, self.model.initial_state(k), self.device)[0]


