"""Protocol messages for tests that speak to a learner as a client: a hello and a step with nothing finished."""

from __future__ import annotations

import functools
import uuid

import numpy as np

from lockstep.envs import SpaceSpec, env_spec
from lockstep.transport import PROTOCOL
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.messages import space_to_proto, step_to_proto

_spec = functools.cache(env_spec)  # one env made per id, not one per hello


def hello(actor_id: int = 0, num_envs: int = 2, run_id: str = "", env_id: str = "CartPole-v1",
          protocol: int = PROTOCOL, observation: SpaceSpec | None = None, action: SpaceSpec | None = None) -> pb.Hello:
    """An actor's hello: ``env_id``'s own spaces unless given, a fresh run id unless given."""
    spec = _spec(env_id)
    return pb.Hello(protocol=protocol, actor_id=actor_id, run_id=run_id or uuid.uuid4().hex, num_envs=num_envs,
                    env_id=env_id, observation_space=space_to_proto(observation or spec.observation),
                    action_space=space_to_proto(action or spec.action))


def empty_step(obs: np.ndarray, reward: np.ndarray | None = None) -> pb.Step:
    """A step of observations obs [k, *obs] (rewards zero unless given) in which no episode ended."""
    k = len(obs)
    reward = np.zeros(k, np.float32) if reward is None else reward
    return step_to_proto(obs, reward, np.zeros(k, bool), np.zeros(k, bool), np.zeros(0, np.int64),
                         np.zeros((0, *obs.shape[1:]), obs.dtype), np.zeros(0, np.float64), np.zeros(0, np.int64))
