"""Space descriptions: what the learner and the actor agree on about an observation or action space.

Imported by the actor, so it must not import torch.

A space is a tree: ``Dict`` and ``Tuple`` spaces, nested, whose leaves are ``Box``, ``Discrete``,
``MultiDiscrete`` or ``MultiBinary`` spaces. A flat space (one Box or Discrete, as most Gymnasium envs have)
is the one-leaf case: its spec, its arrays, the wire and the files of a run are what they always were.

Leaves are named by paths: a Dict key as it is, a Tuple index in brackets, joined by dots below the
root (``image``, ``goal.position``, ``pair[0]``). The spec lists them depth first, in the space's order.

Observations of a tree space are record arrays: ``[k]`` values of a numpy structured dtype with one field
per leaf, named by its path, of the leaf's own dtype and shape (a uint8 image leaf stays uint8). Whatever
holds observations (the batcher, the rollout, the audit) stores them as it stores a flat space's arrays;
``obs[path]`` is one leaf [k, *leaf]; each leaf travels as its own tensor (gRPC,
the shared-memory layout) and enters the policy as its own tensor.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

LEAF_SPACES = "Box, Discrete, MultiDiscrete and MultiBinary"
# A Dict observation's leaf (MultiBinary(1)) that says whether the slot's agent still takes part: 0 where a
# multi-agent env's agent has left its episode early (``envs.pettingzoo``). The learner trains on no step
# whose flag is 0 (``learner.rollout.Batch.valid``).
ACTIVE_LEAF = "agent_active"
MIN_IMAGE_SIDE = 3  # the smallest height and width the CNNs' 3x3 convolution takes; a smaller grid is a vector
AGENT_ID_LEAF = "agent_id"  # env.agent_id: the one-hot index of a multi-agent slot's agent (``envs.pettingzoo``)
# model.critic_input global: the env's global state beside a multi-agent slot's own observation, for the critic
# alone (``envs.pettingzoo``); no actor network reads it, so acting needs only the agent's own observation
GLOBAL_LEAF = "global_state"


@dataclass(frozen=True)
class SpaceSpec:
    """What the learner and the actor must agree on about one space: a leaf, or a tree of leaves."""

    kind: str  # "discrete", "box", "multi_discrete", "multi_binary" or "tree" (a Dict or Tuple)
    shape: tuple[int, ...]  # one value's shape: () for Discrete and for a tree (one record)
    dtype: str  # numpy dtype name; "record" for a tree (``array_dtype``)
    n: int = 0  # discrete only
    low: np.ndarray | None = field(default=None, compare=False)  # box only
    high: np.ndarray | None = field(default=None, compare=False)  # box only
    nvec: tuple[int, ...] = ()  # multi_discrete only: choices per entry (flat; ``shape`` is its shape)
    leaves: tuple[tuple[str, SpaceSpec], ...] = ()  # tree only: (path, leaf), depth first
    # where a leaf lies in the env's nested observation (Dict keys, Tuple indices): known where the spec was
    # made from the env's space (``from_space``), absent where it arrived in a hello, which needs none
    route: tuple[str | int, ...] = field(default=(), compare=False)
    # a tree with an action mask (``with_action_mask``): the mask leaf's path and how many choices each
    # categorical entry of the action has; the learner's alone (an actor sends the leaf as any other)
    mask: str = field(default="", compare=False)
    mask_groups: tuple[int, ...] = field(default=(), compare=False)

    @classmethod
    def from_space(cls, space: gym.Space, keys: tuple[str, ...] | list[str] = ()) -> SpaceSpec:
        """The spec of ``space``; ``keys`` (``env.obs_keys``) keeps only those keys of a Dict space, and the leaves
        lockstep adds to a multi-agent slot's observation (``agent_active``, without which the steps of agents
        that left would be trained on, ``agent_id`` and ``global_state``) whether or not they are named.

        Raises ``ValueError`` naming the leaf for a space lockstep cannot carry (a ``Text`` leaf, a Discrete
        that does not start at 0), and naming the keys for one of ``keys`` the space does not have."""
        if keys:
            if not isinstance(space, gym.spaces.Dict):
                raise ValueError(f"env.obs_keys {list(keys)} selects keys of a Dict observation, but the "
                                 f"observation space is {space}; leave env.obs_keys empty")
            missing = [k for k in keys if k not in space.spaces]
            if missing:
                raise ValueError(f"env.obs_keys names {missing}, which the observation space does not have; "
                                 f"its keys are {list(space.spaces)}")
            own = [k for k in (ACTIVE_LEAF, AGENT_ID_LEAF, GLOBAL_LEAF) if k in space.spaces and k not in keys]
            space = gym.spaces.Dict({k: space.spaces[k] for k in [*keys, *own]})
        if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
            leaves = tuple(_leaves(space, "", ()))
            if not leaves:
                raise ValueError(f"the observation space {space} has no leaves; lockstep needs at least one")
            return cls("tree", (), "record", leaves=leaves)
        return _leaf(space, "", ())

    @property
    def tree(self) -> bool:
        return self.kind == "tree"

    @property
    def discrete(self) -> bool:
        return self.kind == "discrete"

    @property
    def image(self) -> bool:
        """An image-like leaf: a uint8 Box of [C, H, W], H and W at least ``MIN_IMAGE_SIDE`` (the CNN family
        encodes it, scaling its pixels)."""
        return (self.kind == "box" and self.dtype == "uint8" and len(self.shape) == 3
                and min(self.shape[1:]) >= MIN_IMAGE_SIDE)

    def paths(self) -> tuple[str, ...]:
        return tuple(path for path, _ in self.leaves)

    def leaf_specs(self) -> tuple[tuple[str, SpaceSpec], ...]:
        """(path, leaf) of every leaf: the leaves of a tree, or ``("", self)`` for a flat space."""
        return self.leaves if self.tree else (("", self),)

    @functools.cached_property
    def array_dtype(self) -> np.dtype:
        """The dtype of an array of values of this space: the leaf's, or a tree's record of every leaf."""
        if self.tree:
            return np.dtype([(path, np.dtype(leaf.dtype), leaf.shape) for path, leaf in self.leaves])
        return np.dtype(self.dtype)

    @property
    def action_dtype(self) -> np.dtype:
        """The dtype actions from this space travel and are stored in: int64 for Discrete, MultiDiscrete,
        MultiBinary and trees of them, float32 for a Box and for a tree with a Box leaf."""
        if self.kind == "box" or any(leaf.kind == "box" for _, leaf in self.leaves):
            return np.dtype(np.float32)
        return np.dtype(np.int64)

    @property
    def element_shape(self) -> tuple[int, ...]:
        """The shape of one action as it travels and is stored: () for Discrete, the Box's shape, and for
        the other spaces a flat vector of every entry (``action_entries``)."""
        if self.kind in ("discrete", "box"):
            return () if self.discrete else tuple(self.shape)
        return (sum(size for *_, size in action_entries(self)),)

    def describe(self) -> str:
        if self.kind == "discrete":
            return f"Discrete({self.n})"
        if self.kind == "multi_discrete":
            return f"MultiDiscrete({list(self.nvec)}, shape={self.shape})"
        if self.kind == "multi_binary":
            return f"MultiBinary(shape={self.shape})"
        if self.tree:
            return "{" + ", ".join(f"{path}: {leaf.describe()}" for path, leaf in self.leaves) + "}"
        return f"Box(shape={self.shape}, dtype={self.dtype})"

    def mismatch(self, other: SpaceSpec) -> str | None:
        """A description of how ``other`` differs from this spec, naming the leaf, or None if they agree."""
        if self.tree and other.tree:
            return _tree_mismatch(self, other)
        if (self.kind, self.shape, self.dtype, self.n, self.nvec) != (
                other.kind, other.shape, other.dtype, other.n, other.nvec):
            return f"{other.describe()} does not match {self.describe()}"
        if self.kind == "box" and not (
            np.array_equal(self.low, other.low) and np.array_equal(self.high, other.high)
        ):
            return (f"bounds of {other.describe()} differ: low {other.low} high {other.high}, "
                    f"expected low {self.low} high {self.high}")
        return None


def _tree_mismatch(ours: SpaceSpec, theirs: SpaceSpec) -> str | None:
    mine, yours = ours.paths(), theirs.paths()
    for path in mine:
        if path not in yours:
            return f"has no leaf {path!r} (its leaves: {list(yours)}; the learner's: {list(mine)})"
    for path in yours:
        if path not in mine:
            return f"has a leaf {path!r} the learner's does not (the learner's leaves: {list(mine)})"
    if mine != yours:
        return f"lists its leaves {list(yours)} in another order than the learner's {list(mine)}"
    for (path, leaf), (_, other) in zip(ours.leaves, theirs.leaves):
        diff = leaf.mismatch(other)
        if diff:
            return f"leaf {path!r}: {diff}"
    return None


def _leaves(space: gym.Space, path: str, route: tuple) -> list[tuple[str, SpaceSpec]]:
    """(path, leaf spec) of every leaf below ``space``, depth first."""
    if isinstance(space, gym.spaces.Dict):
        items = [(f"{path}.{key}" if path else str(key), space.spaces[key], key) for key in space.spaces]
    elif isinstance(space, gym.spaces.Tuple):
        items = [(f"{path}[{i}]", sub, i) for i, sub in enumerate(space.spaces)]
    else:
        return [(path, _leaf(space, path, route))]
    found: list[tuple[str, SpaceSpec]] = []
    for sub_path, sub, step in items:
        found += _leaves(sub, sub_path, (*route, step))
    return found


def _leaf(space: gym.Space, path: str, route: tuple) -> SpaceSpec:
    where = f"observation leaf {path!r}" if path else f"space {space}"
    if isinstance(space, gym.spaces.Discrete):
        if int(space.start) != 0:
            raise ValueError(f"Discrete spaces must start at 0, got start={space.start} ({where})")
        return SpaceSpec("discrete", (), np.dtype(space.dtype).name, n=int(space.n), route=route)
    if isinstance(space, gym.spaces.Box):
        return SpaceSpec("box", tuple(space.shape), np.dtype(space.dtype).name,
                         low=np.asarray(space.low), high=np.asarray(space.high), route=route)
    if isinstance(space, gym.spaces.MultiDiscrete):
        if np.any(space.start != 0):
            raise ValueError(f"MultiDiscrete spaces must start at 0, got start={space.start.tolist()} ({where})")
        return SpaceSpec("multi_discrete", tuple(space.shape), np.dtype(space.dtype).name,
                         nvec=tuple(int(v) for v in space.nvec.flatten()), route=route)
    if isinstance(space, gym.spaces.MultiBinary):
        return SpaceSpec("multi_binary", tuple(space.shape), np.dtype(space.dtype).name, route=route)
    if path:
        raise ValueError(f"{where} is a {type(space).__name__} space, which lockstep cannot encode (leaves may be "
                         f"{LEAF_SPACES}); leave it out with env.obs_keys (the Dict keys to keep)")
    raise ValueError(f"unsupported space {space}: lockstep handles {LEAF_SPACES} spaces and Dict and Tuple "
                     "spaces of them")


def _at(value: Any, route: tuple) -> Any:
    for step in route:
        value = value[step]
    return value


def to_records(obs: Any, spec: SpaceSpec) -> np.ndarray:
    """A batch of observations [k] as the env gave them (for a tree: nested dicts and tuples of [k, *leaf]
    arrays, a vector env's) -> the array the learner takes: unchanged for a flat space, records for a tree
    (leaves not in the spec, such as keys ``env.obs_keys`` leaves out, are dropped)."""
    if not spec.tree:
        return obs
    first = np.asarray(_at(obs, spec.leaves[0][1].route))
    records = np.empty(len(first), spec.array_dtype)
    for path, leaf in spec.leaves:
        records[path] = _at(obs, leaf.route)
    return records


def stack_records(observations: list, spec: SpaceSpec) -> np.ndarray:
    """Single observations (for a tree: nested dicts and tuples, e.g. a vector env's ``final_obs``) -> [m]."""
    if not spec.tree:
        return np.stack(observations)
    records = np.empty(len(observations), spec.array_dtype)
    for path, leaf in spec.leaves:
        records[path] = [_at(o, leaf.route) for o in observations]
    return records


def from_leaves(leaves: list[np.ndarray], spec: SpaceSpec) -> np.ndarray:
    """Leaf arrays [m, *leaf], in the spec's order (already checked) -> records [m] (a copy)."""
    records = np.empty(len(leaves[0]), spec.array_dtype)
    for (path, _), value in zip(spec.leaves, leaves):
        records[path] = value
    return records


def action_spec(space: gym.Space) -> SpaceSpec:
    """The spec of an action space: a Discrete, Box, MultiDiscrete or MultiBinary, or a Dict or Tuple of
    them (not nested: what the policy's heads act in)."""
    try:
        spec = SpaceSpec.from_space(space)
    except ValueError as err:
        raise ValueError(f"unsupported action space {space}: {err}") from None
    if any(len(leaf.route) > 1 for _, leaf in spec.leaves):
        raise ValueError(f"unsupported action space {space}: a Dict or Tuple of actions must not nest; "
                         f"its leaves are {list(spec.paths())}")
    return spec


def leaf_choices(leaf: SpaceSpec) -> tuple[int, ...]:
    """The choices of each categorical entry of an action leaf: a Discrete's n, a MultiDiscrete's nvec, 2 per
    bit of a MultiBinary; () for a Box (its elements are Gaussian)."""
    if leaf.kind == "discrete":
        return (leaf.n,)
    if leaf.kind == "multi_discrete":
        return leaf.nvec
    if leaf.kind == "multi_binary":
        return (2,) * math.prod(leaf.shape)
    return ()


def with_action_mask(observation: SpaceSpec, action: SpaceSpec, key: str) -> SpaceSpec:
    """``observation`` with its action mask: the leaf ``key`` (``env.action_mask_key``) of a Dict observation,
    if it has one, one number per choice of the action's categorical entries (Discrete, MultiDiscrete,
    MultiBinary parts, in the action's order), non-zero where the choice is allowed.

    Raises ``ValueError`` naming the leaf for a mask that cannot mask this action."""
    if not key or not observation.tree or key not in observation.paths():
        return observation
    leaf = dict(observation.leaves)[key]
    groups = tuple(n for _, part, *_ in action_entries(action) for n in leaf_choices(part))
    if not groups:
        raise ValueError(f"observation leaf {key!r} is an action mask, but the action space {action.describe()} has "
                         "no Discrete, MultiDiscrete or MultiBinary part to mask; set env.action_mask_key to '' "
                         "to use the leaf as an observation only")
    integral = leaf.kind == "multi_binary" or (leaf.kind == "box" and np.dtype(leaf.dtype).kind in "biu")
    if not integral or math.prod(leaf.shape) != sum(groups):
        raise ValueError(f"observation leaf {key!r} (env.action_mask_key) is {leaf.describe()}; an action mask of "
                         f"{action.describe()} is a MultiBinary or an integer Box of {sum(groups)} elements, one per "
                         "choice, non-zero where it is allowed")
    return dataclasses.replace(observation, mask=key, mask_groups=groups)


def policy_spaces(observation: SpaceSpec, action: SpaceSpec, policies: tuple[str, ...], name: str,
                  mask_key: str) -> tuple[SpaceSpec, SpaceSpec]:
    """Policy ``name``'s observation and action spaces out of a slot's of a run with several ``policies``
    (``envs.pettingzoo``): its own leaves, which the slot holds under its name (``name.PATH``, read as ``PATH``),
    beside the leaves every slot has (``agent_active``, ``agent_id``); and its action, the part under its name
    where the policies' actions differ (a Dict keyed by the policies' names), else the slot's."""
    own, others = f"{name}.", tuple(f"{p}." for p in policies)
    leaves = tuple((path[len(own):], leaf) if path.startswith(own) else (path, leaf)
                   for path, leaf in observation.leaves if path.startswith(own) or not path.startswith(others))
    by_policy = action.tree and sorted(action.paths()) == sorted(policies)
    act = dict(action.leaves)[name] if by_policy else action
    return with_action_mask(SpaceSpec("tree", (), "record", leaves=leaves), act, mask_key), act


def allowed_nothing(mask: np.ndarray, groups: tuple[int, ...]) -> tuple[int, int] | None:
    """(slot, entry) of the first slot whose mask [k, *mask] allows no choice of an entry, or None."""
    flat = mask.reshape(len(mask), -1) != 0  # [k, sum(groups)]
    first = 0
    for entry, n in enumerate(groups):
        empty = ~flat[:, first:first + n].any(1)
        if empty.any():
            return int(np.flatnonzero(empty)[0]), entry
        first += n
    return None


def action_entries(spec: SpaceSpec) -> list[tuple[str, SpaceSpec, int, int]]:
    """(path, leaf, first, size): where each leaf of an action lies in its flat vector (``element_shape``),
    in the leaves' order; a Discrete leaf is one entry, the others one per element."""
    entries, first = [], 0
    for path, leaf in spec.leaf_specs():
        size = 1 if leaf.discrete else math.prod(leaf.shape)
        entries.append((path, leaf, first, size))
        first += size
    return entries


def slot_action(actions: Any, slot: int) -> Any:
    """One slot's action out of a vector env's (``env_actions``): an array [k, ...], or for a Dict or Tuple action
    its parts, each [k, ...], of which the slot gets its row."""
    if isinstance(actions, dict):
        return {key: part[slot] for key, part in actions.items()}
    if isinstance(actions, tuple):
        return tuple(part[slot] for part in actions)
    return actions[slot]


def env_actions(actions: np.ndarray, spec: SpaceSpec) -> Any:
    """Actions [k, *act] as the learner sends them -> what the vector env steps with: for a Box the array
    clipped to its bounds (the learner keeps the unclipped sample), for a Discrete the array, for the flat
    vectors of the other spaces each leaf's part in its shape and dtype (Box parts clipped), a Dict's as
    a dict and a Tuple's as a tuple."""
    if spec.kind == "discrete":
        return actions
    if spec.kind == "box":
        return np.clip(actions, spec.low.astype(np.float32), spec.high.astype(np.float32))
    k = len(actions)
    parts = {}
    for path, leaf, first, size in action_entries(spec):
        part = actions[:, first:first + size]
        if leaf.kind == "box":
            parts[path] = np.clip(part.reshape(k, *leaf.shape), leaf.low.astype(np.float32),
                                  leaf.high.astype(np.float32))
        else:
            parts[path] = part.reshape(k, *leaf.shape).astype(leaf.dtype)
    if not spec.tree:
        return parts[""]
    if all(path.startswith("[") for path in parts):  # a Tuple: its leaves are [0], [1], ...
        return tuple(parts.values())
    return parts
