"""Environments: building Gymnasium vector envs and describing their spaces.

Imported by the actor, so it must not import torch.

Env ids
-------
One string names an environment everywhere (``env.id`` in the config, ``lockstep actor --env``, the hello
check). Schemes come first, then the other forms:

- ``atari:GAME``: an ALE game with the DQN preprocessing (``lockstep.envs.atari``), e.g.
  ``atari:PongNoFrameskip-v4``; observation Box(0, 255, (4, 84, 84), uint8), Discrete actions. Needs
  ``pip install -e '.[atari]'``.
- ``minatar:GAME``: a MinAtar game (``lockstep.envs.minatar``; asterix, breakout, freeway, seaquest,
  space_invaders), e.g. ``minatar:breakout``; observation Box(0, 1, (C, 10, 10), uint8), Discrete actions,
  episodes cut at 10,000 steps. Needs ``pip install -e '.[minatar]'``.
- ``minigrid:ENV``: a registered MiniGrid env (``lockstep.envs.minigrid``), e.g.
  ``minigrid:MiniGrid-DoorKey-5x5-v0``; observation a Dict of the ``image`` as grid codes
  (MultiDiscrete [7, 7, 3], uint8), the ``direction`` and the ``mission`` Text (leave it out with
  ``env.obs_keys``), Discrete actions. Needs ``pip install -e '.[minigrid]'``.
- ``pettingzoo:MODULE``, MODULE a turn-based PettingZoo game (no ``parallel_env``), e.g.
  ``pettingzoo:pettingzoo.classic.connect_four_v3``: self-play (``lockstep.envs.selfplay``), each slot one
  game seen from the learning player, the opponents' moves played by the learner's snapshots. Needs
  ``pip install -e '.[pettingzoo]'``.
- ``vizdoom:SCENARIO``: a ViZDoom scenario (``lockstep.envs.vizdoom``), e.g. ``vizdoom:basic``, or a scenario
  file of your own, ``vizdoom:/path/to/my.cfg``; observation Box(0, 255, (3, 72, 128), uint8) RGB (a Dict of
  ``screen`` and the game variables ``vars`` for the health gathering scenarios), frame skip 4, Discrete actions
  (no-op or one button); settings through ``env.kwargs``. Needs ``pip install -e '.[vizdoom]'``.
- ``envpool:TASK``: an EnvPool Atari task as the actor's vector env, e.g. ``envpool:Breakout-v5``: the
  same spaces and preprocessing as ``atari:BreakoutNoFrameskip-v4``, stepped in C++ threads
  (``lockstep.envs.envpool``). Needs ``pip install -e '.[envpool]'``.
- ``pettingzoo:MODULE``: a PettingZoo parallel env (``lockstep.envs.pettingzoo``), e.g.
  ``pettingzoo:mpe2.simple_spread_v3``: every agent of every env is one slot, all agents share the policy;
  observation a Dict of the agent's own and ``agent_active``. Needs ``pip install -e '.[pettingzoo]'``.
- ``masked:ENV``: a control env with its velocities hidden (``lockstep.envs.masked``), e.g.
  ``masked:CartPole-v1``: observation Box((2,), float32), cart position and pole angle.
- a registered Gymnasium id, e.g. ``CartPole-v1``, or ``module:EnvId``: ``module`` is imported first, which
  registers ``EnvId`` (how packages make their ids known), e.g. ``ale_py:ALE/Pong-v5``; a scheme's name wins
  over a module's of the same name.
- ``package.module:callable``: a function that returns a ``gymnasium.Env``; anything else (an old ``gym.Env``) is
  refused with what to do (``GYM_ERA``).

Images
------
The observations of Gymnasium ids, factories and PettingZoo parallel envs pass through ``lockstep.envs.images``:
channels-last image leaves (H, W, C) are transposed to [C, H, W] on the actor, as ``env.image_layout`` decides.
The frames of ``atari:``, ``minatar:``, ``vizdoom:`` and ``envpool:`` are [C, H, W] already; a turn-based game's
observations (``selfplay``) are taken as they are.

Episode statistics
------------------
Every env records its own episodes (Gymnasium's ``RecordEpisodeStatistics``, ``make_env``): outermost for
most envs, and below episodic life and reward clipping for Atari, so that a reported return is the raw
score of a whole game. ``make_vector_env`` brings them to the top of the vector env's infos
(``FinishedEpisodes``), where the actor reads them.

``make_env(env_id, training=False)`` is the env to evaluate a policy on: for ``atari:`` ids one episode per
game and unclipped rewards; every other id is the same env as for training.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from lockstep.envs import envpool as envpool_backend
from lockstep.envs import images, pettingzoo, selfplay
from lockstep.envs.atari import make_atari
from lockstep.envs.masked import make_masked
from lockstep.envs.minatar import make_minatar
from lockstep.envs.minigrid import make_minigrid

# re-exported: the spaces' descriptions are part of what an env is to the rest of lockstep
from lockstep.envs.spaces import SpaceSpec as SpaceSpec
from lockstep.envs.spaces import action_entries as action_entries
from lockstep.envs.spaces import action_spec as action_spec
from lockstep.envs.spaces import env_actions as env_actions
from lockstep.envs.spaces import from_leaves as from_leaves
from lockstep.envs.spaces import leaf_choices as leaf_choices
from lockstep.envs.spaces import policy_spaces as policy_spaces
from lockstep.envs.spaces import stack_records as stack_records
from lockstep.envs.spaces import to_records as to_records
from lockstep.envs.spaces import with_action_mask as with_action_mask
from lockstep.envs.vector import EnvProcessDied as EnvProcessDied
from lockstep.envs.vector import SameStepAsyncVectorEnv, SameStepVectorEnv, env_process
from lockstep.envs.vizdoom import make_vizdoom


@dataclass(frozen=True)
class EnvSpec:
    env_id: str
    observation: SpaceSpec
    action: SpaceSpec
    agents: int = 1  # slots per env: a PettingZoo parallel env's agents, each env's in consecutive slots
    # several policies: each agent's policy, in possible_agents order (slot n of an actor is agent n mod agents)
    policy_of: tuple[str, ...] = ()
    agent_names: tuple[str, ...] = ()  # a PettingZoo parallel env's possible_agents

    @property
    def policies(self) -> tuple[str, ...]:
        """The policies' names, in the order their first agents come (empty: one policy for every slot)."""
        return tuple(dict.fromkeys(self.policy_of))

    @property
    def agent_policies(self) -> dict[str, str]:
        """Each agent's policy, agent name -> policy name (empty: one policy for every slot), as an actor's hello
        carries it (``pettingzoo.agent_policies``)."""
        return dict(zip(self.agent_names, self.policy_of))


VECTOR_MODES = ("sync", "async")  # actors.vector: the actor's envs stepped in its process, or each in its own
# the schemes whose vector envs are lockstep's own, which actors.vector async cannot put in processes
ASYNC_REFUSED = {"envpool": "is EnvPool's vector env, which steps its envs in C++ threads already",
                 "pettingzoo": "is a PettingZoo env, whose vector env is lockstep's own"}

# what to do with an env that is not a gymnasium.Env (module docstring): the end of the refusal's one line
GYM_ERA = ("lockstep steps Gymnasium envs. Convert an env of the old gym API with shimmy's wrappers (pip install "
           "'shimmy[gym-v26]', return shimmy.GymV26CompatibilityV0(env=env) for gym 0.22 to 0.26; "
           "'shimmy[gym-v21]' and shimmy.GymV21CompatibilityV0(env=env) for gym 0.21 and older), or in a "
           "gymnasium.Env of your own whose reset(seed=None, options=None) returns (obs, info), whose step(action) "
           "returns (obs, reward, terminated, truncated, info), and whose observation_space and action_space are "
           "gymnasium.spaces")

# scheme -> make(name, training=True, **kwargs): the env of the id "scheme:name"
SCHEMES: dict[str, Callable[..., gym.Env]] = {
    "atari": make_atari, "minatar": make_minatar, "minigrid": make_minigrid, "masked": make_masked,
    "vizdoom": make_vizdoom,
    # one env of an EnvPool task is its Gymnasium twin (same spaces, same preprocessing); vector envs are EnvPool's
    "envpool": lambda task, **kwargs: make_atari(envpool_backend.gymnasium_id(task).partition(":")[2], **kwargs),
    "pettingzoo": lambda name, training=True, **kwargs: (
        selfplay.make_game(name, **kwargs) if selfplay.is_turn_based(name)  # the learning player's view of a game
        else pettingzoo.single_env(name)),  # refused: a parallel env's agents are slots of a vector env
}


def resolve_env(env_id: str) -> Callable[..., gym.Env]:
    """Return a factory for ``env_id`` (module docstring): ``scheme:name``, a registered Gymnasium id,
    ``module:EnvId`` or ``package.module:callable``. A scheme's factory takes ``training`` and checks the name when
    called; what a ``package.module:callable`` returns is checked by ``make_env`` and ``env_spec``."""
    module_name, _, attr = env_id.partition(":")
    if module_name in SCHEMES:
        return functools.partial(SCHEMES[module_name], attr)
    if attr.isidentifier():
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise ValueError(f"cannot import module {module_name!r} for env entry point {env_id!r}: {err}") from err
        try:
            factory = getattr(module, attr)
        except AttributeError as err:
            raise ValueError(f"module {module_name!r} has no callable {attr!r} (env entry point {env_id!r})") from err
        return factory
    if ":" in env_id:  # module:EnvId: importing the module registers EnvId, which gym.make then looks up
        try:
            importlib.import_module(module_name)
        except ImportError as err:
            raise ValueError(f"cannot import module {module_name!r} for env {env_id!r} (module:EnvId imports the "
                             f"module, which registers EnvId): {err}") from err
    elif env_id not in gym.registry:
        raise ValueError(
            f"unknown environment {env_id!r}: not a registered Gymnasium id; a package's id is module:EnvId (the "
            "module registers EnvId when imported, e.g. ale_py:ALE/Pong-v5), a function's package.module:callable"
        )
    return lambda **kwargs: gym.make(env_id, **kwargs)


def _gymnasium_env(env: Any, env_id: str) -> gym.Env:
    """``env``, which ``env_id``'s factory made, if it is a ``gymnasium.Env``; else a ValueError naming what it is
    and how to convert it (``GYM_ERA``)."""
    if isinstance(env, gym.Env):
        return env
    kind = type(env)
    raise ValueError(f"{env_id} made a {kind.__qualname__} (module {kind.__module__}), which is not a gymnasium.Env: "
                     f"{GYM_ERA}")


def _own_env(env_id: str, kwargs: dict[str, Any]) -> gym.Env:
    """One env of a Gymnasium id or a factory (no scheme), its channels-last images transposed as
    ``env.image_layout`` (among ``kwargs``) says (``images``)."""
    layout = kwargs.get(images.IMAGE_LAYOUT_KWARG, "auto")
    own = {key: value for key, value in kwargs.items() if key != images.IMAGE_LAYOUT_KWARG}
    env = _gymnasium_env(resolve_env(env_id)(**own), env_id)
    try:
        return images.channels_first(env, layout)
    except BaseException:
        env.close()
        raise


def _check_image_layout(env_id: str, kwargs: dict[str, Any]) -> None:
    """``env.image_layout`` other than auto is for Gymnasium ids, factories and PettingZoo parallel envs: a
    ValueError for the other schemes' ids."""
    scheme, _, name = env_id.partition(":")
    layout = kwargs.get(images.IMAGE_LAYOUT_KWARG, "auto")
    parallel = scheme == "pettingzoo" and not selfplay.is_turn_based(name)
    if scheme in SCHEMES and not parallel and layout != "auto":
        raise ValueError(f"env.image_layout {layout} is for the images of Gymnasium ids, package.module:callable "
                         f"factories and PettingZoo parallel envs; {env_id}'s observations are taken as they are: "
                         "leave env.image_layout at auto")


def reward_threshold(env_id: str) -> float | None:
    """The return at which ``env_id`` counts as solved: the ``reward_threshold`` of its Gymnasium
    registration (CartPole-v1: 475.0), or None for an id without one, an unregistered id and a
    ``package.module:callable`` entry point. ``masked:ENV`` keeps ENV's; atari, minatar, minigrid and vizdoom ids
    have none."""
    module_name, _, name = env_id.partition(":")
    if module_name == "masked":
        return reward_threshold(name)
    if module_name in SCHEMES:
        return None
    if name and not name.isidentifier():  # "module:EnvId": gym.make imports the module, which registers EnvId
        try:
            importlib.import_module(module_name)
        except ImportError:
            return None
        env_id = name
    spec = gym.registry.get(env_id)
    if spec is None or spec.reward_threshold is None:
        return None
    return float(spec.reward_threshold)


def make_env(env_id: str, training: bool = True, **kwargs) -> gym.Env:
    """One env of ``env_id`` that records its episodes: ``info["episode"]`` (``r`` return, ``l`` length, ``t``
    seconds) on the last step of each. ``training=False``: the env to evaluate a policy on (for ``atari:``
    ids no episodic life and no reward clipping; the same env for every other id). ``kwargs`` go to the
    factory (``gym.make`` for a registered id), e.g. ``render_mode="rgb_array"``, but for ``env.image_layout``
    (``images.IMAGE_LAYOUT_KWARG``), which decides which images are transposed. A factory that returns anything but a
    ``gymnasium.Env`` raises a ValueError that says how to convert it."""
    scheme, _, name = env_id.partition(":")
    _check_image_layout(env_id, kwargs)
    env = SCHEMES[scheme](name, training=training, **kwargs) if scheme in SCHEMES else _own_env(env_id, kwargs)
    return env if _records_episodes(env) else RecordEpisodes(env)


class RecordEpisodes(gym.wrappers.RecordEpisodeStatistics):
    """Gymnasium's episode recorder, through which the public attributes of the env it wraps stay readable,
    so that a vector env's ``envs[i]`` still shows those of the env its factory made."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "env":  # also while unpickling, before ``env`` is set
            raise AttributeError(name)
        return getattr(self.env, name)


def wrapper_types(env: gym.Env) -> list[type]:
    """The classes of ``env``'s wrappers, outermost first."""
    found = []
    while isinstance(env, gym.Wrapper):
        found.append(type(env))
        env = env.env
    return found


def _records_episodes(env: gym.Env) -> bool:
    """Whether a wrapper of ``env`` already records episodes (a second one would fail on its first episode)."""
    return any(issubclass(t, gym.wrappers.RecordEpisodeStatistics) for t in wrapper_types(env))


class FinishedEpisodes(gym.vector.VectorWrapper):
    """A vector env that reports the episodes that ended in each step in ``infos["episode"]`` (``r``, ``l``,
    ``t``: arrays over the envs) and ``infos["_episode"]`` (which envs ended one), and counts them in
    ``episode_count``.

    Each env records its own (``make_env``). With same-step autoreset the vector env files the info of an
    episode's last step under ``infos["final_info"]``, since the reset's info takes its place; this wrapper
    lifts the statistics from there.
    """

    def __init__(self, env: gym.vector.VectorEnv) -> None:
        super().__init__(env)
        self.episode_count = 0

    def step(self, actions):
        obs, reward, terminated, truncated, infos = self.env.step(actions)
        final = infos.get("final_info", {})
        if "episode" in final:
            infos["episode"], infos["_episode"] = final["episode"], final["_episode"]
            self.episode_count += int(final["_episode"].sum())
        return obs, reward, terminated, truncated, infos


def make_vector_env(env_id: str, num_envs: int, kwargs: dict[str, Any] | None = None,
                    vector: str = "sync") -> gym.vector.VectorEnv:
    """A vector env of ``make_env(env_id)`` that resets finished episodes in the same step: stepped one env after
    the other in this process (``vector="sync"``) or each env in a process of its own (``"async"``,
    ``actors.vector``; Gymnasium ids only).

    Same-step autoreset means every observation sent to the learner is one to act
    on, and a truncated episode's last observation arrives in ``infos["final_obs"]``.
    Finished episodes are reported in ``infos["episode"]`` (``FinishedEpisodes``). ``kwargs`` (``env.kwargs``)
    go to the env's constructor (``env.agent_id`` among them: a PettingZoo parallel env's).
    """
    kwargs = kwargs or {}
    if num_envs < 1:
        raise ValueError(f"num_envs must be at least 1, got {num_envs}")
    if vector not in VECTOR_MODES:
        raise ValueError(f"actors.vector must be one of {', '.join(VECTOR_MODES)}, got {vector!r}")
    scheme, _, name = env_id.partition(":")
    _check_agent_id(env_id, kwargs)
    _check_image_layout(env_id, kwargs)
    if vector == "async":
        if scheme in ASYNC_REFUSED:
            raise ValueError(f"actors.vector async steps Gymnasium envs in processes of their own; {env_id} "
                             f"{ASYNC_REFUSED[scheme]}: leave actors.vector at sync")
        make = functools.partial(env_process, os.getpid(), functools.partial(make_env, env_id, **kwargs))
        return FinishedEpisodes(SameStepAsyncVectorEnv([make] * num_envs, env_id))
    if scheme == "envpool":  # EnvPool steps the envs in C++ threads, with the same-step semantics (wrappers/envpool.py)
        if kwargs:
            raise ValueError(f"{env_id}: env.kwargs are not passed to EnvPool; leave env.kwargs empty")
        return envpool_backend.EnvpoolVector(name, num_envs)
    if scheme == "pettingzoo" and selfplay.is_turn_based(name):  # the opponents move between learning steps
        return selfplay.SelfPlayVectorEnv(name, num_envs, kwargs=kwargs)
    if scheme == "pettingzoo":  # num_envs envs, one slot per agent: num_envs x agents slots
        return pettingzoo.make_vector(name, num_envs, kwargs)
    return FinishedEpisodes(SameStepVectorEnv([lambda: make_env(env_id, **kwargs) for _ in range(num_envs)]))


def env_spec(env_id: str, obs_keys: tuple[str, ...] | list[str] = (), action_mask_key: str = "",
             kwargs: dict[str, Any] | None = None) -> EnvSpec:
    """The spaces of one environment of ``env_id``; ``obs_keys`` (``env.obs_keys``) keeps those keys of a
    Dict observation, whose leaf ``action_mask_key`` (``env.action_mask_key``), if it has one, masks the
    actions (``spaces.with_action_mask``); ``kwargs`` (``env.kwargs``) go to the env's constructor. The spaces are
    those the actors send: channels-last images already [C, H, W] (``images``)."""
    scheme, _, name = env_id.partition(":")
    kwargs = kwargs or {}
    _check_agent_id(env_id, kwargs)
    _check_image_layout(env_id, kwargs)
    parallel = scheme == "pettingzoo" and not selfplay.is_turn_based(name)
    if parallel:
        env: Any = pettingzoo.agent_view(name, kwargs)
    else:
        env = resolve_env(env_id)(**kwargs) if scheme in SCHEMES else _own_env(env_id, kwargs)
    try:
        action = action_spec(env.action_space)
        observation = SpaceSpec.from_space(env.observation_space, obs_keys)
        return EnvSpec(env_id, with_action_mask(observation, action, action_mask_key), action,
                       agents=env.agents if parallel else 1, policy_of=env.policy_of if parallel else (),
                       agent_names=env.agent_names if parallel else ())
    finally:
        env.close()


def _check_agent_id(env_id: str, kwargs: dict[str, Any]) -> None:
    """``env.agent_id`` and ``model.critic_input: global`` are for PettingZoo parallel envs only: a ValueError for
    any other id that has them."""
    scheme, _, name = env_id.partition(":")
    if scheme == "pettingzoo" and not selfplay.is_turn_based(name):
        return
    if kwargs.get(pettingzoo.AGENT_ID_KWARG):
        raise ValueError(f"env.agent_id adds an agent index to a PettingZoo parallel env's observations; {env_id} "
                         "is none")
    if kwargs.get(pettingzoo.GLOBAL_STATE_KWARG):
        raise ValueError(f"model.critic_input global gives the critic a PettingZoo parallel env's global state; "
                         f"{env_id} is none: use model.critic_input own")


def env_seeds(run_seed: int, actor_id: int, num_envs: int) -> list[int]:
    """Distinct, reproducible reset seeds for the envs of one actor."""
    seq = np.random.SeedSequence([run_seed, actor_id])
    return [int(s) for s in seq.generate_state(num_envs, dtype=np.uint32)]
