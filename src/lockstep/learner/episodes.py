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

PettingZoo parallel envs (``play_parallel``): one env as lockstep's own vector env of it (``make_slots``: a
``ParallelSlots`` of one env, one slot per agent), so that the observations reach the policy exactly as in
training (the Dict of the agent's own, ``agent_active`` and, with ``env.agent_id``, ``agent_id``). One
function acts for every slot (``SlotsAct``; ``slots_act`` builds it of the run's policy, which every agent
shares, ``SHARED_POLICY``); each slot's noise is its own stream of ``--seed`` and a recurrent state is zeroed
where the slot's agent starts an episode, as the learner does. An agent's return is its rewards summed until
it left (its slot is inactive from then until the env's episode ends, its actions ignored); the env's episode
ends when every agent has left, and its team return is its agents' returns summed (``TeamEpisode``). Agents
are grouped by the policy that acts for them (``policy_of_agents``, ``policy_returns``). With several policies
(``policies``, ``learner.team``) ``team_act`` acts: each policy for its own agents' slots, from its own part of
their observations, with a noise stream of its own, its actions put together as the learner puts them. Video: the env is
made with ``render_mode="rgb_array"`` and renders after its reset and after each step, the episode's last
step included (``ParallelSlots`` resets the env in that same step, so the frame is taken inside it).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from lockstep import config as config_lib
from lockstep.algo import noise
from lockstep.algo.normalize import ObsNormalizer, as_tensors
from lockstep.envs import (
    SpaceSpec,
    action_spec,
    env_actions,
    make_env,
    pettingzoo,
    selfplay,
    stack_records,
    to_records,
    with_action_mask,
)
from lockstep.envs.spaces import ACTIVE_LEAF
from lockstep.learner.inference import act
from lockstep.models import Policy
from lockstep.observe.run_dir import NotARunDir, RunDir

VIDEO_INSTALL = "pip install -e '.[video]'"
ATARI_FPS = 15  # the ALE runs at 60 frames a second and each agent step holds its action for wrap_atari's 4
SHARED_POLICY = "shared"  # the name of the one policy a parallel env's agents share


class EvalError(Exception):
    """Nothing to evaluate, or no way to: the message says what is missing and how to get it."""


@dataclass
class Episode:
    ret: float  # the return the env recorded (Atari: the raw game score)
    length: int  # steps the env recorded
    frames: int = 0  # frames in the video, 0 without one
    video: str | None = None


@dataclass
class TeamEpisode:
    """One episode of a PettingZoo parallel env: each agent's return and steps until it left."""

    returns: dict[str, float]  # agent -> its rewards summed until it left, for the agents that were in it
    lengths: dict[str, int]  # agent -> its steps
    length: int  # the env's steps: until its last agent left
    frames: int = 0  # frames in the video, 0 without one
    video: str | None = None

    @property
    def ret(self) -> float:
        """The team return: the agents' returns summed."""
        return float(sum(self.returns.values()))


# A parallel env's acting: the slots' observation records [A] (possible_agents order) and which slots start an
# agent's episode [A] bool (their recurrent state starts from zeros) -> the actions ParallelSlots.step takes
SlotsAct = Callable[[np.ndarray, np.ndarray], Any]


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
    return _specs(env.observation_space, env.action_space, env_config)


def slot_specs(slots: pettingzoo.ParallelSlots, env_config: config_lib.EnvConfig) -> tuple[SpaceSpec, SpaceSpec]:
    """The observation and action specs of one slot of ``slots``, as ``env_specs`` gives an env's."""
    return _specs(slots.single_observation_space, slots.single_action_space, env_config)


def _specs(observation, action, env_config: config_lib.EnvConfig) -> tuple[SpaceSpec, SpaceSpec]:
    act_spec = action_spec(action)
    obs_spec = with_action_mask(SpaceSpec.from_space(observation, env_config.obs_keys), act_spec,
                                env_config.action_mask_key)
    return obs_spec, act_spec


def parallel_module(env_id: str) -> str | None:
    """MODULE of a PettingZoo parallel env's id (``pettingzoo:MODULE`` with a ``parallel_env()``), played by
    ``play_parallel``; None for every other id (one that does not import too: making its env says why)."""
    scheme, _, name = env_id.partition(":")
    if scheme != "pettingzoo":
        return None
    try:
        return None if selfplay.is_turn_based(name) else name
    except ValueError:
        return None


def policy_of_agents(slots: pettingzoo.ParallelSlots) -> tuple[str, ...]:
    """The name of the policy that acts for each agent (``possible_agents`` order): with several policies each
    agent's own (``policies``), else every agent's is the run's one policy, ``SHARED_POLICY``."""
    return slots.policy_of or (SHARED_POLICY,) * len(slots.agents)


def policy_returns(episodes: list[TeamEpisode], agents: list[str],
                   policy_of_agent: tuple[str, ...]) -> dict[str, list[float]]:
    """Each policy's returns: those of its agents (``policy_of_agent``, in ``agents`` order) in every episode,
    episode by episode; a policy's mean return is the mean over its agents' episodes."""
    grouped: dict[str, list[float]] = {name: [] for name in policy_of_agent}
    for episode in episodes:
        for agent, name in zip(agents, policy_of_agent, strict=True):
            if agent in episode.returns:
                grouped[name].append(episode.returns[agent])
    return grouped


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


def play_parallel(slots: pettingzoo.ParallelSlots, act: SlotsAct, observation: SpaceSpec, episodes: int, seed: int,
                  video_dir: Path | None = None, on_episode=None) -> list[TeamEpisode]:
    """The episode loop of a PettingZoo parallel env (module docstring): ``episodes`` episodes of its agents
    acting by ``act`` on ``slots`` (``make_slots``: one env; ``observation`` a slot's spec, ``slot_specs``),
    reset with ``seed`` once. ``on_episode(i, episode)`` is called as each ends."""
    agents = slots.agents
    film = _Film(slots, video_dir) if video_dir is not None else None
    played = []
    obs, _ = slots.reset(seed=seed)
    first = np.ones(len(agents), bool)  # [A] the slots whose agents start an episode
    for i in range(episodes):
        present = int((np.asarray(obs[ACTIVE_LEAF])[:, 0] > 0).sum())  # the agents the env's episode starts with
        if film is not None:
            film.open(i)
        returns, lengths, steps = {}, {}, 0
        while len(returns) < present:  # until every agent has left: then slots has reset the env, in that step
            obs, _, terminated, truncated, infos = slots.step(act(to_records(obs, observation), first))
            steps += 1
            first = terminated | truncated  # an agent that left: its slot's next agent episode starts afresh
            for slot in np.flatnonzero(infos.get("_episode", ())):  # the agents that left in this step
                returns[agents[slot]] = float(infos["episode"]["r"][slot])
                lengths[agents[slot]] = int(infos["episode"]["l"][slot])
        episode = TeamEpisode({a: returns[a] for a in agents if a in returns},
                              {a: lengths[a] for a in agents if a in lengths}, steps)
        if film is not None:
            episode.video, episode.frames = film.close()
        played.append(episode)
        if on_episode is not None:
            on_episode(i, episode)
    return played


def slots_act(model: Policy, normalize: ObsNormalizer, specs: tuple[SpaceSpec, SpaceSpec], deterministic: bool,
              seed: int, device: torch.device, slots: int) -> SlotsAct:
    """One policy acting for ``slots`` slots (``SlotsAct``): sampled as the learner samples, each slot from its own
    noise stream of ``seed``, or the mode when ``deterministic``."""
    obs_spec, act_spec = specs
    return _Player(model, normalize, act_spec, deterministic, seed, device, obs_spec, slots).actions


def team_act(slots: pettingzoo.ParallelSlots, config: config_lib.Config, stored: dict[str, dict[str, Any]],
             deterministic: bool, seed: int, device: torch.device, source: str) -> SlotsAct:
    """Several policies acting for one env's agents (module docstring): ``stored`` holds each policy's parameters
    (``model``, a state dict) and observation statistics (``obs_rms``), as a checkpoint's
    ``trainer.policies.NAME``; an ``EvalError`` naming ``source`` and the policy that does not fit."""
    from lockstep.algo.normalize import stored_moments
    from lockstep.envs import EnvSpec
    from lockstep.learner.team import PolicyView, policy_config
    from lockstep.models.load import PolicyMismatch, load_policy

    observation, action = slot_specs(slots, config.env)
    spec = EnvSpec(config.env.id, observation, action, agents=len(slots.agents), policy_of=slots.policy_of,
                   agent_names=tuple(slots.agents))
    A = len(slots.agents)
    players = {}
    for index, name in enumerate(spec.policies):
        if name not in stored:
            raise EvalError(f"{source} holds the policies {sorted(stored)}, not {name!r} of the run's config")
        view = PolicyView(spec, name, config.env.action_mask_key)
        mean, var = stored_moments(stored[name].get("obs_rms"))
        try:
            model, normalize = load_policy(policy_config(config, name), view.observation, view.action,
                                           stored[name]["model"], mean, var, device, f"{source} (policy {name})")
        except PolicyMismatch as err:
            raise EvalError(str(err)) from err
        rows = view.columns(A)
        players[name] = view, rows, _Player(model, normalize, view.action, deterministic, seed, device,
                                            view.observation, len(rows), stream=index)

    def act_all(records: np.ndarray, first: np.ndarray) -> Any:
        flat = np.zeros((A, *action.element_shape), action.action_dtype)  # [A, *act] as the learner sends them
        for view, rows, player in players.values():
            view.put_actions(flat, rows, player.flat(view.obs(records[rows]), first[rows]))
        return env_actions(flat, action)

    return act_all


def make_slots(env_id: str, kwargs: dict[str, Any], render: bool) -> pettingzoo.ParallelSlots:
    """One env of the PettingZoo parallel env ``env_id``, as lockstep's vector env of it with one slot per agent,
    built with ``kwargs`` as the actors build theirs (the config's ``vector_kwargs()``), rendering
    ``rgb_array`` frames when ``render``; an ``EvalError`` that says why it cannot be made."""
    kwargs = dict(kwargs)
    if render:
        _headless()
        kwargs["render_mode"] = "rgb_array"
    try:
        slots = pettingzoo.make_vector(env_id.partition(":")[2], 1, kwargs)
    except TypeError as err:  # a parallel_env without render_mode
        if not render:
            raise
        raise EvalError(f"cannot record {env_id}: its parallel_env does not take render_mode ({err})") from err
    except ValueError as err:  # a module this machine lacks, agents of different spaces, ...
        raise EvalError(f"cannot make {env_id}: {err}") from err
    if render and "rgb_array" not in getattr(slots.envs[0], "metadata", {}).get("render_modes", []):
        slots.close()
        raise EvalError(f"cannot record {env_id}: it does not render rgb_array frames")
    return slots


def make(env_id: str, render: bool, kwargs: dict | None = None):
    """One env of ``env_id`` as evaluation plays it (``training=False``), rendering ``rgb_array`` frames when
    ``render``, built with ``kwargs`` as the actors build theirs (the config's ``vector_kwargs()``: ``env.kwargs`` and
    ``env.image_layout``); an ``EvalError`` that says why it cannot be made."""
    try:
        return _make_env(env_id, render, kwargs or {})
    except (ValueError, gym.error.Error) as err:  # an env package this machine lacks, ...
        raise EvalError(f"cannot make {env_id}: {err}") from err


def _make_env(env_id: str, render: bool, kwargs: dict):
    if not render:
        return make_env(env_id, training=False, **kwargs)
    _headless()
    try:
        env = make_env(env_id, training=False, render_mode="rgb_array", **kwargs)
    except TypeError as err:  # a factory without render_mode
        raise EvalError(f"cannot record {env_id}: its factory does not take render_mode ({err})") from err
    if "rgb_array" not in env.metadata.get("render_modes", []):
        env.close()
        raise EvalError(f"cannot record {env_id}: it does not render rgb_array frames")
    return env


def _headless() -> None:
    """Without a display, envs render off screen (module docstring)."""
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        os.environ.setdefault("MUJOCO_GL", "egl")  # read when MuJoCo makes its first GL context
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # pygame (classic control, MPE) draws off screen, silently


def _fps(env_id: str, env) -> float:
    if env_id.startswith("atari:"):
        return ATARI_FPS
    return float(env.metadata.get("render_fps") or 30)


class _Player:
    """Chooses the actions of ``slots`` slots (one env's, or a parallel env's agents'): sampled with the learner's
    noise, or the mode."""

    def __init__(self, model: Policy, normalize: ObsNormalizer, action: SpaceSpec, deterministic: bool,
                 seed: int, device: torch.device, observation: SpaceSpec, slots: int = 1, stream: int = 0) -> None:
        self.model, self.normalize, self.device, self.deterministic = model, normalize, device, deterministic
        self.observation = observation  # a Dict or Tuple observation is turned into records, as the actor does
        self.action = action
        self.keys = noise.slot_keys(seed, stream, slots)  # [slots]: a policy of several has a stream of its own
        self.steps = 0
        self.state = model.initial_state(slots)  # [slots, S]

    def start_episode(self) -> None:
        self.state = self.model.initial_state(len(self.keys))

    def __call__(self, obs: np.ndarray) -> Any:
        """One env's observation -> its action."""
        # as the actor makes them of the learner's actions: Box parts clipped (the policy's mean may lie
        # outside), flat vectors cut into the space's parts; then the one env's
        chosen = self.actions(stack_records([obs], self.observation))  # [1, *obs]; records for a Dict or Tuple
        if self.action.discrete:
            return int(chosen[0])
        if isinstance(chosen, dict):
            return {path: part[0] for path, part in chosen.items()}
        if isinstance(chosen, tuple):
            return tuple(part[0] for part in chosen)
        return chosen[0]

    def actions(self, batch: np.ndarray, first: np.ndarray | None = None) -> Any:
        """Every slot's observation [slots, *obs] -> the vector env's actions (``env_actions``); the recurrent
        state of the slots ``first`` marks [slots] is zeroed first."""
        return env_actions(self.flat(batch, first), self.action)

    def flat(self, batch: np.ndarray, first: np.ndarray | None = None) -> np.ndarray:
        """``actions`` as the learner sends them: [slots, *act]."""
        if first is not None:
            self.state = np.where(first[:, None], self.model.initial_state(len(first)), self.state)
        if self.deterministic:
            action, self.state = self._mode(batch)
        else:
            uniform = noise.uniform(self.keys, np.full(len(self.keys), self.steps, np.uint64), self.model.noise_width)
            action, _, _, self.state = act(self.model, self.normalize, batch, uniform, self.state, self.device)
        self.steps += 1
        return action

    def _mode(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The most likely action: obs [slots, *obs] -> action [slots, *act], next state [slots, S]."""
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


class _Filmed:
    """A PettingZoo parallel env that hands ``frame(image, reset)`` a frame after its every reset and step."""

    def __init__(self, env, frame: Callable[[np.ndarray, bool], None]) -> None:
        self._env, self._frame = env, frame

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def reset(self, *args, **kwargs):
        out = self._env.reset(*args, **kwargs)
        self._frame(self._env.render(), True)
        return out

    def step(self, actions):
        out = self._env.step(actions)
        self._frame(self._env.render(), False)
        return out


class _Film:
    """The video of a parallel env's episodes, one mp4 each: its env (``ParallelSlots``'s one) renders from inside
    ``slots`` (``_Filmed``), since they reset it in the step that ends its episode, before the loop could render
    the episode's last frame. The frame after a reset opens the next episode's video."""

    def __init__(self, slots: pettingzoo.ParallelSlots, directory: Path) -> None:
        env = slots.envs[0]
        self._writer = _VideoWriter(directory, float(getattr(env, "metadata", {}).get("render_fps") or 30))
        self._start: np.ndarray | None = None  # the frame after the newest reset
        slots.envs[0] = _Filmed(env, self._frame)

    def _frame(self, image: np.ndarray, reset: bool) -> None:
        if reset:
            self._start = image
        else:
            self._writer.add(image)

    def open(self, index: int) -> None:
        self._writer.open(index)
        self._writer.add(self._start)

    def close(self) -> tuple[str, int]:
        return self._writer.close()


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


