"""PettingZoo parallel envs as env slots: every agent of every env is one slot of the actor's vector env.

``pettingzoo:MODULE`` names a module with a ``parallel_env()`` (e.g. ``pettingzoo:mpe2.simple_spread_v3``).
The agents share the policy (parameter sharing): each slot acts on its own agent's observation, and the
learner sees one more vector env of ``envs x agents`` slots, in env order, each env's agents in
``possible_agents`` order.

The observation of a slot is a Dict: the agent's own observation (under ``observation``, or its own keys if it
is a Dict, e.g. ``action_mask``) and ``agent_active`` (MultiBinary(1)); with ``env.agent_id``, also
``agent_id``, the one-hot of the agent's index in ``possible_agents`` (Box [agents] float32), so that the
policy the agents share can act differently for each (SuperSuit's ``agent_indicator`` does the same). An agent's
channels-last images (H, W, C) are [C, H, W] in its slot, as for one agent's env (``envs.images``).

With ``model.critic_input: global`` (MAPPO's centralized critic), also ``global_state``: the env's own
``state()`` where the env declares a ``state_space`` (mpe2's envs do), else every agent's observation flattened
and concatenated in ``possible_agents`` order, zeros for an agent that is not in the step's observations
(``global_state_space``, ``global_state``); a Box of float32, the same for every slot of an env. It comes with
``agent_id``, which the critic reads beside it. Only the critic reads it (``models.feedforward.LeafActorCritic``):
acting needs the agent's own observation alone. A truncated agent's final observation carries the state after
its last step, which its value is bootstrapped from.

Agents that leave early. PettingZoo drops an agent from ``env.agents`` when it terminates or truncates
before the others. Its slot's step at leaving carries its flag, its last reward and, if it was truncated,
its last observation; from then until its env's episode ends, the slot is inactive: ``agent_active`` 0, a
placeholder observation (zeros in every leaf, however nested, ``global_state`` too; ones in the action mask, the leaf
``env.action_mask_key`` names, so that the slot still allows an action), reward 0, its action ignored, and
each of its steps flagged terminated, so that no return, advantage trace or recurrent state runs through
them. The learner never trains on a step whose ``agent_active`` is 0 (``learner.rollout.Batch.valid``). When
every agent has left, the env resets in the same step and every slot acts again.

Imported by the actor: no torch.
"""

from __future__ import annotations

import fnmatch
import importlib
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from lockstep.envs.images import IMAGE_LAYOUT_KWARG, channels_first_parallel
from lockstep.envs.spaces import ACTIVE_LEAF, AGENT_ID_LEAF, GLOBAL_LEAF, slot_action

OBSERVATION_LEAF = "observation"  # where an agent's observation goes when it is not a Dict itself
AGENT_ID_KWARG = "_lockstep_agent_id"  # env.agent_id among the vector env's kwargs (``config.EnvConfig.vector_kwargs``)
MASK_KEY_KWARG = "_lockstep_action_mask_key"  # env.action_mask_key, likewise
GLOBAL_STATE_KWARG = "_lockstep_global_state"  # model.critic_input global (``config.Config.vector_kwargs``)
POLICIES_KWARG = "_lockstep_policies"  # several policies: {policy: [agent patterns]} (``config.Config.vector_kwargs``)
DEFAULT_MASK_KEY = "action_mask"


def parallel_factory(module_name: str, kwargs: dict[str, Any] | None = None,
                     image_layout: str = "auto") -> Callable[[], Any]:
    """A factory of MODULE's parallel env, its agents' channels-last images transposed as ``image_layout``
    (``env.image_layout``) says (``images``); a ValueError naming the problem for anything else."""
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"pettingzoo:{module_name}: cannot import {module_name!r} ({err}); PettingZoo envs need "
                         "pip install -e '.[pettingzoo]'") from err
    if not callable(getattr(module, "parallel_env", None)):
        raise ValueError(f"pettingzoo:{module_name}: the module has no parallel_env(); lockstep runs PettingZoo's "
                         "parallel API (a turn-based AEC game has only env())")
    return lambda: channels_first_parallel(module.parallel_env(**(kwargs or {})), image_layout)


def _same_spaces(env: Any, agents: list[str], policy: str = "") -> tuple[gym.Space, gym.Space]:
    """The one observation and action space ``agents`` have; a ValueError naming two that differ."""
    first = agents[0]
    obs, act = env.observation_space(first), env.action_space(first)
    for agent in agents[1:]:
        if env.observation_space(agent) != obs or env.action_space(agent) != act:
            share = (f"the agents of policy {policy!r} share it, so they need the same spaces: map them to "
                     "policies of their own in policies" if policy else
                     "the agents share one policy, so lockstep needs the same spaces for all of them: map the "
                     "agents of each kind to a policy of their own (the policies section; lockstep actor "
                     "--policies for an actor started by hand), or pad them in a wrapper of the env")
            raise ValueError(
                f"agents {first!r} and {agent!r} have different spaces (observation {obs} vs "
                f"{env.observation_space(agent)}, action {act} vs {env.action_space(agent)}); {share}")
    return obs, act


def assign_policies(agents: list[str], patterns: dict[str, list[str]]) -> tuple[str, ...]:
    """Each agent's policy: the first policy, in the order given, one of whose patterns (``fnmatch``: ``*``,
    ``?``, ``[seq]``) matches the agent's name. A ValueError naming an agent no policy takes, or a policy that
    takes no agent (a pattern with a typo)."""
    assigned = []
    for agent in agents:
        name = next((policy for policy, globs in patterns.items()
                     if any(fnmatch.fnmatchcase(agent, glob) for glob in globs)), None)
        if name is None:
            raise ValueError(f"policies: agent {agent!r} matches no policy's agents ({patterns}); the env's "
                             f"agents are {agents}: add a pattern that matches it to a policy's agents")
        assigned.append(name)
    idle = [policy for policy in patterns if policy not in assigned]
    if idle:
        raise ValueError(f"policies {idle} act for no agent: no agent of {agents} matches their patterns first "
                         f"({ {p: patterns[p] for p in idle} })")
    return tuple(assigned)


def _own_leaves(space: gym.Space) -> dict[str, gym.Space]:
    """An agent's observation as the leaves of its slot: a Dict's own keys, or the space under ``observation``."""
    return dict(space.spaces) if isinstance(space, gym.spaces.Dict) else {OBSERVATION_LEAF: space}


def _policy_spaces(env: Any, agents: list[str], policy_of: tuple[str, ...]) -> tuple[dict, gym.Space, bool]:
    """Several policies: the slot's observation leaves (each policy's own observation under its name), the
    action space (the one every policy has, or a Dict of each policy's under its name) and whether the latter."""
    leaves, actions = {}, {}
    for policy in dict.fromkeys(policy_of):
        obs, act = _same_spaces(env, [a for a, p in zip(agents, policy_of) if p == policy], policy)
        leaves[policy] = gym.spaces.Dict(_own_leaves(obs))
        actions[policy] = act
    spaces = list(actions.values())
    if all(act == spaces[0] for act in spaces):
        return leaves, spaces[0], False
    nested = [p for p, act in actions.items() if isinstance(act, (gym.spaces.Dict, gym.spaces.Tuple))]
    if nested:
        raise ValueError(f"the policies' action spaces differ ({actions}); lockstep carries them side by side, "
                         f"which it can for Box, Discrete, MultiDiscrete and MultiBinary actions, not for the "
                         f"Dict or Tuple actions of {nested}")
    return leaves, gym.spaces.Dict(actions), True


def _declares_state(env: Any) -> bool:
    """Whether ``env`` has a global ``state()``: PettingZoo's parallel API declares it by a ``state_space``."""
    return isinstance(getattr(env, "state_space", None), gym.spaces.Box)


def global_state_space(env: Any) -> gym.spaces.Box:
    """The space of ``env``'s ``global_state`` (module docstring), a flat Box of float32: its ``state_space``
    flattened, or its agents' observation spaces flattened (``gym.spaces.flatten_space``) and concatenated."""
    spaces = ([env.state_space] if _declares_state(env)
              else [gym.spaces.flatten_space(env.observation_space(agent)) for agent in env.possible_agents])
    low = np.concatenate([np.asarray(space.low, np.float32).reshape(-1) for space in spaces])
    high = np.concatenate([np.asarray(space.high, np.float32).reshape(-1) for space in spaces])
    return gym.spaces.Box(low, high, dtype=np.float32)


def global_state(env: Any, observations: dict[str, Any], space: gym.spaces.Box) -> np.ndarray:
    """``env``'s global state [state] float32 after a reset or a step that returned ``observations``: its
    ``state()``, or the agents' observations flattened side by side, zeros for an agent without one."""
    if _declares_state(env):
        state = np.asarray(env.state(), np.float32).reshape(-1)
        if state.shape != space.shape:
            raise ValueError(f"the env's state() has {state.size} values, its state_space {space.shape[0]}: fix "
                             "the env's state() or state_space")
        return state
    parts = []
    for agent in env.possible_agents:
        own = env.observation_space(agent)
        parts.append(gym.spaces.flatten(own, observations[agent]) if agent in observations
                     else np.zeros(gym.spaces.flatdim(own), np.float32))
    return np.concatenate(parts).astype(np.float32, copy=False)


class ParallelSlots(gym.vector.VectorEnv):
    """``num_envs`` PettingZoo parallel envs, one slot per agent (module docstring), with same-step reset.

    ``step`` returns what the actor's ``EnvLoop`` reads of a Gymnasium vector env: observations as a dict of
    [k, *leaf] arrays, rewards and flags [k], ``infos["final_obs"]`` at truncated slots, and each finished
    agent episode in ``infos["episode"]`` / ``infos["_episode"]``.
    """

    def __init__(self, make: Callable[[], Any], num_envs: int, agent_id: bool = False,
                 mask_key: str = DEFAULT_MASK_KEY, policies: dict[str, list[str]] | None = None,
                 global_state: bool = False) -> None:
        self.envs = [make() for _ in range(num_envs)]
        first = self.envs[0]
        self.agents = list(first.possible_agents)
        if not self.agents:
            raise ValueError("the PettingZoo env has no agents")
        # several policies (module docstring): each agent's, and its observation's leaves under the policy's name
        self.policy_of: tuple[str, ...] = assign_policies(self.agents, policies) if policies else ()
        self._action_by_policy = False
        if self.policy_of:
            leaves, self.single_action_space, self._action_by_policy = _policy_spaces(first, self.agents,
                                                                                      self.policy_of)
            obs_space = gym.spaces.Dict(leaves)
        else:
            obs_space, self.single_action_space = _same_spaces(first, self.agents)
            leaves = _own_leaves(obs_space)
        self.num_envs = num_envs * len(self.agents)
        added = {ACTIVE_LEAF: gym.spaces.MultiBinary(1)}
        agent_id = agent_id or global_state  # the centralized critic reads the agent's index beside the state
        if agent_id:
            added[AGENT_ID_LEAF] = gym.spaces.Box(0.0, 1.0, (len(self.agents),), np.float32)
        self._state_space = global_state_space(first) if global_state else None
        if self._state_space is not None:
            added[GLOBAL_LEAF] = self._state_space
        for key in added:
            if key in leaves:
                raise ValueError(f"the agents' observation already has a key {key!r}, which lockstep adds itself")
        self._dict_obs = isinstance(obs_space, gym.spaces.Dict)
        self.single_observation_space = gym.spaces.Dict(leaves | added)
        # each policy's leaves, as a slot of another policy carries them: zeros (and ones in its action mask)
        self._absent = {policy: _inactive_obs(leaves[policy], {mask_key}) for policy in dict.fromkeys(self.policy_of)}
        self._one_hot = np.eye(len(self.agents), dtype=np.float32) if agent_id else None  # [agents, agents]
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}
        masks = {f"{policy}.{mask_key}" for policy in self.policy_of} or {mask_key}
        self._placeholder = _inactive_obs(self.single_observation_space, masks)
        self._obs: list[dict] = [{} for _ in range(self.num_envs)]  # each slot's observation, as one agent's dict
        self._return = np.zeros(self.num_envs, np.float64)
        self._length = np.zeros(self.num_envs, np.int64)

    def _state(self, env: Any, observations: dict[str, Any]) -> np.ndarray | None:
        """The global state of ``env``'s slots, or None without ``global_state``."""
        return None if self._state_space is None else global_state(env, observations, self._state_space)

    def _slot_obs(self, agent_obs: Any, agent: int, state: np.ndarray | None = None) -> dict:
        if self.policy_of:  # its own observation under its policy's name, the other policies' leaves absent
            policy = self.policy_of[agent]
            own = dict(agent_obs) if isinstance(agent_obs, dict) else {OBSERVATION_LEAF: agent_obs}
            leaves = self._absent | {policy: own}
        else:
            leaves = dict(agent_obs) if self._dict_obs else {OBSERVATION_LEAF: agent_obs}
        leaves[ACTIVE_LEAF] = np.ones(1, np.int8)
        if self._one_hot is not None:
            leaves[AGENT_ID_LEAF] = self._one_hot[agent]
        if state is not None:
            leaves[GLOBAL_LEAF] = state
        return leaves

    def _placeholder_of(self, agent: int) -> dict:
        """An inactive slot's observation: zeros, except the action mask and the agent's own index."""
        if self._one_hot is None:
            return self._placeholder
        return self._placeholder | {AGENT_ID_LEAF: self._one_hot[agent]}

    def _batch(self) -> dict[str, Any]:
        """Every slot's observation stacked leaf by leaf, at any depth: [k, *leaf] arrays in the slots' tree."""
        space = self.single_observation_space
        return gym.vector.utils.concatenate(space, self._obs, gym.vector.utils.create_empty_array(space, self.num_envs))

    def _reset_env(self, e: int, seed: int | None) -> None:
        observations, _ = self.envs[e].reset(seed=seed)
        A, state = len(self.agents), self._state(self.envs[e], observations)
        for i, agent in enumerate(self.agents):
            slot = e * A + i
            self._obs[slot] = (self._slot_obs(observations[agent], i, state) if agent in observations
                               else self._placeholder_of(i))
            self._return[slot], self._length[slot] = 0.0, 0

    def reset(self, *, seed: int | list[int] | None = None, options: dict | None = None):
        A = len(self.agents)
        for e in range(len(self.envs)):
            s = seed[e * A] if isinstance(seed, list) else (None if seed is None else seed + e)
            self._reset_env(e, s)
        return self._batch(), {}

    def step(self, actions: np.ndarray):
        k, A = self.num_envs, len(self.agents)
        reward = np.zeros(k, np.float32)
        terminated = np.zeros(k, bool)
        truncated = np.zeros(k, bool)
        final_obs = np.empty(k, object)
        ended = np.zeros(k, bool)
        ep_return, ep_length = np.zeros(k, np.float64), np.zeros(k, np.int64)
        for e, env in enumerate(self.envs):
            live = list(env.agents)
            observations, rewards, terms, truncs, _ = env.step(
                {agent: self._action(actions, e * A + self.agents.index(agent)) for agent in live})
            state = self._state(env, observations)
            for i, agent in enumerate(self.agents):
                slot = e * A + i
                if agent not in live:  # left earlier: an inactive step (module docstring)
                    terminated[slot] = True
                    self._obs[slot] = self._placeholder_of(i)
                    continue
                reward[slot] = rewards.get(agent, 0.0)
                self._return[slot] += reward[slot]
                self._length[slot] += 1
                terminated[slot] = bool(terms.get(agent, False))
                truncated[slot] = bool(truncs.get(agent, False))
                if terminated[slot] or truncated[slot]:
                    ended[slot] = True
                    ep_return[slot], ep_length[slot] = self._return[slot], self._length[slot]
                    if truncated[slot] and not terminated[slot]:  # its last observation bootstraps its value
                        final_obs[slot] = self._slot_obs(observations[agent], i, state)
                    self._obs[slot] = self._placeholder_of(i)
                else:
                    self._obs[slot] = self._slot_obs(observations[agent], i, state)
            if not env.agents:  # every agent has left: the next episode starts in this step
                self._reset_env(e, None)
        infos: dict[str, Any] = {"final_obs": final_obs}
        if ended.any():
            infos["episode"], infos["_episode"] = {"r": ep_return, "l": ep_length}, ended
        return self._batch(), reward, terminated, truncated, infos

    def _action(self, actions: Any, slot: int) -> Any:
        """The action of ``slot``'s agent: its row, and of a Dict of the policies' actions its policy's part."""
        action = slot_action(actions, slot)
        return action[self.policy_of[slot % len(self.agents)]] if self._action_by_policy else action

    def close(self, **kwargs) -> None:
        for env in self.envs:
            env.close()


def make_vector(module_name: str, num_envs: int, kwargs: dict[str, Any] | None = None) -> ParallelSlots:
    """The actor's vector env for ``pettingzoo:MODULE``: ``num_envs`` envs, one slot per agent, each env built
    with ``kwargs`` (``env.kwargs``; ``AGENT_ID_KWARG`` among them is ``env.agent_id``, ``GLOBAL_STATE_KWARG``
    ``model.critic_input: global``, ``IMAGE_LAYOUT_KWARG`` ``env.image_layout``, for lockstep)."""
    kwargs = dict(kwargs or {})
    agent_id = bool(kwargs.pop(AGENT_ID_KWARG, False))
    mask_key = str(kwargs.pop(MASK_KEY_KWARG, DEFAULT_MASK_KEY))
    policies = kwargs.pop(POLICIES_KWARG, None)
    global_state = bool(kwargs.pop(GLOBAL_STATE_KWARG, False))
    image_layout = str(kwargs.pop(IMAGE_LAYOUT_KWARG, "auto"))
    return ParallelSlots(parallel_factory(module_name, kwargs, image_layout), num_envs, agent_id, mask_key, policies,
                         global_state)


def agent_policies(vec: Any) -> dict[str, str]:
    """Each agent's policy (agent name -> policy name) by which an actor's vector env ``vec`` lays out its slots:
    what its hello says, so that the learner can refuse a mapping other than its own (``EnvSpec.agent_policies``).
    Empty unless ``vec`` is a parallel env's slots of several policies."""
    return dict(zip(vec.agents, vec.policy_of)) if isinstance(vec, ParallelSlots) else {}


def _inactive_obs(space: gym.Space, masks: set[str], path: str = "") -> Any:
    """A value of ``space`` for a slot with no agent: zeros in every leaf of a Dict or Tuple at any depth (paths
    as ``envs.spaces`` writes them), ones in the leaves at ``masks`` (the action mask's path, under each policy's
    name with several), so that the slot still allows an action."""
    if isinstance(space, gym.spaces.Dict):
        return {key: _inactive_obs(sub, masks, f"{path}.{key}" if path else str(key))
                for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_inactive_obs(sub, masks, f"{path}[{i}]") for i, sub in enumerate(space.spaces))
    return (np.ones if path in masks else np.zeros)(space.shape, space.dtype)


class _AgentView:
    """One slot's spaces, for what asks an env for its spaces (``envs.env_spec``)."""

    def __init__(self, slots: ParallelSlots) -> None:
        self._slots = slots
        self.observation_space = slots.single_observation_space
        self.action_space = slots.single_action_space
        self.agents = len(slots.agents)  # slots per env
        self.agent_names = tuple(slots.agents)  # possible_agents
        self.policy_of = slots.policy_of  # several policies: each agent's, in possible_agents order

    def close(self) -> None:
        self._slots.close()


def agent_view(module_name: str, kwargs: dict[str, Any] | None = None) -> _AgentView:
    """The spaces of one agent's slot of ``pettingzoo:MODULE``."""
    return _AgentView(make_vector(module_name, 1, kwargs))


def single_env(module_name: str, **kwargs) -> gym.Env:
    """What asks for one Gymnasium env of a multi-agent id (``lockstep eval``, ``envs.make_env``): refused."""
    raise ValueError(f"pettingzoo:{module_name} is a multi-agent env: its agents are slots of the actor's vector "
                     "env, and there is no single-agent env of it to play (its returns are in metrics.csv)")
