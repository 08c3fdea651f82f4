"""Environments: building Gymnasium vector envs and describing their spaces.

Imported by the actor, so it must not import torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode


@dataclass(frozen=True)
class SpaceSpec:
    """What the learner and the actor must agree on about one space."""

    kind: str  # "discrete" or "box"
    shape: tuple[int, ...]
    dtype: str
    n: int = 0  # discrete only
    low: np.ndarray | None = field(default=None, compare=False)  # box only
    high: np.ndarray | None = field(default=None, compare=False)  # box only

    @classmethod
    def from_space(cls, space: gym.Space) -> SpaceSpec:
        if isinstance(space, gym.spaces.Discrete):
            if int(space.start) != 0:
                raise ValueError(f"Discrete spaces must start at 0, got start={space.start}")
            return cls("discrete", (), np.dtype(space.dtype).name, n=int(space.n))
        if isinstance(space, gym.spaces.Box):
            return cls(
                "box", tuple(space.shape), np.dtype(space.dtype).name,
                low=np.asarray(space.low), high=np.asarray(space.high),
            )
        raise ValueError(f"unsupported space {space}: lockstep handles Discrete and Box spaces")

    @property
    def discrete(self) -> bool:
        return self.kind == "discrete"

    @property
    def action_dtype(self) -> np.dtype:
        """The dtype actions from this space travel and are stored in: int64 for Discrete, float32 for Box."""
        return np.dtype(np.int64) if self.discrete else np.dtype(np.float32)

    @property
    def element_shape(self) -> tuple[int, ...]:
        """The shape of one value: () for Discrete, the Box's shape otherwise."""
        return () if self.discrete else tuple(self.shape)

    def describe(self) -> str:
        if self.kind == "discrete":
            return f"Discrete({self.n})"
        return f"Box(shape={self.shape}, dtype={self.dtype})"

    def mismatch(self, other: SpaceSpec) -> str | None:
        """A description of how ``other`` differs from this spec, or None if they agree."""
        if (self.kind, self.shape, self.dtype, self.n) != (other.kind, other.shape, other.dtype, other.n):
            return f"{other.describe()} does not match {self.describe()}"
        if self.kind == "box" and not (
            np.array_equal(self.low, other.low) and np.array_equal(self.high, other.high)
        ):
            return (f"bounds of {other.describe()} differ: low {other.low} high {other.high}, "
                    f"expected low {self.low} high {self.high}")
        return None


@dataclass(frozen=True)
class EnvSpec:
    env_id: str
    observation: SpaceSpec
    action: SpaceSpec


def resolve_env(env_id: str) -> Callable[..., gym.Env]:
    """Return a factory for ``env_id``: a registered Gymnasium id or ``package.module:callable``."""
    module_name, _, attr = env_id.partition(":")
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
    if ":" not in env_id and env_id not in gym.registry:
        raise ValueError(
            f"unknown environment {env_id!r}: not a registered Gymnasium id and not a "
            "'package.module:callable' entry point"
        )
    return lambda **kwargs: gym.make(env_id, **kwargs)


def reward_threshold(env_id: str) -> float | None:
    """The return at which ``env_id`` counts as solved: the ``reward_threshold`` of its Gymnasium
    registration (CartPole-v1: 475.0), or None for an id without one, an unregistered id and a
    ``package.module:callable`` entry point."""
    module_name, _, name = env_id.partition(":")
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


def make_vector_env(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    """A synchronous vector env that resets finished episodes in the same step.

    Same-step autoreset means every observation sent to the learner is one to act
    on, and a truncated episode's last observation arrives in ``infos["final_obs"]``.
    """
    if num_envs < 1:
        raise ValueError(f"num_envs must be at least 1, got {num_envs}")
    factory = resolve_env(env_id)
    envs = gym.vector.SyncVectorEnv(
        [factory for _ in range(num_envs)], autoreset_mode=AutoresetMode.SAME_STEP
    )
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)


def env_spec(env_id: str) -> EnvSpec:
    """The spaces of one environment of ``env_id``."""
    env: Any = resolve_env(env_id)()
    try:
        return EnvSpec(env_id, SpaceSpec.from_space(env.observation_space), SpaceSpec.from_space(env.action_space))
    finally:
        env.close()


def env_seeds(run_seed: int, actor_id: int, num_envs: int) -> list[int]:
    """Distinct, reproducible reset seeds for the envs of one actor."""
    seq = np.random.SeedSequence([run_seed, actor_id])
    return [int(s) for s in seq.generate_state(num_envs, dtype=np.uint32)]
