"""Conversions between protocol messages and plain Python/numpy values, with validation."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from lockstep.envs import SpaceSpec, from_leaves
from lockstep.envs.spaces import allowed_nothing
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.codec import ALLOWED_DTYPES, MAX_DIMS, CodecError, decode, encode

_KINDS = {"discrete": pb.Space.DISCRETE, "box": pb.Space.BOX, "multi_discrete": pb.Space.MULTI_DISCRETE,
          "multi_binary": pb.Space.MULTI_BINARY, "tree": pb.Space.TREE}
MAX_LEAVES = 256  # leaves of one Dict/Tuple space in a hello: far above any real observation
MAX_AGENTS = 4096  # entries of a hello's agent_policies: far above the agents of any real PettingZoo env


def space_to_proto(spec: SpaceSpec) -> pb.Space:
    msg = pb.Space(kind=_KINDS[spec.kind], shape=spec.shape, dtype=spec.dtype, n=spec.n, nvec=spec.nvec)
    if spec.kind == "box":
        msg.low.CopyFrom(encode(spec.low))
        msg.high.CopyFrom(encode(spec.high))
    for path, leaf in spec.leaves:
        msg.leaves.add(path=path, space=space_to_proto(leaf))
    return msg


def space_from_proto(msg: pb.Space, name: str) -> SpaceSpec:
    """The spec a hello's space describes (its sizes already bounded by ``check_hello``)."""
    if msg.kind == pb.Space.TREE:
        if not msg.leaves:
            raise CodecError(f"{name}: a Dict or Tuple space needs at least one leaf")
        paths = [leaf.path for leaf in msg.leaves]
        if len(set(paths)) != len(paths) or "" in paths:
            raise CodecError(f"{name}: leaf paths {paths} must be distinct and non-empty")
        leaves = []
        for leaf in msg.leaves:
            if leaf.space.kind == pb.Space.TREE:
                raise CodecError(f"{name}: leaf {leaf.path!r} is itself a tree; list the leaves of nested "
                                 "spaces by their paths")
            leaves.append((leaf.path, space_from_proto(leaf.space, f"{name}.leaf {leaf.path!r}")))
        return SpaceSpec("tree", (), "record", leaves=tuple(leaves))
    if msg.leaves:
        raise CodecError(f"{name}: only a Dict or Tuple space (kind TREE) has leaves")
    if msg.dtype not in ALLOWED_DTYPES:
        raise CodecError(f"{name}: dtype {msg.dtype!r} is not one of {sorted(ALLOWED_DTYPES)}")
    shape = tuple(int(d) for d in msg.shape)
    if msg.kind == pb.Space.DISCRETE:
        if msg.n < 1:
            raise CodecError(f"{name}: a Discrete space needs n >= 1, got {msg.n}")
        return SpaceSpec("discrete", (), msg.dtype, n=int(msg.n))
    if msg.kind == pb.Space.BOX:
        low = decode(msg.low, f"{name}.low", shape=shape)
        high = decode(msg.high, f"{name}.high", shape=shape)
        return SpaceSpec("box", shape, msg.dtype, low=low, high=high)
    if msg.kind == pb.Space.MULTI_DISCRETE:
        if len(msg.nvec) != math.prod(shape) or min(msg.nvec, default=1) < 1:
            raise CodecError(f"{name}: a MultiDiscrete space of shape {list(shape)} needs {math.prod(shape)} "
                             f"choice counts of at least 1, got {list(msg.nvec)}")
        return SpaceSpec("multi_discrete", shape, msg.dtype, nvec=tuple(int(v) for v in msg.nvec))
    if msg.kind == pb.Space.MULTI_BINARY:
        return SpaceSpec("multi_binary", shape, msg.dtype)
    raise CodecError(f"{name}: unknown space kind {msg.kind}; expected DISCRETE, BOX, MULTI_DISCRETE, "
                     "MULTI_BINARY or TREE")


LEARNING, OPPONENT = "learning", "opponent"  # a hello's roles
ROLES = (LEARNING, OPPONENT)


@dataclass(frozen=True)
class HelloInfo:
    protocol: int
    actor_id: int
    run_id: str
    num_envs: int
    env_id: str
    observation: SpaceSpec
    action: SpaceSpec
    peer: str = ""  # where the hello came from, as its transport names it (for the log and refusals)
    role: str = LEARNING  # LEARNING, or OPPONENT: a self-play actor's connection for its opponents' moves
    # a PettingZoo parallel env of several policies: each agent's policy, by which the actor laid out its slots
    agent_policies: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class HelloLimits:
    """The largest hello a learner reads (``learner.max_envs_per_actor``, ``learner.max_id_length``,
    ``learner.max_space_elements``): far above any real actor, far below what would exhaust the learner.

    Every size a hello gives is what the learner allocates for that actor (slots, policy state, noise keys,
    a shared-memory region) or keeps (its run id, for as long as the learner runs), so each is bounded
    before anything is decoded or sized from it."""

    max_envs: int = 65_536
    max_id_length: int = 256
    max_space_elements: int = 1 << 24


DEFAULT_HELLO_LIMITS = HelloLimits()


def check_hello(msg: pb.Hello, limits: HelloLimits) -> None:
    """Refuse (``CodecError`` naming the field and its limit) a hello whose sizes are over ``limits``."""
    for name, value in (("run_id", msg.run_id), ("env_id", msg.env_id),
                        ("observation_space.dtype", msg.observation_space.dtype),
                        ("action_space.dtype", msg.action_space.dtype)):
        if len(value) > limits.max_id_length:
            raise CodecError(f"hello.{name}: {len(value)} characters, over the limit of {limits.max_id_length} "
                             "(learner.max_id_length)")
    if len(msg.agent_policies) > MAX_AGENTS:
        raise CodecError(f"hello.agent_policies: {len(msg.agent_policies)} agents, over the limit of {MAX_AGENTS}")
    if any(len(agent) > limits.max_id_length or len(policy) > limits.max_id_length
           for agent, policy in msg.agent_policies.items()):
        raise CodecError(f"hello.agent_policies: an agent or policy name over the limit of {limits.max_id_length} "
                         "characters (learner.max_id_length)")
    if msg.num_envs > limits.max_envs:
        raise CodecError(f"hello.num_envs: {msg.num_envs} envs, over the limit of {limits.max_envs} per actor "
                         "(learner.max_envs_per_actor); run more actors with fewer envs each")
    for name, space in (("observation_space", msg.observation_space), ("action_space", msg.action_space)):
        _check_space_sizes(space, f"hello.{name}", limits)


def _check_space_sizes(space: pb.Space, name: str, limits: HelloLimits) -> None:
    """Bound a hello's space and each of its leaves: leaves, path lengths, dimensions, and elements in all
    (with the one-hot widths of discrete leaves, which the policy allocates)."""
    if len(space.leaves) > MAX_LEAVES:
        raise CodecError(f"{name}: {len(space.leaves)} leaves, over the limit of {MAX_LEAVES}")
    parts = [(name, space)]
    for i, leaf in enumerate(space.leaves):
        if len(leaf.path) > limits.max_id_length or len(leaf.space.dtype) > limits.max_id_length:
            raise CodecError(f"{name}: leaf {i}'s path or dtype is over the limit of {limits.max_id_length} "
                             "characters (learner.max_id_length)")
        if leaf.space.leaves:
            raise CodecError(f"{name}: leaf {leaf.path!r} has leaves of its own; list nested leaves by their paths")
        parts.append((f"{name}.leaf {leaf.path!r}", leaf.space))
    total = 0
    for where, part in parts:
        if len(part.shape) > MAX_DIMS:
            raise CodecError(f"{where}: {len(part.shape)} dimensions, over the limit of {MAX_DIMS}")
        if any(d < 0 for d in part.shape):
            raise CodecError(f"{where}: negative shape {list(part.shape)}")
        if len(part.nvec) > limits.max_space_elements:
            raise CodecError(f"{where}: {len(part.nvec)} choice counts, over the limit of "
                             f"{limits.max_space_elements} (learner.max_space_elements)")
        total += max(math.prod(part.shape), part.n, sum(max(0, v) for v in part.nvec))
        if total > limits.max_space_elements:
            raise CodecError(f"{where}: {total} elements (shape {list(part.shape)}, n {part.n}) in the space so "
                             f"far, over the limit of {limits.max_space_elements} (learner.max_space_elements)")


def hello_from_proto(msg: pb.Hello, limits: HelloLimits = DEFAULT_HELLO_LIMITS, peer: str = "") -> HelloInfo:
    """The hello's values, its sizes checked against ``limits`` before anything is decoded from it."""
    check_hello(msg, limits)
    return HelloInfo(peer=peer,
        protocol=int(msg.protocol), actor_id=int(msg.actor_id), run_id=msg.run_id,
        num_envs=int(msg.num_envs), env_id=msg.env_id,
        observation=space_from_proto(msg.observation_space, "hello.observation_space"),
        action=space_from_proto(msg.action_space, "hello.action_space"), role=_role(msg.role),
        agent_policies=dict(msg.agent_policies),
    )


def _role(role: str) -> str:
    if role == "":
        return LEARNING
    if role not in ROLES:
        raise CodecError(f"hello.role: {role[:32]!r} is not a role; a hello says {' or '.join(ROLES)} (or nothing: "
                         f"{LEARNING})")
    return role


@dataclass
class StepData:
    """One actor step, checked against the actor's spec (``check_step``).

    Over gRPC the arrays are read-only views of the message's bytes; over shared memory they are
    copies taken out of the actor's region before the check, so the actor cannot change them after it.
    """

    obs: np.ndarray  # [k, *obs]
    reward: np.ndarray  # [k] float32
    terminated: np.ndarray  # [k] bool
    truncated: np.ndarray  # [k] bool
    final_index: np.ndarray  # [m] int64
    final_obs: np.ndarray  # [m, *obs]
    episode_return: np.ndarray  # [e] float64
    episode_length: np.ndarray  # [e] int64


def step_to_proto(obs, reward, terminated, truncated, final_index, final_obs,
                  episode_return, episode_length) -> pb.Step:
    """The Step message; the records of a Dict or Tuple observation (``envs.spaces``) go leaf by leaf."""
    msg = pb.Step(reward=encode(reward), terminated=encode(terminated), truncated=encode(truncated),
                  final_index=encode(final_index), episode_return=encode(episode_return),
                  episode_length=encode(episode_length))
    if obs.dtype.names:
        msg.observation_leaves.extend(encode(np.ascontiguousarray(obs[leaf])) for leaf in obs.dtype.names)
        msg.final_observation_leaves.extend(encode(np.ascontiguousarray(final_obs[leaf]))
                                            for leaf in final_obs.dtype.names)
    else:
        msg.observation.CopyFrom(encode(obs))
        msg.final_observation.CopyFrom(encode(final_obs))
    return msg


def step_message(step: StepData) -> pb.Step:
    """The Step message that carries one step's outcome (an actor's ``EnvLoop.outcome()``): ``step_from_proto``'s
    inverse."""
    return step_to_proto(step.obs, step.reward, step.terminated, step.truncated, step.final_index, step.final_obs,
                         step.episode_return, step.episode_length)


@dataclass(frozen=True)
class StepBounds:
    """The largest magnitudes a step may carry, and what to do with values beyond them.

    Both bounds lie far above any real observation or reward and far below float32's largest value, so
    a value within them stays finite when the learner casts it to float32 (a float64 observation of
    1e39 is refused here, never turned into inf there); a loss that overflows all the same is the
    guarded update's to skip (``ppo.optimize``). With ``sanitize`` an out-of-bound value is replaced
    instead (NaN by 0, anything else clipped to the bound).
    """

    max_observation: float = 1e10  # learner.max_observation: observations and final observations
    max_reward: float = 1e10  # learner.max_reward: rewards and finished episodes' returns
    sanitize: bool = False  # learner.sanitize


DEFAULT_BOUNDS = StepBounds()


def step_from_proto(msg: pb.Step, num_envs: int, observation: SpaceSpec,
                    bounds: StepBounds = DEFAULT_BOUNDS) -> StepData:
    """Decode a Step message and validate it with ``check_step``."""
    k, obs_shape, obs_dtype = num_envs, observation.shape, observation.dtype
    final_index = decode(msg.final_index, "step.final_index", np.int64, (None,))
    if observation.tree:
        obs = _decode_leaves(msg.observation_leaves, "step.observation_leaves", observation, k)
        final_obs = _decode_leaves(msg.final_observation_leaves, "step.final_observation_leaves", observation,
                                   len(final_index))
    else:
        obs = decode(msg.observation, "step.observation", obs_dtype, (k, *obs_shape))
        final_obs = decode(msg.final_observation, "step.final_observation", obs_dtype,
                           (len(final_index), *obs_shape))
    terminated = decode(msg.terminated, "step.terminated", np.bool_, (k,))
    truncated = decode(msg.truncated, "step.truncated", np.bool_, (k,))
    episode_return = decode(msg.episode_return, "step.episode_return", np.float64, (None,))
    data = StepData(
        obs=obs,
        reward=decode(msg.reward, "step.reward", np.float32, (k,)),
        terminated=terminated,
        truncated=truncated,
        final_index=final_index,
        final_obs=final_obs,
        episode_return=episode_return,
        episode_length=decode(msg.episode_length, "step.episode_length", np.int64, (len(episode_return),)),
    )
    return check_step(data, num_envs, observation, bounds)


def _decode_leaves(tensors, name: str, observation: SpaceSpec, rows: int) -> np.ndarray:
    """[rows] records of a tree observation from its leaves' tensors, one per leaf in the spec's order."""
    if len(tensors) != len(observation.leaves):
        raise CodecError(f"{name}: {len(tensors)} tensors for an observation of {len(observation.leaves)} leaves "
                         f"{list(observation.paths())}; send one tensor per leaf, in that order")
    return from_leaves([decode(tensor, f"{name}[{path!r}]", leaf.dtype, (rows, *leaf.shape))
                        for tensor, (path, leaf) in zip(tensors, observation.leaves)], observation)


def check_step(data: StepData, num_envs: int, observation: SpaceSpec,
               bounds: StepBounds = DEFAULT_BOUNDS) -> StepData:
    """Validate one step's arrays, whatever transport carried them; raise ``CodecError`` naming the field.

    Checks every array's dtype and shape against the actor's ``num_envs`` and observation space,
    reads the done flags by value (any non-zero byte is true), checks ``final_index`` against them,
    that no more episodes finished than there are envs (one per env and step at most), that
    observations, rewards and final observations are finite and within ``bounds``, and that every
    finished episode has a length of at least 1 and a finite return within the reward bound. With
    ``bounds.sanitize`` out-of-bound values are replaced instead (``StepBounds``) in the returned data;
    an episode length below 1 is refused either way.
    """
    # Per message on the learner, so the common case (every field as expected) is one comparison per
    # field; anything else goes through the field-by-field checks that name the problem.
    k, obs_shape, obs_dtype = num_envs, observation.shape, observation.array_dtype
    final_index, flags = data.final_index, (k,)
    if not (data.obs.dtype == obs_dtype and data.obs.shape == (k, *obs_shape)
            and data.reward.dtype == _FLOAT32 and data.reward.shape == flags
            and data.terminated.dtype == _BOOL and data.terminated.shape == flags
            and data.truncated.dtype == _BOOL and data.truncated.shape == flags
            and final_index.dtype == _INT64 and final_index.ndim == 1 and not len(final_index)
            and data.final_obs.dtype == obs_dtype and data.final_obs.shape == (0, *obs_shape)
            and data.episode_return.dtype == _FLOAT64 and data.episode_return.ndim == 1
            and data.episode_length.dtype == _INT64 and data.episode_length.shape == data.episode_return.shape
            and len(data.episode_return) <= k):
        return _check_fields(data, k, obs_shape, obs_dtype, bounds, observation)
    # A bool is one byte; a peer may send bytes other than 0 and 1, on which numpy's bool logic is undefined.
    data.terminated, data.truncated = data.terminated.view(np.uint8) != 0, data.truncated.view(np.uint8) != 0
    if data.truncated.any():  # no final observation came: right only if every truncated slot also terminated
        _check_final_index(final_index, data.terminated, data.truncated)
    return _check_values(data, bounds, observation)


def _check_fields(data: StepData, k: int, obs_shape: tuple, obs_dtype: np.dtype, bounds: StepBounds,
                  observation: SpaceSpec) -> StepData:
    """``check_step`` field by field, for a step with final observations or anything unexpected."""
    _expect(data.obs, "step.observation", obs_dtype, (k, *obs_shape))
    _expect(data.reward, "step.reward", _FLOAT32, (k,))
    _expect(data.terminated, "step.terminated", _BOOL, (k,))
    _expect(data.truncated, "step.truncated", _BOOL, (k,))
    # A bool is one byte; a peer may send bytes other than 0 and 1, on which numpy's bool logic is undefined.
    data.terminated, data.truncated = data.terminated.view(np.uint8) != 0, data.truncated.view(np.uint8) != 0
    final_index = data.final_index
    _expect(final_index, "step.final_index", _INT64, (None,))
    m = len(final_index)
    if m and (final_index.min() < 0 or final_index.max() >= k):
        raise CodecError(f"step.final_index: {final_index.tolist()} are not env indices in [0, {k})")
    _check_final_index(final_index, data.terminated, data.truncated)
    _expect(data.final_obs, "step.final_observation", obs_dtype, (m, *obs_shape))
    _expect(data.episode_return, "step.episode_return", _FLOAT64, (None,))
    e = len(data.episode_return)
    _expect(data.episode_length, "step.episode_length", _INT64, (e,))
    if e > k:
        raise CodecError(f"step.episode_return: {e} finished episodes in one step of {k} env(s); an env finishes "
                         "at most one episode per step, so report each finished episode once")
    return _check_values(data, bounds, observation)


def _check_values(data: StepData, bounds: StepBounds, observation: SpaceSpec) -> StepData:
    """Refuse (or with ``bounds.sanitize`` replace) values out of ``bounds``, and episode lengths below 1;
    a tree observation leaf by leaf. A discrete observation (a flat one or a tree's leaf) is also checked
    against its range, after any replacement: ``sanitize`` never clips a discrete value into its space."""
    for name, bound in _BOUNDED:
        value = getattr(data, name)
        if value.dtype.names:  # records: each leaf is bounded as a flat observation is
            for (path, leaf) in observation.leaves:
                where = f"step.{_FIELD[name]} leaf {path!r}"
                got = value[path]
                checked = _bounded(got, where, bound, bounds)
                if checked is not got:  # sanitized: the replacement goes into the step's own copy
                    value[path] = checked
                _check_range(checked, where, leaf)
        else:
            where = f"step.{_FIELD[name]}"
            checked = _bounded(value, where, bound, bounds)
            setattr(data, name, checked)
            if bound == "max_observation":  # obs and final_obs: of the observation space
                _check_range(checked, where, observation)
    lengths = data.episode_length
    if len(lengths) and lengths.min() < 1:
        raise CodecError(f"step.episode_length: {lengths.tolist()} holds a length below 1; a finished episode "
                         "took at least one step")
    return data


def check_action_mask(obs: np.ndarray, observation: SpaceSpec) -> None:
    """Refuse (``CodecError`` naming the slot) observations [k] whose action mask (``observation.mask``, the
    learner's spec: ``envs.spaces.with_action_mask``) allows no choice of some entry of a slot's action."""
    if not observation.mask:
        return
    empty = allowed_nothing(obs[observation.mask], observation.mask_groups)
    if empty is not None:
        slot, entry = empty
        which = f" for entry {entry} of the action" if len(observation.mask_groups) > 1 else ""
        raise CodecError(f"step.observation leaf {observation.mask!r}: env slot {slot} allows no action{which} "
                         "(every choice masked); an env must allow at least one action in every observation it "
                         "asks an action for")


def _bounded(value: np.ndarray, where: str, bound: str, bounds: StepBounds) -> np.ndarray:
    """``value``, or with ``bounds.sanitize`` a copy with its out-of-bound values replaced; else refused."""
    if not value.size or value.dtype.kind not in "fiu" or (value.dtype.kind != "f" and value.itemsize < 4):
        return value  # integers of 2 bytes or fewer cannot exceed a bound (they stay below 65,536)
    limit = getattr(bounds, bound)
    if value.min() >= -limit and value.max() <= limit:  # NaN fails both comparisons: min and max keep it
        return value
    if bounds.sanitize:
        replaced = np.clip(np.nan_to_num(value, nan=0.0, posinf=limit, neginf=-limit), -limit, limit)
        return replaced.astype(value.dtype, copy=False)
    finite = np.isfinite(value) if value.dtype.kind == "f" else np.ones(value.shape, bool)
    bad, huge = int(value.size - finite.sum()), int((np.abs(value[finite].astype(np.float64)) > limit).sum())
    problem = ", ".join(part for part in (bad and f"{bad} non-finite value(s) (NaN or inf)",
                                          huge and f"{huge} value(s) of magnitude over {limit:g}") if part)
    raise CodecError(f"{where}: {problem}; the bound is learner.{bound} = {limit:g}: fix the "
                     "environment, raise the bound, or start the learner with --sanitize to replace them")


def _check_range(value: np.ndarray, where: str, leaf: SpaceSpec) -> None:
    """Refuse values of a discrete leaf outside its space: the policy one-hot encodes them."""
    if not value.size or leaf.kind not in ("discrete", "multi_discrete", "multi_binary"):
        return
    top = {"discrete": leaf.n, "multi_binary": 2}.get(leaf.kind)
    if top is None:
        outside = value.min() < 0 or (value >= np.asarray(leaf.nvec).reshape(leaf.shape)).any()
    else:  # one bound for every value: two reductions, no temporary array
        outside = value.min() < 0 or value.max() >= top
    if outside:
        raise CodecError(f"{where}: values outside {leaf.describe()} (each must lie in [0, n)); fix the environment "
                         "or its observation space")


_FLOAT32, _FLOAT64, _INT64, _BOOL = (np.dtype(t) for t in (np.float32, np.float64, np.int64, np.bool_))


def _expect(array: np.ndarray, name: str, dtype: np.dtype, shape: tuple) -> None:
    """The checks ``codec.decode`` makes of a tensor, for an array that arrived some other way."""
    if array.dtype != dtype:
        raise CodecError(f"{name}: dtype {array.dtype.name} does not match the expected {dtype.name}")
    if array.shape != shape and (len(shape) != array.ndim or any(
            e is not None and e != g for e, g in zip(shape, array.shape))):
        shown = tuple("*" if e is None else e for e in shape)
        raise CodecError(f"{name}: shape {array.shape} does not match the expected {shown}")


def _check_final_index(final_index: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> None:
    """Refuse a ``final_index`` (already known to hold indices in [0, k)) that is not exactly the
    ascending list of the slots whose episode was truncated without terminating.

    Those are the episodes whose value the learner bootstraps from their final observation; a
    terminated episode has no value to bootstrap, and a slot that did not end has no final
    observation. Anything else would attach an observation to the wrong slot or bootstrap a
    truncated episode from nothing.
    """
    expected = np.flatnonzero(truncated & ~terminated)
    if len(expected) == len(final_index) and (not len(expected) or (expected == final_index).all()):
        return
    shown = final_index.tolist()
    seen: set[int] = set()
    for position, slot in enumerate(shown):
        if slot in seen:
            raise CodecError(f"step.final_index: {shown} names slot {slot} twice; send one final observation "
                             "per truncated slot")
        seen.add(slot)
        if position and slot < shown[position - 1]:
            raise CodecError(f"step.final_index: {shown} is not in ascending slot order; list the truncated "
                             "slots in ascending order, their final observations in the same order")
        if terminated[slot]:
            raise CodecError(f"step.final_index: {shown} names slot {slot}, which terminated; a terminated "
                             "episode has no value to bootstrap, so send no final observation for it")
        if not truncated[slot]:
            raise CodecError(f"step.final_index: {shown} names slot {slot}, which was not truncated; send final "
                             "observations only for slots with truncated set and terminated not set")
    absent = next(int(slot) for slot in expected if int(slot) not in seen)  # the only difference left
    raise CodecError(f"step.final_index: slot {absent} was truncated but has no final observation (final_index "
                     f"{shown}, truncated without terminating: {expected.tolist()}); send the last observation of "
                     "every truncated episode")


_FIELD = {"obs": "observation", "reward": "reward", "final_obs": "final_observation",
          "episode_return": "episode_return"}
# (StepData field, its StepBounds field: the learner's config key of the same name): what ``_check_values`` bounds.
_BOUNDED = (("obs", "max_observation"), ("reward", "max_reward"), ("final_obs", "max_observation"),
            ("episode_return", "max_reward"))
