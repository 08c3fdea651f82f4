"""Authentication, TLS and malformed input, against a real learner over real gRPC.

A rogue client sends each kind of bad input while a well-behaved actor process
keeps training; every rogue stream gets a status that names its problem, and
the learner trains on regardless.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protocol import empty_step, hello

from lockstep.envs import SpaceSpec, env_spec
from lockstep.transport import METHOD
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.codec import CodecError
from lockstep.transport.grpc.client import Connection
from lockstep.transport.grpc.security import SecurityError, check_listen
from lockstep.transport.messages import StepBounds, step_from_proto

CARTPOLE = env_spec("CartPole-v1")


STRICT = {"ppo.steps_per_env": 16, "learner.min_actors": 1}  # the learner these tests reach over real gRPC


@pytest.fixture
def learner(running_learner):
    return running_learner(STRICT)


def _raw_call(address: str, payloads: list[bytes], metadata=()):
    """Send raw bytes as stream messages (no serializer), return the error of the first reply."""
    channel = grpc.insecure_channel(address)
    call = channel.stream_stream(METHOD, request_serializer=lambda b: b,
                                 response_deserializer=pb.LearnerMessage.FromString)
    responses = call(iter(payloads), metadata=metadata)
    try:
        for _ in range(len(payloads) + 1):
            next(responses)
    except grpc.RpcError as err:
        return err
    finally:
        channel.close()
    return None


def _rogue(address: str, *steps: pb.Step, greeting: pb.Hello | None = None) -> grpc.RpcError:
    conn = Connection(address, greeting or hello(actor_id=99), connect_timeout=10)
    try:
        for step in steps:
            conn.step(step, np.int64, ())
    except grpc.RpcError as err:
        return err
    finally:
        conn.close()
    raise AssertionError("the learner accepted every step")


# -- malformed input --------------------------------------------------------------------


def test_garbage_bytes_first_are_refused_as_not_a_hello(learner):
    err = _raw_call(learner.address, [b"\xff\xff\xff garbage \x00\x01"])
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not a protobuf message" in err.details()


def test_garbage_bytes_after_hello_are_invalid_argument(learner):
    first = pb.ActorMessage(hello=hello(actor_id=98)).SerializeToString()
    err = _raw_call(learner.address, [first, b"\x0a\xff\xff\xff\xff\xff\xff"])
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid ActorMessage protobuf" in err.details()


def test_nan_observation_is_refused_by_default(learner):
    obs = np.zeros((2, 4), np.float32)
    obs[1, 2] = np.nan
    err = _rogue(learner.address, empty_step(obs))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "step.observation" in err.details() and "non-finite" in err.details()


def test_infinite_reward_is_refused(learner):
    obs = np.zeros((2, 4), np.float32)
    err = _rogue(learner.address, empty_step(obs), empty_step(obs, np.array([0.0, np.inf], np.float32)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "step.reward" in err.details()


def test_sanitize_replaces_non_finite_values_instead():
    obs = np.array([[np.nan, np.inf, -np.inf, 1.0]], np.float32)
    data = step_from_proto(empty_step(obs), 1, CARTPOLE.observation, StepBounds(sanitize=True))
    assert data.obs.tolist() == [[0.0, 1e10, -1e10, 1.0]]  # NaN by 0, inf by the bound (not float32's maximum)


def test_wrong_dtype_and_wrong_number_of_envs_are_named(learner):
    err = _rogue(learner.address, empty_step(np.zeros((2, 4), np.float64)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "dtype float64" in err.details()
    err = _rogue(learner.address, empty_step(np.zeros((3, 4), np.float32)),
                 greeting=hello(actor_id=97, num_envs=2))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "(3, 4)" in err.details()


def test_a_retired_run_id_cannot_rejoin(learner):
    first = Connection(learner.address, hello(actor_id=94, run_id="rogue-94"), connect_timeout=10)
    first.step(empty_step(np.zeros((2, 4), np.float32)), np.int64, ())
    first.close()
    deadline = time.monotonic() + 10
    while 94 in learner.learner.sessions.actor_ids and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(grpc.RpcError) as err:
        Connection(learner.address, hello(actor_id=94, run_id="rogue-94"), connect_timeout=10)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "rogue-94" in err.value.details() and "new run id" in err.value.details()
    Connection(learner.address, hello(actor_id=94, run_id="rogue-94-restarted"), connect_timeout=10).close()


def test_action_space_mismatch_at_hello_is_refused(learner):
    with pytest.raises(grpc.RpcError) as err:
        Connection(learner.address, hello(actor_id=96, action=SpaceSpec("discrete", (), "int64", n=5)),
                   connect_timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "action space" in err.value.details()


def test_oversized_message_is_resource_exhausted(running_learner):
    running = running_learner({**STRICT, "learner.max_message_mb": 1})
    big = pb.ActorMessage(hello=hello(actor_id=95))
    big.hello.env_id = "x" * (2 * 1024 * 1024)
    err = _raw_call(running.address, [big.SerializeToString()])
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_rogue_inputs_do_not_stop_a_well_behaved_actor_from_training(learner):
    actor = subprocess.Popen([sys.executable, "-m", "lockstep", "actor", "--learner", learner.address,
                              "--num-envs", "2", "--actor-id", "0"], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while learner.learner.trainer.iteration < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        before = learner.learner.trainer.iteration
        assert before >= 2
        obs = np.zeros((2, 4), np.float32)
        nan = obs.copy()
        nan[0, 0] = np.nan
        codes = [
            _raw_call(learner.address, [b"garbage"]).code(),
            _rogue(learner.address, empty_step(nan)).code(),
            _rogue(learner.address, empty_step(np.zeros((2, 5), np.float32))).code(),
        ]
        rogue = Connection(learner.address, hello(actor_id=9, run_id="rogue-9"), connect_timeout=10)
        with pytest.raises(grpc.RpcError) as duplicate:  # the same run id on a second stream
            Connection(learner.address, hello(actor_id=9, run_id="rogue-9"), connect_timeout=10)
        rogue.close()
        codes.append(duplicate.value.code())
        assert codes == [grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.INVALID_ARGUMENT,
                         grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS]
        while learner.learner.trainer.iteration < before + 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert learner.learner.trainer.iteration >= before + 3, "training stalled after the rogue inputs"
        assert learner.learner.report.counters.off_policy_samples == 0
    finally:
        learner.stop()
        actor.wait(timeout=30)
    assert actor.returncode == 0, actor.stderr.read()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_decoder_never_fails_with_anything_but_a_named_error_on_random_bytes(data):
    try:
        msg = pb.ActorMessage.FromString(data)
    except Exception as err:
        assert type(err).__name__ == "DecodeError", err
        return
    if msg.WhichOneof("kind") == "step":
        try:
            step_from_proto(msg.step, 2, CARTPOLE.observation)
        except CodecError as err:
            assert str(err).startswith("step.")


tensors = st.builds(
    pb.Tensor,
    dtype=st.sampled_from(["float32", "float64", "int64", "bool", "uint8", "object", "", "complex64"]),
    shape=st.lists(st.integers(-3, 2**40), max_size=4),
    data=st.binary(max_size=64),
)


@settings(max_examples=300, deadline=None)
@given(obs=tensors, reward=tensors, flags=tensors, index=tensors)
def test_decoder_names_the_field_for_random_field_values(obs, reward, flags, index):
    step = pb.Step(observation=obs, reward=reward, terminated=flags, truncated=flags, final_index=index)
    try:
        data = step_from_proto(step, 2, CARTPOLE.observation)
    except CodecError as err:
        assert str(err).split(":")[0] in {"step.observation", "step.reward", "step.terminated", "step.truncated",
                                          "step.final_index", "step.final_observation", "step.episode_return",
                                          "step.episode_length"}
    else:
        assert data.obs.shape == (2, 4) and data.obs.dtype == np.float32


# -- authentication and TLS ---------------------------------------------------------------


def test_listening_off_loopback_without_a_token_is_refused():
    with pytest.raises(SecurityError, match="without a token"):
        check_listen("0.0.0.0:50051", None)
    check_listen("0.0.0.0:50051", "secret")
    check_listen("127.0.0.1:50051", None)
    check_listen("[::1]:50051", None)


def test_learner_command_refuses_to_listen_off_loopback_without_a_token(tmp_path):
    result = subprocess.run([sys.executable, "-m", "lockstep", "learner", "--listen", "0.0.0.0:0",
                             "--run-dir", str(tmp_path / "run"), "--no-progress"],
                            capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert "without a token" in result.stderr


def test_clients_without_or_with_a_wrong_token_are_unauthenticated(running_learner):
    running = running_learner(STRICT, token="s3cret")
    for token, message in ((None, "requires a token"), ("wrong", "wrong token")):
        with pytest.raises(grpc.RpcError) as err:
            Connection(running.address, hello(actor_id=1), connect_timeout=10, token=token)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert message in err.value.details()
    conn = Connection(running.address, hello(actor_id=2), connect_timeout=10, token="s3cret")
    actions, version = conn.step(empty_step(np.zeros((2, 4), np.float32)), np.int64, ())
    assert actions.shape == (2,) and version == 0
    conn.close()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_tls_with_a_token_works_and_a_plaintext_client_is_refused(tmp_path, running_learner):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    running = running_learner({**STRICT, "learner.tls_cert": str(cert), "learner.tls_key": str(key)}, token="s3cret")
    conn = Connection(running.address, hello(actor_id=1), connect_timeout=10, token="s3cret", tls_ca=str(cert))
    actions, _ = conn.step(empty_step(np.zeros((2, 4), np.float32)), np.int64, ())
    assert actions.shape == (2,)
    conn.close()
    with pytest.raises((grpc.RpcError, ConnectionError)):
        Connection(running.address, hello(actor_id=2), connect_timeout=3, token="s3cret")
