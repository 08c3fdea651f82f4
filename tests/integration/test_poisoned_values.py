"""Finite extremes sent by real clients over real gRPC (issue 20, item 5): a float32 reward of 3e38 and a
float64 observation of 1e39 are refused by name while a good actor trains on; a reward the bound lets
through (raised to 1e38) but whose square overflows costs gradient steps, skipped and counted in
metrics.csv, never the parameters.

``cartpole64`` below (loaded by the learner and the actor as ``test_poisoned_values:cartpole64``) is
CartPole with float64 observations, as some environments have: the learner casts them to float32.
"""

from __future__ import annotations

import threading

import grpc
import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.wrappers import TransformObservation
from protocol import empty_step, hello

from lockstep import config as config_lib
from lockstep.actor import EnvLoop
from lockstep.envs import SpaceSpec, env_seeds, make_vector_env
from lockstep.learner import checkpoint
from lockstep.learner.wiring import Learner
from lockstep.observe.run_dir import RunDir
from lockstep.transport import METHOD
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.grpc.client import Connection

pytestmark = pytest.mark.slow

ENV = f"{__name__}:cartpole64"
T = 8


def cartpole64(**kwargs) -> gym.Env:
    env = gym.make("CartPole-v1", **kwargs)
    space = env.observation_space
    wide = gym.spaces.Box(space.low.astype(np.float64), space.high.astype(np.float64), dtype=np.float64)
    return TransformObservation(env, lambda obs: obs.astype(np.float64), wide)


class _Actor:
    """A well-behaved actor: the actor's own ``EnvLoop`` over a real vector env, on a real connection."""

    def __init__(self, address: str, actor_id: int = 0, num_envs: int = 2) -> None:
        self.vec = make_vector_env(ENV, num_envs)
        self.loop = EnvLoop(self.vec, SpaceSpec.from_space(self.vec.single_action_space))
        self.conn = Connection(address, hello(actor_id, num_envs, env_id=ENV), connect_timeout=30)
        self.loop.reset(env_seeds(self.conn.welcome.seed, actor_id, num_envs))

    def steps(self, n: int) -> int:
        """Take ``n`` steps; return the policy version of the last action."""
        version = -1
        for _ in range(n):
            actions, version = self.conn.act(self.loop.outcome())
            self.loop.step(actions)
        return version

    def close(self) -> None:
        self.conn.close()
        self.vec.close()


class _Running:
    def __init__(self, run_dir, env: str, **learner_fields) -> None:
        config = config_lib.Config()
        config.env.id, config.actors.count, config.learner.min_actors = env, 1, 1
        config.ppo.steps_per_env, config.ppo.total_steps = T, 10**9
        config.run.progress = False
        for key, value in learner_fields.items():
            setattr(config.learner, key, value)
        self.run_dir = run_dir
        self.learner = Learner(config, run_dir)
        self.thread = threading.Thread(target=self.learner.serve)
        self.thread.start()
        self.address = f"127.0.0.1:{self.learner.wait_ready(timeout=30)}"

    def close(self) -> None:
        self.learner.stop()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()


def _refusal(address: str, step: pb.Step) -> grpc.RpcError:
    """A hand-made client (actor 7): its hello and ``step`` on a raw stream; the error that ends it.

    The deadline only bounds a learner that wrongly accepts the step: the request of an actor that
    joins mid-phase is held until the next version, which the test does not let come meanwhile.
    """
    with grpc.insecure_channel(address) as channel:
        call = channel.stream_stream(METHOD, request_serializer=pb.ActorMessage.SerializeToString,
                                     response_deserializer=pb.LearnerMessage.FromString)
        greeting = hello(actor_id=7, num_envs=2, env_id=ENV)
        replies = call(iter([pb.ActorMessage(hello=greeting), pb.ActorMessage(step=step)]), timeout=30)
        try:
            kinds = [reply.WhichOneof("kind") for reply in replies]
        except grpc.RpcError as err:
            return err
    raise AssertionError(f"the learner answered {kinds} and accepted the step")


def _finite(state: dict) -> bool:
    return all(torch.isfinite(p).all() for p in state["trainer"]["model"].values())


def test_a_huge_finite_reward_and_a_float64_observation_of_1e39_are_refused_by_name(tmp_path):
    running = _Running(tmp_path / "run", ENV)
    good = _Actor(running.address)
    try:
        assert good.steps(2 * T + 1) == 2

        huge_obs = np.zeros((2, 4))
        huge_obs[1, 2] = 1e39  # finite as float64; inf once the learner casts it to float32
        refused = _refusal(running.address, empty_step(huge_obs))
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT and "actor 7" in refused.details()
        assert "step.observation: 1 value(s) of magnitude over 1e+10" in refused.details()
        assert "learner.max_observation" in refused.details()

        refused = _refusal(running.address, empty_step(np.zeros((2, 4)), np.array([0.0, 3e38], np.float32)))
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT and "step.reward" in refused.details()
        assert "learner.max_reward" in refused.details()

        assert good.steps(2 * T) == 4  # the good actor trains on
    finally:
        good.close()
        running.close()
    final = checkpoint.load(tmp_path / "run" / "checkpoints" / "final.pt")
    assert final["trainer"]["iteration"] >= 3 and _finite(final)


def test_a_reward_whose_square_overflows_skips_gradient_steps_counted_in_the_metrics(tmp_path):
    running = _Running(tmp_path / "run", "CartPole-v1", max_reward=1e38)  # the bound raised as far as it goes
    conn = Connection(running.address, hello(actor_id=0, num_envs=2), connect_timeout=30)
    try:
        version = -1
        for _ in range(2 * T + 1):  # two phases of rewards of 1e38: (1e38)^2 is inf in float32
            _, version = conn.step(empty_step(np.zeros((2, 4), np.float32), np.full(2, 1e38, np.float32)),
                                   np.int64, ())
        assert version == 2  # training went on: both phases were trained (their steps skipped), versions published
    finally:
        conn.close()
        running.close()
    rows = RunDir(tmp_path / "run").metrics()
    assert len(rows) == 2 and all(row["skipped_updates"] > 0 for row in rows)
    assert RunDir(tmp_path / "run").summary()["skipped_updates"] == sum(row["skipped_updates"] for row in rows)
    assert all(torch.isfinite(p).all() for p in running.learner.trainer.model.parameters())
    assert _finite(checkpoint.load(tmp_path / "run" / "checkpoints" / "final.pt"))
