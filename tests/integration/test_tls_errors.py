"""A misconfigured actor ends at its first attempt with one line that names the cause and the flag that fixes it.

Each test runs a real ``lockstep actor`` process against a real learner (TLS and a token, or plaintext)
served from this process, with a reconnect budget far longer than the test waits: an actor that retried
instead of diagnosing logs its reconnects (and would not end in time), which the tests count, rather than
timing the actor on a machine whose load decides how long its start-up takes.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from conftest import RunningLearner, learner_config, lockstep_cmd

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")

TOKEN = "s3cret"


def _certificate(directory, name: str) -> tuple[str, str]:
    """A self-signed certificate (its own CA) for localhost and 127.0.0.1, and its key."""
    cert, key = directory / f"{name}.pem", directory / f"{name}-key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return str(cert), str(key)


def _learner(run_dir, tls: tuple[str, str] | None) -> RunningLearner:
    """A strict CartPole learner (16 steps per phase) that wants ``TOKEN``, on real gRPC, with TLS if given."""
    cert, key = tls or ("", "")
    config = learner_config({"ppo.steps_per_env": 16, "learner.min_actors": 1,
                             "learner.tls_cert": cert, "learner.tls_key": key})
    return RunningLearner(config, run_dir, token=TOKEN)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("certs")
    return {"learner": _certificate(directory, "learner"), "other": _certificate(directory, "other")}


@pytest.fixture(scope="module")
def tls_learner(tmp_path_factory, certs):
    running = _learner(tmp_path_factory.mktemp("tls") / "run", certs["learner"])
    yield running
    running.stop()


@pytest.fixture(scope="module")
def plain_learner(tmp_path_factory):
    running = _learner(tmp_path_factory.mktemp("plain") / "run", None)
    yield running
    running.stop()


def _actor(address: str, *flags: str) -> tuple[int, str]:
    """Run ``lockstep actor`` until it exits; return its exit code and stderr, after checking that it gave up on
    its first attempt (no reconnect) rather than retrying."""
    env = {k: v for k, v in os.environ.items() if k not in ("LOCKSTEP_TOKEN", "GRPC_VERBOSITY")}
    result = subprocess.run([*lockstep_cmd(), "actor", "--learner", address, "--num-envs", "1",
                             "--retry-for", "120", "--connect-timeout", "60", *flags],
                            capture_output=True, text=True, timeout=240, env=env)
    assert "reconnecting to" not in result.stderr, result.stderr
    return result.returncode, result.stderr


def _one_error_line(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, stderr
    assert "Handshake failed" not in stderr, "gRPC's own handshake lines should be kept out of the way"
    return errors[0]


def test_a_plaintext_actor_at_a_tls_learner_is_told_to_pass_tls_ca(tls_learner):
    code, stderr = _actor(tls_learner.address, "--token", TOKEN)
    line = _one_error_line(stderr)
    assert code == 2, (code, stderr)
    assert f"the learner at {tls_learner.address} speaks TLS: pass --tls-ca CA.pem" in line


def test_an_actor_trusting_the_wrong_ca_is_told_which_flag_to_fix(tls_learner, certs):
    code, stderr = _actor(tls_learner.address, "--token", TOKEN, "--tls-ca", certs["other"][0])
    line = _one_error_line(stderr)
    assert code == 2, (code, stderr)
    assert f"does not verify against --tls-ca {certs['other'][0]}" in line
    assert "pass --tls-ca with the CA certificate that signed the learner's --tls-cert" in line


def test_a_wrong_server_name_lists_the_names_the_certificate_holds(tls_learner, certs):
    code, stderr = _actor(tls_learner.address, "--token", TOKEN, "--tls-ca", certs["learner"][0],
                                   "--tls-server-name", "learner.example")
    line = _one_error_line(stderr)
    assert code == 2, (code, stderr)
    assert "is not valid for 'learner.example' (it names: localhost, 127.0.0.1)" in line
    assert "pass --tls-server-name" in line


def test_a_wrong_token_names_the_token_flag(tls_learner, certs):
    code, stderr = _actor(tls_learner.address, "--token", "wrong", "--tls-ca", certs["learner"][0])
    line = _one_error_line(stderr)
    assert code == 2, (code, stderr)
    assert f"the learner at {tls_learner.address} refused this actor: wrong token" in line
    assert "--token" in line and "LOCKSTEP_TOKEN" in line


def test_a_tls_actor_at_a_plaintext_learner_is_told_to_drop_tls_ca(plain_learner, certs):
    code, stderr = _actor(plain_learner.address, "--token", TOKEN, "--tls-ca", certs["learner"][0])
    line = _one_error_line(stderr)
    assert code == 2, (code, stderr)
    assert f"the learner at {plain_learner.address} does not speak TLS: drop --tls-ca" in line
