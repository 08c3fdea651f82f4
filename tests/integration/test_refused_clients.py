"""A client's bad hello or step is refused by name and changes nothing else: against a real learner serving
real gRPC and shared memory, while an honest actor trains beside the refused clients.

- An observation outside its discrete space (a flat Discrete one: FrozenLake's cell index) is refused, in
  ``observation`` and in ``final_observation``, with ``learner.sanitize`` or without (sanitizing never clips a
  discrete value into its space); before, it reached the forward pass and ended the run.
- A hello is accepted whole or refused with no trace: with several policies, a hello whose slots are not whole
  envs of the env's agents left a session behind that the next hello of its id tripped over (the run ended),
  and one that reused a live actor's id evicted that actor.
- A hello's agent -> policy mapping must be the learner's: two policies of the same spaces give the same slot
  spaces whichever agents they act for, so a swapped mapping was accepted and both policies trained on the
  other's agents' data.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import learner_config

from lockstep import config as config_lib
from lockstep import envs as envs_lib
from lockstep.actor import EnvLoop
from lockstep.transport import PROTOCOL
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.grpc.client import Connection, LearnerRefused
from lockstep.transport.messages import StepData, space_to_proto
from lockstep.transport.shm.client import LocalConnection

pytestmark = pytest.mark.slow

T = 8  # steps per env per phase
KINDS = "pettingzoo:lockstep.envs.kinds"  # scouts: Box(3) -> Discrete(3); the pilot: Box(5) -> Discrete(2)
POLICIES = {"scouts": {"agents": ["scout_*"]}, "pilots": {"agents": ["pilot_*"]}}


class HonestActor:
    """The actor's own ``EnvLoop`` over a real vector env, on a real gRPC connection, stepped by the test."""

    def __init__(self, address: str, env_id: str, num_envs: int, actor_id: int = 0, kwargs: dict | None = None):
        self.vec = envs_lib.make_vector_env(env_id, num_envs, kwargs)
        self.hello = hello_of(self.vec, env_id, actor_id)
        obs_spec = envs_lib.SpaceSpec.from_space(self.vec.single_observation_space)
        self.loop = EnvLoop(self.vec, envs_lib.action_spec(self.vec.single_action_space), obs_spec)
        self.conn = Connection.open(address, self.hello, connect_timeout=60)
        self.loop.reset(envs_lib.env_seeds(self.conn.welcome.seed, actor_id, self.vec.num_envs))
        self.version = -1

    def steps(self, n: int) -> int:
        """Take ``n`` steps; the policy version of the last action."""
        for _ in range(n):
            actions, self.version = self.conn.act(self.loop.outcome())
            self.loop.step(actions)
        return self.version

    def close(self) -> None:
        self.conn.close()
        self.vec.close()


def hello_of(vec, env_id: str, actor_id: int, run_id: str = "") -> pb.Hello:
    """The hello the actor sends for its vector env ``vec``."""
    obs_spec = envs_lib.SpaceSpec.from_space(vec.single_observation_space)
    return pb.Hello(protocol=PROTOCOL, actor_id=actor_id, run_id=run_id or f"run-{actor_id}-{time.monotonic_ns()}",
                    num_envs=vec.num_envs, env_id=env_id, observation_space=space_to_proto(obs_spec),
                    action_space=space_to_proto(envs_lib.action_spec(vec.single_action_space)),
                    agent_policies=envs_lib.pettingzoo.agent_policies(vec))


@pytest.fixture
def honest(request):
    """Honest actors a test starts (``honest(address, env_id, num_envs, ...)``), closed when it ends."""
    started: list[HonestActor] = []

    def start(*args, **kwargs) -> HonestActor:
        started.append(HonestActor(*args, **kwargs))
        return started[-1]

    yield start
    for actor in started:
        actor.close()


def refused_while_training(actor: HonestActor, send) -> LearnerRefused:
    """Run ``send`` (a client's hello and step, which the learner must refuse) while ``actor`` steps on:
    a request that joins mid-phase is held until the phase the honest actor completes."""
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(send)
        deadline = time.monotonic() + 120
        while not future.done() and time.monotonic() < deadline:
            actor.steps(1)
        with pytest.raises(LearnerRefused) as refused:
            future.result(timeout=60)
    return refused.value


def _frozen_lake_step(obs: list[int], final_obs: list[int] = ()) -> StepData:
    """A FrozenLake step of two envs; with ``final_obs``, env 0's episode was truncated there."""
    truncated = np.array([bool(final_obs), False])
    return StepData(np.array(obs, np.int64), np.zeros(2, np.float32), np.zeros(2, bool), truncated,
                    np.arange(len(final_obs), dtype=np.int64), np.array(final_obs, np.int64),
                    np.zeros(0, np.float64), np.zeros(0, np.int64))


@pytest.mark.parametrize("sanitize", [False, True])
def test_a_flat_discrete_observation_out_of_its_range_is_refused_by_name_and_the_run_trains_on(
        running_learner, honest, sanitize):
    learner = running_learner({"env.id": "FrozenLake-v1", "ppo.steps_per_env": T, "learner.sanitize": sanitize})
    actor = honest(learner.address, "FrozenLake-v1", 2)
    assert actor.steps(T + 1) == 1
    rogue_vec = envs_lib.make_vector_env("FrozenLake-v1", 2)
    steps = [("step.observation", _frozen_lake_step([99, 0])), ("step.observation", _frozen_lake_step([3, -1])),
             ("step.final_observation", _frozen_lake_step([0, 0], final_obs=[16]))]
    try:
        for transport, (address, open_) in enumerate([(learner.address, Connection.open),
                                                      (learner.local_address, LocalConnection)]):
            for n, (field, step) in enumerate(steps):
                actor_id = 10 + 10 * transport + n
                greeting = hello_of(rogue_vec, "FrozenLake-v1", actor_id)

                def send(open_=open_, address=address, greeting=greeting, step=step):
                    conn = open_(address, greeting, 60)
                    try:
                        conn.act(step)
                    finally:
                        conn.close()

                refused = refused_while_training(actor, send)
                assert refused.code == "INVALID_ARGUMENT", refused
                assert f"actor {actor_id}: {field}: values outside Discrete(16)" in refused.message, refused.message
    finally:
        rogue_vec.close()
    before = actor.version
    assert actor.steps(2 * T) >= before + 2  # the run trains on, with the honest actor alone
    assert learner.thread.is_alive()
    assert learner.learner.sessions.actor_ids == [0]


def _several_policies(policies: dict = POLICIES) -> config_lib.Config:
    config = learner_config({"env.id": KINDS, "ppo.steps_per_env": T, "model.hidden": [16], "learner.device": "cpu"})
    config.policies = config_lib.from_dict({"policies": policies}).policies
    return config


def _refusal(connect) -> LearnerRefused:
    with pytest.raises(LearnerRefused) as refused:
        connect().close()
    return refused.value


def _transports(learner) -> list:
    return [(learner.address, Connection.open), (learner.local_address, LocalConnection)]


def test_a_refused_hello_changes_nothing_and_a_later_one_of_its_id_is_served(running_learner, honest):
    config = _several_policies()
    learner = running_learner(config=config)
    actor = honest(learner.address, KINDS, 1, actor_id=0, kwargs=config.vector_kwargs())  # one env: 3 slots
    assert actor.steps(T + 1) == 1
    for actor_id in (5, 0):  # an id of no one, then the honest actor's own (with a new run id)
        for address, open_ in _transports(learner) * 2:  # each twice: the second finds what the first left
            greeting = hello_of(actor.vec, KINDS, actor_id)
            greeting.num_envs = 2
            refused = _refusal(lambda open_=open_, address=address, greeting=greeting: open_(address, greeting, 60))
            assert refused.code == "INVALID_ARGUMENT", refused
            assert f"actor {actor_id}: 2 slots are not whole envs of 3 agents" in refused.message, refused.message
            assert learner.learner.sessions.actor_ids == [0]
    before = actor.version
    assert actor.steps(2 * T) >= before + 2  # never replaced: it trains on
    for address, open_ in _transports(learner):  # the refused id is served as if nothing had come before
        open_(address, hello_of(actor.vec, KINDS, 5), 60).close()
    before = actor.version
    assert actor.steps(2 * T) >= before + 2
    assert learner.thread.is_alive()
    assert learner.learner.sessions.counters.dropped_transitions == 0  # no session of actor 0 was ever ended


def test_a_hello_whose_agents_act_for_other_policies_of_the_same_spaces_is_refused_by_name(running_learner, honest):
    split = {"a": {"agents": ["scout_0"]}, "b": {"agents": ["scout_1"]}, "p": {"agents": ["pilot_*"]}}
    swapped = {"a": {"agents": ["scout_1"]}, "b": {"agents": ["scout_0"]}, "p": {"agents": ["pilot_*"]}}
    config = _several_policies(split)
    learner = running_learner(config=config)
    actor = honest(learner.address, KINDS, 1, actor_id=0, kwargs=config.vector_kwargs())
    assert actor.steps(T + 1) == 1
    wrong = envs_lib.make_vector_env(KINDS, 1, _several_policies(swapped).vector_kwargs())
    try:
        greeting = hello_of(wrong, KINDS, 3)
        assert greeting.observation_space == actor.hello.observation_space  # the spaces cannot tell them apart
        assert greeting.action_space == actor.hello.action_space
        silent = hello_of(wrong, KINDS, 4)
        silent.ClearField("agent_policies")  # an actor of an older version, or of another language
        for address, open_ in _transports(learner):
            refused = _refusal(lambda open_=open_, address=address: open_(address, greeting, 60))
            assert refused.code == "INVALID_ARGUMENT", refused
            assert ("agent scout_0 acts for policy 'b' in this actor, for 'a' on the learner; agent scout_1 acts for "
                    "policy 'a' in this actor, for 'b' on the learner") in refused.message, refused.message
            assert "lockstep actor --policies '{a: [scout_0], b: [scout_1], p: [pilot_0]}'" in refused.message
            refused = _refusal(lambda open_=open_, address=address: open_(address, silent, 60))
            assert refused.code == "INVALID_ARGUMENT", refused
            assert "maps no agent to a policy" in refused.message and "--policies" in refused.message
    finally:
        wrong.close()
    before = actor.version
    assert actor.steps(2 * T) >= before + 2  # the actor with the learner's mapping trains on
    assert learner.learner.sessions.actor_ids == [0]


def test_a_mapping_sent_to_a_learner_of_one_policy_is_refused(running_learner, honest):
    learner = running_learner({"ppo.steps_per_env": T})
    actor = honest(learner.address, "CartPole-v1", 2)
    greeting = hello_of(actor.vec, "CartPole-v1", 1)
    greeting.agent_policies["cart"] = "mine"
    refused = _refusal(lambda: Connection.open(learner.address, greeting, 60))
    assert refused.code == "INVALID_ARGUMENT", refused
    assert "start the actor without --policies" in refused.message, refused.message
