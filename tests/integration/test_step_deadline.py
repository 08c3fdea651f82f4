"""The step deadline and replies that never wait on a peer, against a real learner and real sockets.

A learner runs in a thread; the good actor is a ``lockstep actor`` process on the same-host socket, and so
is a slow one whose env's every step takes 2 s; the members that stall are real clients that stop
part-way: a gRPC stream that says hello and nothing else, one that steps twice and then hangs (as an actor
whose env hangs), and a raw unix-socket client that sends steps but never reads its replies.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import threading
import time

import numpy as np
import pytest
from conftest import lockstep_cmd
from protocol import empty_step, hello
from slow_env import SLOW_ENV_PATH

from lockstep import config as config_lib
from lockstep.learner.wiring import Learner
from lockstep.transport.grpc.client import Connection
from lockstep.transport.shm import layout as wire

T = 8  # steps per env per policy version
DEADLINE_S = 2.0


class RunningLearner:
    """A CartPole learner in a thread; ``summary`` is what ``serve`` returned once it is closed."""

    def __init__(self, tmp_path, steps_per_env: int = T, **sync_fields) -> None:
        config = config_lib.Config()
        config.run.progress = False
        config.ppo.total_steps, config.ppo.steps_per_env = 10**9, steps_per_env
        config.actors.count, config.learner.min_actors = 1, 1
        for key, value in sync_fields.items():
            setattr(config.sync, key, value)
        self.learner = Learner(config, tmp_path / "run")
        self.summary: dict | None = None
        self.thread = threading.Thread(target=self._serve)
        self.thread.start()
        self.port = self.learner.wait_ready(timeout=30)
        self.address = self.learner.local_address
        self.grpc_address = f"127.0.0.1:{self.port}"

    def _serve(self) -> None:
        self.summary = self.learner.serve()

    def wait_iterations(self, at_least: int, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.learner.trainer.iteration < at_least and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.learner.trainer.iteration

    def close(self) -> None:
        self.learner.stop()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()


def _good_actor(address: str) -> subprocess.Popen:
    return subprocess.Popen([*lockstep_cmd(), "actor", "--learner", address, "--num-envs", "2", "--actor-id", "0"],
                            stderr=subprocess.PIPE, text=True)


def _slow_actor(address: str, actor_id: int) -> subprocess.Popen:
    """An actor of one env whose every step takes 2 s (tests/slow_env.py)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SLOW_ENV_PATH, os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([*lockstep_cmd(), "actor", "--learner", address, "--num-envs", "1", "--actor-id",
                             str(actor_id), "--env", "slow_env:make"], stderr=subprocess.PIPE, text=True, env=env)


def _obs(k: int) -> np.ndarray:
    return np.zeros((k, 4), np.float32)


def test_a_silent_member_and_a_hung_one_are_evicted_after_the_step_deadline_and_training_goes_on(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="lockstep")
    running = RunningLearner(tmp_path, step_deadline_s=DEADLINE_S)
    actor = _good_actor(running.address)
    silent = hung = None
    try:
        assert running.wait_iterations(2, timeout=60) >= 2
        token = running.learner.token
        silent = Connection.open(running.grpc_address, hello(actor_id=7, num_envs=1), token=token)  # hello, nothing
        hung = Connection.open(running.grpc_address, hello(actor_id=8, num_envs=3), token=token)
        for _ in range(2):  # two actions taken, then its env "hangs"
            hung.step(empty_step(_obs(3)), np.dtype(np.int64), ())
        joined = running.learner.trainer.iteration

        after = running.wait_iterations(joined + 5, timeout=60)
        assert after >= joined + 5, "training stalled behind a member that stopped stepping"
        assert 7 not in running.learner.sessions.actor_ids and 8 not in running.learner.sessions.actor_ids
        counters = running.learner.report.counters
        assert counters.evicted_actors == 2
        assert counters.dropped_transitions >= 2 * 3  # the hung member's two actions for its 3 envs

        for conn, who in ((silent, 7), (hung, 8)):  # each is told why, by name, and may reconnect
            with pytest.raises(ConnectionError, match=f"DEADLINE_EXCEEDED: actor {who}: evicted, no step for"):
                conn.act(_step_data(conn is hung))
        evictions = [r.getMessage() for r in caplog.records if "evicted" in r.getMessage()]
        assert any("actor 7: evicted" in m and "sync.step_deadline_s = 2" in m for m in evictions), evictions
        assert any("actor 8: evicted" in m and "6 transition(s)" in m for m in evictions), evictions
    finally:
        for conn in (silent, hung):
            if conn is not None:
                conn.close()
        running.close()
        actor.wait(timeout=30)
    assert actor.returncode == 0, actor.stderr.read()
    assert running.summary["evicted_actors"] == 2
    rows = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    column = header.index("evicted_actors")
    assert sum(int(row.split(",")[column]) for row in rows[1:]) == 2


def test_with_the_default_deadlines_a_silent_member_stalls_training_for_seconds_and_a_2_s_step_is_never_cut(
        tmp_path, caplog):
    """No deadline is configured: the silent member is evicted by the first-step deadline, and training goes on
    within 30 s of its hello, while the actor whose env takes 2 s a step stays across all of its steps."""
    caplog.set_level(logging.WARNING, logger="lockstep")
    running = RunningLearner(tmp_path, steps_per_env=2)  # a phase is two of the slow env's steps: ~4 s
    fast, slow = _good_actor(running.address), _slow_actor(running.address, actor_id=1)
    sessions = running.learner.sessions
    silent = None
    try:
        deadline = time.monotonic() + 60
        while sessions.slot_counters.get(1, 0) < 3 and time.monotonic() < deadline:  # the slow env has a pace
            time.sleep(0.1)
        assert sessions.slot_counters.get(1, 0) >= 3, "the slow actor did not step"
        silent = Connection.open(running.grpc_address, hello(actor_id=7, num_envs=1), token=running.learner.token)
        hello_at, joined, slow_steps = time.monotonic(), running.learner.trainer.iteration, sessions.slot_counters[1]

        # the phase after the one under way at the hello waits for the silent member: +2 closes it
        after = running.wait_iterations(joined + 2, timeout=30 - (time.monotonic() - hello_at))
        assert after >= joined + 2, "training stalled behind a member that said hello and sent nothing"
        assert 7 not in sessions.actor_ids
        evictions = [r.getMessage() for r in caplog.records if "unroll dropped" in r.getMessage()]
        assert len(evictions) == 1 and "actor 7: evicted" in evictions[0], evictions
        assert "no step since its hello, sync.first_step_deadline_s" in evictions[0], evictions
        # the others' typical gap is the median of the fast actor's and the slow one's (at least its 2 s sleep)
        typical = re.search(r"the other actors' typical step gap ([0-9.e+-]+) s", evictions[0])
        assert typical and float(typical.group(1)) >= 1.0, evictions

        while sessions.slot_counters[1] < slow_steps + 6 and time.monotonic() < hello_at + 40:
            time.sleep(0.1)
        assert sessions.slot_counters[1] >= slow_steps + 6, "the slow actor stopped stepping"
        assert 1 in sessions.actor_ids and running.learner.report.counters.evicted_actors == 1
    finally:
        if silent is not None:
            silent.close()
        running.close()
        for actor in (fast, slow):
            actor.wait(timeout=30)
    for actor in (fast, slow):
        err = actor.stderr.read()
        assert actor.returncode == 0, err
        assert "reconnecting" not in err, err  # the slow actor kept its one connection: it was never evicted
    assert running.summary["evicted_actors"] == 1


def _step_data(hung: bool):
    from lockstep.transport.messages import StepData

    k = 3 if hung else 1
    return StepData(obs=_obs(k), reward=np.zeros(k, np.float32), terminated=np.zeros(k, bool),
                    truncated=np.zeros(k, bool), final_index=np.zeros(0, np.int64),
                    final_obs=np.zeros((0, 4), np.float32), episode_return=np.zeros(0, np.float64),
                    episode_length=np.zeros(0, np.int64))


def _send_hello(sock: socket.socket, message) -> None:
    body = message.SerializeToString()
    sock.send(wire.HELLO.pack(wire.HELLO_MAGIC, len(body)))
    for start in range(0, len(body), wire.CHUNK):
        sock.send(body[start:start + wire.CHUNK])


def test_a_local_peer_that_never_reads_its_replies_is_dropped_without_stalling_training(tmp_path, caplog):
    """The peer sends step after step and reads nothing: its replies fill its socket buffer. The learner
    drops it then, instead of waiting for room (the step deadline is far off: it is not what ends it)."""
    caplog.set_level(logging.WARNING, logger="lockstep")
    running = RunningLearner(tmp_path)  # the default step deadline: 300 s
    actor = _good_actor(running.address)
    rogue = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stop = threading.Event()

    def flood() -> None:  # steps as fast as the socket takes them; never a recv
        frame = wire.STEP.pack(wire.STEP_KIND, 0, 0)
        while not stop.is_set():
            try:
                rogue.send(frame)
            except BlockingIOError:
                time.sleep(0.005)
            except OSError:
                return

    try:
        assert running.wait_iterations(2, timeout=60) >= 2
        rogue.connect(running.address[len("unix:"):])
        _send_hello(rogue, hello(actor_id=9, num_envs=1))
        rogue.setblocking(False)
        flooding = threading.Thread(target=flood, daemon=True)
        flooding.start()
        deadline = time.monotonic() + 90
        while not any("does not read its replies" in r.getMessage() for r in caplog.records) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        dropped = [r.getMessage() for r in caplog.records if "does not read its replies" in r.getMessage()]
        assert dropped and "actor 9" in dropped[0], "the learner kept serving a peer that reads nothing"
        assert 9 not in running.learner.sessions.actor_ids
        before = running.learner.trainer.iteration
        assert running.wait_iterations(before + 3, timeout=60) >= before + 3, "training stalled after the drop"
    finally:
        stop.set()
        rogue.close()
        running.close()
        actor.wait(timeout=30)
    assert actor.returncode == 0, actor.stderr.read()
    assert running.summary["evicted_actors"] == 0  # dropped by the transport, not by the deadline
    assert os.path.exists(tmp_path / "run" / "summary.json")
