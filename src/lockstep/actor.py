"""The actor: steps a Gymnasium vector env and lets the learner choose every action.

It imports no torch: Gymnasium, numpy and gRPC only, so it starts fast and stays small.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

import grpc
import numpy as np

from lockstep import envs as envs_lib
from lockstep.transport import PROTOCOL
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.client import Connection, LearnerClosed
from lockstep.transport.messages import space_to_proto, step_to_proto

log = logging.getLogger("lockstep.actor")

# Statuses after which reconnecting cannot help: the learner refused this actor.
FATAL = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
         grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
         grpc.StatusCode.UNIMPLEMENTED}


@dataclass
class ActorOptions:
    learner: str = "127.0.0.1:50051"
    env: str = "CartPole-v1"
    num_envs: int = 1
    actor_id: int = 0
    connect_timeout: float = 60.0


def action_dtype(spec: envs_lib.SpaceSpec) -> np.dtype:
    """The dtype actions of this space travel in: int64 for Discrete, float32 for Box."""
    return np.dtype(np.int64) if spec.kind == "discrete" else np.dtype(np.float32)


def run(opts: ActorOptions) -> int:
    """Connect, act until the learner finishes training, return an exit code."""
    vec = envs_lib.make_vector_env(opts.env, opts.num_envs)
    obs_spec = envs_lib.SpaceSpec.from_space(vec.single_observation_space)
    act_spec = envs_lib.SpaceSpec.from_space(vec.single_action_space)
    hello = pb.Hello(protocol=PROTOCOL, actor_id=opts.actor_id, run_id=uuid.uuid4().hex, num_envs=opts.num_envs,
                     env_id=opts.env, observation_space=space_to_proto(obs_spec), action_space=space_to_proto(act_spec))
    try:
        conn = Connection(opts.learner, hello, connect_timeout=opts.connect_timeout)
    except ConnectionError as err:
        log.error("actor %d: %s", opts.actor_id, err)
        return 1
    except grpc.RpcError as err:
        log.error("actor %d: the learner refused the connection: %s", opts.actor_id, err.details())
        return 2
    seeds = envs_lib.env_seeds(conn.welcome.seed, opts.actor_id, opts.num_envs)
    log.info("actor %d: connected to %s (learner run %s)", opts.actor_id, opts.learner, conn.welcome.learner_run)
    try:
        _loop(conn, vec, seeds, act_spec)
    except LearnerClosed:
        log.info("actor %d: the learner finished training", opts.actor_id)
        return 0
    except grpc.RpcError as err:
        if err.code() in FATAL:
            log.error("actor %d: the learner refused a message: %s", opts.actor_id, err.details())
            return 2
        log.warning("actor %d: stream to the learner ended: %s %s", opts.actor_id, err.code().name, err.details())
        return 1
    finally:
        conn.close()
        vec.close()
    return 0


def _loop(conn: Connection, vec, seeds: list[int], act_spec: envs_lib.SpaceSpec) -> None:
    k = vec.num_envs
    obs, _ = vec.reset(seed=seeds)
    reward = np.zeros(k, np.float32)
    terminated = np.zeros(k, bool)
    truncated = np.zeros(k, bool)
    no_final = np.zeros((0, *obs.shape[1:]), obs.dtype)
    final_index, final_obs = np.zeros(0, np.int64), no_final
    ep_return, ep_length = np.zeros(0, np.float64), np.zeros(0, np.int64)
    dtype = action_dtype(act_spec)
    shape = act_spec.shape
    low = high = None
    if act_spec.kind == "box":
        low, high = act_spec.low.astype(np.float32), act_spec.high.astype(np.float32)
    while True:
        step = step_to_proto(obs, reward, terminated, truncated, final_index, final_obs, ep_return, ep_length)
        actions, _version = conn.step(step, dtype, shape)
        if low is not None:
            actions = np.clip(actions, low, high)  # the learner keeps the unclipped action
        obs, reward, terminated, truncated, info = vec.step(actions)
        reward = reward.astype(np.float32, copy=False)
        # Same-step autoreset: `obs` already holds reset observations where an episode ended;
        # a truncated episode's last observation is needed to bootstrap its value.
        ended_by_time = truncated & ~terminated
        if ended_by_time.any():
            final_index = np.flatnonzero(ended_by_time).astype(np.int64)
            final_obs = np.stack([info["final_obs"][i] for i in final_index]).astype(obs.dtype, copy=False)
        else:
            final_index, final_obs = np.zeros(0, np.int64), no_final
        if "episode" in info:
            done = info["_episode"]
            ep_return = np.asarray(info["episode"]["r"][done], np.float64)
            ep_length = np.asarray(info["episode"]["l"][done], np.int64)
        else:
            ep_return, ep_length = np.zeros(0, np.float64), np.zeros(0, np.int64)


def run_with_retries(opts: ActorOptions, attempts: int = 1, backoff_s: float = 1.0) -> int:
    """Run, reconnecting after a lost stream (not after a refusal) up to ``attempts`` times."""
    code = 1
    for attempt in range(attempts):
        code = run(opts)
        if code in (0, 2):
            return code
        time.sleep(backoff_s * (2 ** attempt))
    return code


def process_main(opts: ActorOptions, log_level: int = logging.INFO) -> None:
    """Entry point of a local actor process started by ``lockstep train`` (spawned, never forked)."""
    _die_with_parent()
    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    raise SystemExit(run(opts))


def _die_with_parent() -> None:
    """On Linux, ask the kernel to end this process when its parent dies, so no actor is orphaned."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass
