"""Hostile and faulty hellos against a real `lockstep learner` process: absurd sizes are refused by name
before anything is allocated (its RSS stays flat), and a local process without the run's token cannot
take over a live actor's session; a good actor trains on through both."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import lockstep_cmd
from protocol import hello

from lockstep.config import Config
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.grpc import security
from lockstep.transport.grpc.client import Connection, LearnerRefused
from lockstep.transport.messages import MAX_AGENTS
from lockstep.transport.shm.client import LocalConnection

ITERATIONS = 24  # of 4 envs x 64 steps
TOTAL_STEPS = ITERATIONS * 4 * 64


class LearnerProcess:
    """`lockstep learner` on loopback with no token given (it generates one), and one good `lockstep actor`."""

    def __init__(self, tmp_path: Path, port: int, budget: tuple[str, ...] = ("--total-steps", str(TOTAL_STEPS))
                 ) -> None:
        self.run_dir = tmp_path / "run"
        self.env = {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)}  # where the generated token is kept
        self.env.pop(security.TOKEN_ENV, None)
        self.address = f"127.0.0.1:{port}"
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [*lockstep_cmd(), "learner", "--env", "CartPole-v1", "--listen", self.address, "--min-actors", "1",
             *budget, "--steps-per-env", "64", "--run-dir", str(self.run_dir),
             "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env)
        threading.Thread(target=self._read, daemon=True).start()
        self.local_address = self._wait_for(r"shared memory instead: --learner (unix:\S+)")
        self.actor = subprocess.Popen(
            [*lockstep_cmd(), "actor", "--learner", self.address, "--env", "CartPole-v1", "--num-envs", "4",
             "--actor-id", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    def _wait_for(self, pattern: str, timeout: float = 120.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                match = re.search(pattern, line)
                if match:
                    return match.group(1)
            assert self.proc.poll() is None, "".join(self.lines)
            time.sleep(0.1)
        raise AssertionError(f"no line matching {pattern!r} in:\n{''.join(self.lines)}")

    def rows(self) -> int:
        path = self.run_dir / "metrics.csv"
        return max(0, len(path.read_text().splitlines()) - 1) if path.exists() else 0

    def wait_training(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while self.rows() < 1:
            assert time.monotonic() < deadline and self.proc.poll() is None, "".join(self.lines)
            time.sleep(0.2)

    def rss_mb(self) -> float:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024

    def finish(self) -> tuple[dict, str]:
        """Wait for the run to end; the summary and what the actor printed."""
        actor_out, _ = self.actor.communicate(timeout=300)
        self.proc.wait(timeout=60)
        assert self.actor.returncode == 0, actor_out
        assert self.proc.returncode == 0, "".join(self.lines)
        return json.loads((self.run_dir / "summary.json").read_text()), actor_out

    def stop(self) -> tuple[dict, str]:
        """End the run as Ctrl-C would (SIGTERM: the learner writes its summary and exits 143), the actor first so
        that it says nothing of the learner's end; the summary and what the actor printed until then."""
        self.actor.kill()
        actor_out, _ = self.actor.communicate(timeout=60)
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=120) == 128 + signal.SIGTERM, "".join(self.lines)
        return json.loads((self.run_dir / "summary.json").read_text()), actor_out

    def wait_rows(self, rows: int, timeout: float = 180.0) -> None:
        """Wait until metrics.csv has more than ``rows`` rows: the run trained on."""
        deadline = time.monotonic() + timeout
        while self.rows() <= rows:
            assert time.monotonic() < deadline and self.proc.poll() is None, "".join(self.lines)
            time.sleep(0.2)

    def kill(self) -> None:
        for proc in (self.actor, self.proc):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def learner(tmp_path, free_port, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    running = LearnerProcess(tmp_path, free_port)
    yield running
    running.kill()


@pytest.fixture
def endless_learner(tmp_path, free_port, monkeypatch):
    """A learner whose step budget is out of reach: it trains until the test stops it, however long the hellos
    take on this machine (a time limit raced them: on a slow machine the run ended before the hellos did)."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    running = LearnerProcess(tmp_path, free_port, ("--total-steps", str(10**9)))
    yield running
    running.kill()


def _absurd_hellos() -> list[tuple[str, str, pb.Hello]]:
    """(field, limit, hello): one size over its limit in each, the rest an honest actor's."""
    limits = Config().learner
    huge_box = pb.Space(kind=pb.Space.BOX, shape=[1 << 20, 1 << 20], dtype="float32")
    cases = [("hello.run_id", limits.max_id_length, hello(actor_id=11, run_id="r" * 10_000_000)),
             ("hello.num_envs", limits.max_envs_per_actor, hello(actor_id=12, num_envs=2**31 - 1)),
             ("hello.env_id", limits.max_id_length, hello(actor_id=13))]
    cases[-1][2].env_id = "e" * 1_000_000
    observation, action = hello(actor_id=14), hello(actor_id=15)
    observation.observation_space.CopyFrom(huge_box)
    action.action_space.n = 2**62
    cases += [("hello.observation_space", limits.max_space_elements, observation),
              ("hello.action_space", limits.max_space_elements, action)]
    many, long = hello(actor_id=16), hello(actor_id=17)
    many.agent_policies.update({f"agent_{i}": "p" for i in range(MAX_AGENTS + 1)})
    long.agent_policies["a" * 1_000_000] = "p"
    cases += [("hello.agent_policies", MAX_AGENTS, many), ("hello.agent_policies", limits.max_id_length, long)]
    return [(field, str(limit), message) for field, limit, message in cases]


def _refusal(connect) -> LearnerRefused:
    with pytest.raises(LearnerRefused) as refused:
        connect().close()
    return refused.value


@pytest.mark.slow
def test_absurd_hellos_over_grpc_and_the_unix_socket_are_refused_by_name_and_the_learners_memory_stays_flat(
        endless_learner):
    learner = endless_learner
    learner.wait_training()
    token = security.local_token(learner.address)
    assert token
    before = learner.rss_mb()
    for _round in range(3):  # repeated: memory kept per refused hello would add up
        for field, limit, message in _absurd_hellos():
            over_grpc = _refusal(lambda m=message: Connection.open(learner.address, m, connect_timeout=30, token=token))
            over_shm = _refusal(lambda m=message: LocalConnection(learner.local_address, m, connect_timeout=30))
            for refused in (over_grpc, over_shm):
                assert refused.code == "INVALID_ARGUMENT", refused
                assert field in refused.message and limit in refused.message, refused.message
    grown = learner.rss_mb() - before
    assert grown < 200, f"the learner's RSS grew by {grown:.0f} MB over the refused hellos"
    at_the_end_of_the_hellos = learner.rows()
    learner.wait_rows(at_the_end_of_the_hellos)  # it trains on after the hellos
    summary, actor_out = learner.stop()
    assert summary["iterations"] > at_the_end_of_the_hellos and summary["status"] == "stopped", actor_out
    assert "refused" not in actor_out


@pytest.mark.slow
def test_a_local_process_without_the_token_cannot_take_over_actor_0_which_trains_on(learner):
    learner.wait_training()
    rogue = hello(actor_id=0)  # actor 0's id, with the right spaces: all it lacks is the token
    for token in (None, "guessed"):
        refused = _refusal(lambda t=token: Connection.open(learner.address, rogue, connect_timeout=30, token=t))
        assert refused.code == "UNAUTHENTICATED", refused
        assert "token" in refused.message
    summary, actor_out = learner.finish()
    assert summary["iterations"] == ITERATIONS
    assert "refused" not in actor_out and "replaced" not in actor_out, actor_out
    assert summary["dropped_transitions"] == 0  # actor 0's session was never replaced
    token_file = security.token_file(int(learner.address.rsplit(":", 1)[1]))
    assert not token_file.exists(), "the learner leaves no token file behind"


@pytest.mark.slow
def test_lockstep_train_hands_its_generated_token_to_its_actors_and_writes_it_nowhere_in_the_run(tmp_path,
                                                                                                monkeypatch):
    from lockstep.launch.local import train

    secret = "generated-for-this-run-" + "x" * 20
    monkeypatch.setattr(security, "new_token", lambda: secret)
    monkeypatch.delenv(security.TOKEN_ENV, raising=False)
    config = Config()
    config.actors.count, config.actors.envs_per_actor = 1, 2
    config.ppo.steps_per_env, config.ppo.total_steps = 32, 128
    config.run.progress, config.learner.device = False, "cpu"
    summary = train(config, tmp_path / "run")
    assert summary["iterations"] == 2  # the actor got the token: it was let in
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            assert secret.encode() not in path.read_bytes(), f"{path} holds the token"
