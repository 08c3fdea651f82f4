"""Conversions between protocol messages and plain Python/numpy values, with validation."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lockstep.envs import SpaceSpec
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.codec import CodecError, decode, encode

_KINDS = {"discrete": pb.Space.DISCRETE, "box": pb.Space.BOX}


def space_to_proto(spec: SpaceSpec) -> pb.Space:
    msg = pb.Space(kind=_KINDS[spec.kind], shape=spec.shape, dtype=spec.dtype, n=spec.n)
    if spec.kind == "box":
        msg.low.CopyFrom(encode(spec.low))
        msg.high.CopyFrom(encode(spec.high))
    return msg


def space_from_proto(msg: pb.Space, name: str) -> SpaceSpec:
    if msg.kind == pb.Space.DISCRETE:
        if msg.n < 1:
            raise CodecError(f"{name}: a Discrete space needs n >= 1, got {msg.n}")
        return SpaceSpec("discrete", (), msg.dtype, n=int(msg.n))
    if msg.kind == pb.Space.BOX:
        shape = tuple(int(d) for d in msg.shape)
        low = decode(msg.low, f"{name}.low", shape=shape)
        high = decode(msg.high, f"{name}.high", shape=shape)
        return SpaceSpec("box", shape, msg.dtype, low=low, high=high)
    raise CodecError(f"{name}: unknown space kind {msg.kind}; expected DISCRETE or BOX")


@dataclass(frozen=True)
class HelloInfo:
    protocol: int
    actor_id: int
    run_id: str
    num_envs: int
    env_id: str
    observation: SpaceSpec
    action: SpaceSpec


def hello_from_proto(msg: pb.Hello) -> HelloInfo:
    return HelloInfo(
        protocol=int(msg.protocol), actor_id=int(msg.actor_id), run_id=msg.run_id,
        num_envs=int(msg.num_envs), env_id=msg.env_id,
        observation=space_from_proto(msg.observation_space, "hello.observation_space"),
        action=space_from_proto(msg.action_space, "hello.action_space"),
    )


@dataclass
class StepData:
    """One actor step, decoded and checked against the actor's spec. Arrays are read-only views."""

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
    return pb.Step(
        observation=encode(obs), reward=encode(reward), terminated=encode(terminated),
        truncated=encode(truncated), final_index=encode(final_index), final_observation=encode(final_obs),
        episode_return=encode(episode_return), episode_length=encode(episode_length),
    )


def step_from_proto(msg: pb.Step, num_envs: int, observation: SpaceSpec, sanitize: bool = False) -> StepData:
    """Decode and validate a Step. Non-finite observations or rewards are an error, or,
    with ``sanitize``, replaced (NaN by 0, infinities by the dtype's extremes)."""
    k, obs_shape, obs_dtype = num_envs, observation.shape, observation.dtype
    obs = decode(msg.observation, "step.observation", obs_dtype, (k, *obs_shape))
    final_index = decode(msg.final_index, "step.final_index", np.int64, (None,))
    m = len(final_index)
    if m and (final_index.min() < 0 or final_index.max() >= k):
        raise CodecError(f"step.final_index: {final_index.tolist()} are not env indices in [0, {k})")
    terminated = decode(msg.terminated, "step.terminated", np.bool_, (k,))
    truncated = decode(msg.truncated, "step.truncated", np.bool_, (k,))
    _check_final_index(final_index, terminated, truncated)
    episode_return = decode(msg.episode_return, "step.episode_return", np.float64, (None,))
    data = StepData(
        obs=obs,
        reward=decode(msg.reward, "step.reward", np.float32, (k,)),
        terminated=terminated,
        truncated=truncated,
        final_index=final_index,
        final_obs=decode(msg.final_observation, "step.final_observation", obs_dtype, (m, *obs_shape)),
        episode_return=episode_return,
        episode_length=decode(msg.episode_length, "step.episode_length", np.int64, (len(episode_return),)),
    )
    for name in ("obs", "reward", "final_obs"):
        value = getattr(data, name)
        if value.dtype.kind == "f" and not np.isfinite(value).all():
            if not sanitize:
                bad = int(value.size - np.isfinite(value).sum())
                raise CodecError(f"step.{_FIELD[name]}: {bad} non-finite value(s) (NaN or inf); fix the environment, "
                                 "or start the learner with --sanitize to replace them")
            setattr(data, name, np.nan_to_num(value))
    return data


def _check_final_index(final_index: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> None:
    """Refuse a ``final_index`` (already known to hold indices in [0, k)) that is not exactly the
    ascending list of the slots whose episode was truncated without terminating.

    Those are the episodes whose value the learner bootstraps from their final observation; a
    terminated episode has no value to bootstrap, and a slot that did not end has no final
    observation. Anything else would attach an observation to the wrong slot or bootstrap a
    truncated episode from nothing.
    """
    expected = np.flatnonzero(truncated & ~terminated)
    if np.array_equal(final_index, expected):
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


_FIELD = {"obs": "observation", "reward": "reward", "final_obs": "final_observation"}
