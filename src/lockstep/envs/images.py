"""The channel order of image observations: lockstep's images are [C, H, W]; an env's channels-last ones
(H, W, C), as most image envs and renderers give them, are transposed on the actor.

Which leaves are images in channels-last order is decided once per env from its observation space
(``env.image_layout``):

- ``auto``: a uint8 Box of 3 dimensions (the space itself, or a leaf of a Dict or Tuple) whose last axis is 1, 3
  or 4 and smaller than both others, which are at least ``MIN_IMAGE_SIDE`` (a (64, 64, 3) RGB frame) is
  channels-last; any other shape ((4, 84, 84), (3, 3, 3), (64, 64, 5)) stays as it is;
- ``channels_last``: every uint8 Box of 3 dimensions is channels-last;
- ``channels_first``: nothing is transposed.

``ChannelsFirst`` transposes those leaves in every observation the env gives (``envs.make_env``, which the actor's
vector env, ``lockstep eval`` and evaluation during training all build) and in its observation space
(``envs.env_spec``), so that the hello, the wire, the learner and the audit only ever see [C, H, W].
``ChannelsFirstParallel`` does the same for each agent of a PettingZoo parallel env (``envs.pettingzoo``), below
the slots. The frames of ``atari:``, ``minatar:`` and ``envpool:`` are [C, H, W] already, and a turn-based game's
observations (``envs.selfplay``) are taken as they are: neither passes through them.

Imported by the actor: no torch.
"""

from __future__ import annotations

import logging
from typing import Any

import gymnasium as gym
import numpy as np

from lockstep.envs.spaces import MIN_IMAGE_SIDE

log = logging.getLogger("lockstep.envs")

IMAGE_LAYOUTS = ("auto", "channels_first", "channels_last")
IMAGE_LAYOUT_KWARG = "_lockstep_image_layout"  # env.image_layout among the vector env's kwargs (``config``)
CHANNELS = (1, 3, 4)  # grey, RGB, RGBA
_told: set[str] = set()  # the decisions this process has logged: one line each, however many envs it makes

Route = tuple[str | int, ...]


def channels_last(space: gym.spaces.Box, layout: str) -> bool:
    """Whether the Box ``space`` holds channels-last images under ``layout`` (module docstring)."""
    if layout not in IMAGE_LAYOUTS:
        raise ValueError(f"env.image_layout must be one of {', '.join(IMAGE_LAYOUTS)}, got {layout!r}")
    if layout == "channels_first" or space.dtype != np.uint8 or len(space.shape) != 3:
        return False
    if layout == "channels_last":
        return True
    height, width, channels = space.shape
    return channels in CHANNELS and channels < min(height, width) and min(height, width) >= MIN_IMAGE_SIDE


def channels_last_leaves(space: gym.Space, layout: str) -> dict[Route, tuple[str, tuple[int, ...]]]:
    """The leaves of ``space`` that are channels-last images under ``layout``: route (Dict keys, Tuple indices)
    -> (path as ``spaces`` names it, shape), depth first; and the decision on every uint8 Box of 3 dimensions
    logged once per process."""
    found: dict[Route, tuple[str, tuple[int, ...]]] = {}
    for route, path, leaf in _boxes(space, (), ""):
        if leaf.dtype != np.uint8 or len(leaf.shape) != 3:
            continue
        name = f"observation leaf {path!r}" if path else "observation"
        if channels_last(leaf, layout):
            found[route] = (path, leaf.shape)
            height, width, channels = leaf.shape
            _tell(f"{name} {leaf.shape} uint8 is channels-last (H, W, C): the actors send it as "
                  f"[{channels}, {height}, {width}] (env.image_layout {layout}; channels_first keeps it as it is)")
        else:
            _tell(f"{name} {leaf.shape} uint8 is taken as [C, H, W] as it is (env.image_layout {layout}; "
                  "channels_last transposes an (H, W, C) image)")
    return found


def _tell(message: str) -> None:
    if message not in _told:
        _told.add(message)
        log.info(message)


def _boxes(space: gym.Space, route: Route, path: str):
    """(route, path, Box) of every Box leaf below ``space``."""
    if isinstance(space, gym.spaces.Dict):
        for key, sub in space.spaces.items():
            yield from _boxes(sub, (*route, key), f"{path}.{key}" if path else str(key))
    elif isinstance(space, gym.spaces.Tuple):
        for i, sub in enumerate(space.spaces):
            yield from _boxes(sub, (*route, i), f"{path}[{i}]")
    elif isinstance(space, gym.spaces.Box):
        yield route, path, space


class ChannelsFirst(gym.ObservationWrapper):
    """An env whose channels-last image leaves (``routes``, from ``channels_last_leaves``) are [C, H, W], in its
    observation space and in every observation (a contiguous copy); its other leaves are the env's own. The public
    attributes of the env it wraps stay readable through it, as through ``envs.RecordEpisodes``."""

    def __init__(self, env: gym.Env, routes: set[Route] | frozenset[Route]) -> None:
        super().__init__(env)
        self.routes = frozenset(routes)
        self.observation_space = _space(env.observation_space, self.routes, ())

    def observation(self, observation: Any) -> Any:
        return _value(observation, self.routes, ())

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "env":  # also while unpickling, before ``env`` is set
            raise AttributeError(name)
        return getattr(self.env, name)


class ChannelsFirstParallel:
    """A PettingZoo parallel env whose agents' channels-last image leaves are [C, H, W] (``channels_last_leaves`` of
    each agent's observation space), in ``observation_space(agent)`` and in the observations of ``reset`` and
    ``step``; everything else is the env's own."""

    def __init__(self, env: Any, layout: str) -> None:
        self.env = env
        self.routes = {agent: frozenset(channels_last_leaves(env.observation_space(agent), layout))
                       for agent in env.possible_agents}
        self._spaces = {agent: _space(env.observation_space(agent), routes, ())
                        for agent, routes in self.routes.items()}

    def observation_space(self, agent: str) -> gym.Space:
        return self._spaces[agent]

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        observations, infos = self.env.reset(seed=seed, options=options)
        return self._own(observations), infos

    def step(self, actions: dict) -> tuple:
        observations, *rest = self.env.step(actions)
        return (self._own(observations), *rest)

    def _own(self, observations: dict[str, Any]) -> dict[str, Any]:
        return {agent: _value(obs, self.routes[agent], ()) for agent, obs in observations.items()}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "env":  # also while unpickling, before ``env`` is set
            raise AttributeError(name)
        return getattr(self.env, name)


def channels_first_parallel(env: Any, layout: str) -> Any:
    """The PettingZoo parallel env ``env`` itself, or ``ChannelsFirstParallel(env)`` where ``layout`` finds
    channels-last images in an agent's observations."""
    wrapped = ChannelsFirstParallel(env, layout)
    return wrapped if any(wrapped.routes.values()) else env


def channels_first(env: gym.Env, layout: str) -> gym.Env:
    """``env`` itself, or ``ChannelsFirst(env)`` where ``layout`` finds channels-last images in its observations."""
    routes = channels_last_leaves(env.observation_space, layout)
    return ChannelsFirst(env, set(routes)) if routes else env


def _space(space: gym.Space, routes: frozenset[Route], route: Route) -> gym.Space:
    if route in routes:
        return gym.spaces.Box(np.transpose(space.low, (2, 0, 1)), np.transpose(space.high, (2, 0, 1)),
                              dtype=space.dtype)
    if not any(r[:len(route)] == route for r in routes):
        return space
    if isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict({key: _space(sub, routes, (*route, key)) for key, sub in space.spaces.items()})
    return gym.spaces.Tuple(tuple(_space(sub, routes, (*route, i)) for i, sub in enumerate(space.spaces)))


def _value(value: Any, routes: frozenset[Route], route: Route) -> Any:
    if route in routes:
        return np.ascontiguousarray(np.transpose(value, (2, 0, 1)))
    if not any(r[:len(route)] == route for r in routes):
        return value
    if isinstance(value, dict):
        return {key: _value(sub, routes, (*route, key)) for key, sub in value.items()}
    return tuple(_value(sub, routes, (*route, i)) for i, sub in enumerate(value))
