"""The actor-learner protocol over real gRPC on loopback: handshake, validation, separate learner and actor
processes; and an interrupted ``lockstep train`` (actor processes over the same-host transport) leaves no actor."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import grpc
import numpy as np
import pytest
from conftest import lockstep_cmd
from processes import children
from protocol import empty_step, hello

from lockstep.envs import SpaceSpec, env_spec
from lockstep.transport import METHOD, PROTOCOL
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.generate import PROTO, generate
from lockstep.transport.grpc.client import Connection


def test_committed_generated_module_matches_the_proto(tmp_path):
    generated = generate(tmp_path)
    committed = PROTO.with_name("lockstep_pb2.py")
    assert generated.read_text() == committed.read_text(), "run `make proto` and commit the result"


@pytest.fixture
def learner(running_learner):
    """A strict CartPole learner (one actor, 128 steps per phase) serving real gRPC on a free loopback port."""
    return running_learner()


def test_actor_with_a_different_observation_space_is_refused_with_the_mismatch_named(learner):
    acrobot = env_spec("Acrobot-v1")
    with pytest.raises(grpc.RpcError) as err:
        Connection(learner.address, hello(observation=acrobot.observation), connect_timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "observation space" in err.value.details()
    assert "(6,)" in err.value.details() and "(4,)" in err.value.details()
    assert "CartPole-v1" in err.value.details()


def test_actor_speaking_another_protocol_version_is_refused_by_name(learner):
    with pytest.raises(grpc.RpcError) as err:
        Connection(learner.address, hello(protocol=PROTOCOL + 1), connect_timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert f"actor speaks protocol {PROTOCOL + 1}, the learner {PROTOCOL}" in err.value.details()


def test_actor_with_a_different_action_space_is_refused(learner):
    with pytest.raises(grpc.RpcError) as err:
        Connection(learner.address, hello(action=SpaceSpec("discrete", (), "int64", n=3)),
                   connect_timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "action space Discrete(3) does not match Discrete(2)" in err.value.details()


def test_first_message_must_be_a_hello(learner):
    channel = grpc.insecure_channel(learner.address)
    call = channel.stream_stream(METHOD, request_serializer=pb.ActorMessage.SerializeToString,
                                 response_deserializer=pb.LearnerMessage.FromString)
    responses = call(iter([pb.ActorMessage(step=empty_step(np.zeros((2, 4), np.float32)))]))
    with pytest.raises(grpc.RpcError) as err:
        next(responses)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "hello" in err.value.details()
    channel.close()


def test_wrong_observation_shape_in_a_step_is_rejected_by_name(learner):
    conn = Connection(learner.address, hello(), connect_timeout=10)
    with pytest.raises(grpc.RpcError) as err:
        conn.step(empty_step(np.zeros((2, 5), np.float32)), np.int64, ())
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "step.observation" in err.value.details() and "(2, 5)" in err.value.details()
    conn.close()


def test_the_same_run_id_on_a_second_connection_is_refused_while_the_first_is_connected(learner):
    """A new run id would replace the first connection (test_reconnect.py); the same one is a duplicate."""
    first = Connection(learner.address, hello(actor_id=7, run_id="test"), connect_timeout=10)
    with pytest.raises(grpc.RpcError) as err:
        Connection(learner.address, hello(actor_id=7, run_id="test"), connect_timeout=10)
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "actor id 7" in err.value.details() and "run id test" in err.value.details()
    first.close()


def test_actions_are_stamped_with_the_policy_version(learner):
    """Strict: every step of phase v is answered by version v, and each phase's training publishes v + 1."""
    T, phases = learner.learner.config.ppo.steps_per_env, 3
    rng = np.random.default_rng(0)
    conn = Connection(learner.address, hello(num_envs=3), connect_timeout=10)
    stamps = []
    try:
        # The last request completes phase phases - 1; it is answered once version `phases` is published.
        for _ in range(phases * T + 1):
            actions, version = conn.step(empty_step(rng.standard_normal((3, 4)).astype(np.float32)), np.int64, ())
            assert actions.shape == (3,) and set(actions.tolist()) <= {0, 1}
            stamps.append(version)
    finally:
        conn.close()
    assert stamps == [i // T for i in range(phases * T + 1)], Counter(stamps)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


@pytest.mark.slow
def test_separately_started_learner_and_actor_train_together(run_dir, free_port):
    learner = subprocess.Popen(
        [*lockstep_cmd(), "learner", "--env", "CartPole-v1", "--listen", f"127.0.0.1:{free_port}",
         "--min-actors", "1", "--total-steps", "2048", "--run-dir", str(run_dir.path), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        actor = subprocess.run(
            [*lockstep_cmd(), "actor", "--learner", f"127.0.0.1:{free_port}", "--env", "CartPole-v1",
             "--num-envs", "4", "--actor-id", "3"],
            check=False, capture_output=True, text=True, timeout=120)
        out, _ = learner.communicate(timeout=60)
    finally:
        learner.kill()
    assert actor.returncode == 0, actor.stderr
    assert "the learner finished training" in actor.stderr
    assert learner.returncode == 0, out
    summary = run_dir.summary()
    assert summary["env_steps"] == 2048 and summary["iterations"] == 4


@pytest.mark.slow
def test_interrupted_train_leaves_no_actor_processes(run_dir):
    proc = subprocess.Popen(
        [*lockstep_cmd(), "train", "--config", "cartpole-cleanrl", "--actors", "2", "--total-steps", "10000000",
         "--transport", "shm", "--run-dir", str(run_dir.path), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        actors: set[int] = set()
        while time.monotonic() < deadline and not run_dir.metrics_path.exists():
            time.sleep(0.2)
        time.sleep(1.0)
        actors = {pid for pid in children(proc.pid) if _alive(pid)}
        assert len(actors) >= 2, "expected the actor processes to be running"
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, out
    deadline = time.monotonic() + 30  # however loaded the machine: the actors notice their learner is gone
    while [pid for pid in actors if _alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in actors if _alive(pid)], f"orphaned actors: {actors}"
    assert (run_dir.checkpoints / "final.pt").exists()


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no thread count")


@pytest.mark.slow
def test_many_held_requests_cost_the_learner_no_threads(tmp_path, free_port):
    """64 actors whose requests are all held at once: the learner's thread count does not grow with them."""
    learner = subprocess.Popen(
        [*lockstep_cmd(), "learner", "--listen", f"127.0.0.1:{free_port}", "--min-actors", "100",
         "--run-dir", str(tmp_path / "run"), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "LOCKSTEP_TOKEN": "held"})
    connections = []
    try:
        first = Connection(f"127.0.0.1:{free_port}", hello(num_envs=1), connect_timeout=30, token="held")
        connections.append(first)
        baseline = _threads(learner.pid)
        for i in range(1, 65):
            conn = Connection(f"127.0.0.1:{free_port}", hello(actor_id=i, num_envs=1), connect_timeout=30,
                              token="held")
            connections.append(conn)
            # Below --min-actors no phase starts: every step is held on the learner.
            conn._outbox.put(pb.ActorMessage(step=empty_step(np.zeros((1, 4), np.float32))))
        time.sleep(1.0)
        held = _threads(learner.pid)
        assert held - baseline <= 4, (baseline, held)
    finally:
        for conn in connections:
            conn.close()
        learner.terminate()
        learner.wait(timeout=30)
