"""Final observations over real gRPC: a Step whose ``final_index`` disagrees with its done flags
is refused with INVALID_ARGUMENT naming the problem, while a well-behaved actor whose episodes
are truncated (and so sends final observations) keeps being served and trained on.

The environment is CartPole with a 6-step time limit (``short_cartpole`` below, loaded by the
learner and the actor as ``test_step_validation:short_cartpole``), so truncations are frequent.
"""

from __future__ import annotations

import grpc
import gymnasium as gym
import numpy as np
import pytest
from protocol import hello

from lockstep.actor import EnvLoop
from lockstep.envs import SpaceSpec, env_seeds, make_vector_env
from lockstep.transport import METHOD
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.grpc.client import Connection
from lockstep.transport.messages import step_from_proto, step_message, step_to_proto

pytestmark = pytest.mark.slow

ENV = f"{__name__}:short_cartpole"
T = 8  # steps per env per policy version


def short_cartpole(**kwargs) -> gym.Env:
    """CartPole whose episodes are truncated after 6 steps unless they terminate first."""
    return gym.make("CartPole-v1", max_episode_steps=6, **kwargs)


class _Actor:
    """A well-behaved actor: the actor's own ``EnvLoop`` over a real vector env, on a real connection."""

    def __init__(self, address: str, actor_id: int, num_envs: int) -> None:
        self.vec = make_vector_env(ENV, num_envs)
        self.loop = EnvLoop(self.vec, SpaceSpec.from_space(self.vec.single_action_space))
        self.conn = Connection(address, hello(actor_id, num_envs, env_id=ENV), connect_timeout=30)
        self.loop.reset(env_seeds(self.conn.welcome.seed, actor_id, num_envs))
        self.final_observations = 0

    def steps(self, n: int) -> int:
        """Take ``n`` steps; return the policy version of the last action."""
        version = -1
        for _ in range(n):
            self.final_observations += len(self.loop.final_index)
            message = step_message(self.loop.outcome())
            spec = self.loop.act_spec
            actions, version = self.conn.step(message, spec.action_dtype, spec.element_shape)
            self.loop.step(actions)
        return version

    def close(self) -> None:
        self.conn.close()
        self.vec.close()


@pytest.fixture
def learner(running_learner):
    """A strict learner of the short CartPole, one actor, T steps per phase, on real gRPC."""
    return running_learner({"env.id": ENV, "ppo.steps_per_env": T})


def _rogue(address: str, greeting: pb.Hello, step: pb.Step) -> grpc.RpcError:
    """A hand-made client: the hello and one step on a raw stream; the error that ends it.

    The deadline only bounds a learner that wrongly accepts the step: a request of an actor
    that joins mid-phase is held until the next version, which this test never lets come.
    """
    with grpc.insecure_channel(address) as channel:
        call = channel.stream_stream(METHOD, request_serializer=pb.ActorMessage.SerializeToString,
                                     response_deserializer=pb.LearnerMessage.FromString)
        replies = call(iter([pb.ActorMessage(hello=greeting), pb.ActorMessage(step=step)]), timeout=30)
        try:
            kinds = [reply.WhichOneof("kind") for reply in replies]
        except grpc.RpcError as err:
            return err
    raise AssertionError(f"the learner answered {kinds} and accepted the step")


def test_the_actor_sends_final_observations_for_exactly_the_truncated_slots():
    vec = make_vector_env(ENV, 3)
    loop = EnvLoop(vec, SpaceSpec.from_space(vec.single_action_space))
    obs_spec = SpaceSpec.from_space(vec.single_observation_space)
    loop.reset(env_seeds(1, 0, 3))
    truncations = 0
    try:
        for step in range(60):
            loop.step(np.array([step % 2, 0, 1], np.int64))
            # the learner's validation, final_index included
            data = step_from_proto(step_message(loop.outcome()), 3, obs_spec)
            assert data.final_index.tolist() == np.flatnonzero(data.truncated & ~data.terminated).tolist()
            truncations += len(data.final_index)
    finally:
        vec.close()
    assert truncations > 0


@pytest.mark.parametrize("terminated, truncated, final_index, problem", [
    ([0, 0], [0, 0], [1], "names slot 1, which was not truncated"),
    ([0, 0], [0, 1], [], "slot 1 was truncated but has no final observation"),
    ([0, 0], [1, 0], [0, 0], "names slot 0 twice"),
])
def test_a_step_with_a_bad_final_index_is_refused_while_a_good_actor_trains_on(learner, run_dir, terminated,
                                                                               truncated, final_index, problem):
    address = learner.address
    good = _Actor(address, actor_id=0, num_envs=2)
    try:
        # a strict phase of T steps per version: the step after 2 * T acts with version 2
        assert good.steps(2 * T + 1) == 2

        m = len(final_index)
        bad = step_to_proto(np.zeros((2, 4), np.float32), np.zeros(2, np.float32), np.array(terminated, bool),
                            np.array(truncated, bool), np.array(final_index, np.int64), np.zeros((m, 4), np.float32),
                            np.zeros(0, np.float64), np.zeros(0, np.int64))
        refused = _rogue(address, hello(actor_id=7, num_envs=2, env_id=ENV), bad)
        assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.details()
        assert "actor 7" in refused.details() and "step.final_index" in refused.details()
        assert problem in refused.details()

        # the learner keeps serving and training the good actor, truncated episodes and all
        assert good.steps(2 * T) == 4
        assert good.final_observations > 0
    finally:
        good.close()
    assert len(run_dir.metrics()) >= 3  # iterations 1-3 are recorded before version 4 can serve
