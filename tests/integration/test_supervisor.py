"""``ActorProcesses`` and its ``RestartPolicy`` with real spawned actor processes: what it restarts,
what it leaves alone, and how often.

Actors that must stay alive connect to a TCP socket that accepts connections and never answers:
each accepted connection shows a live actor, which then waits for a welcome that never comes.
Actors that must finish or be refused talk to a real learner.
"""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest

from lockstep.actor import ActorOptions
from lockstep.launch.processes import ActorProcesses
from lockstep.launch.restart import RestartPolicy

BACKOFF_S = 0.05


def wait_for(condition, timeout: float = 30.0, every: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(every)


def kill(supervisor: ActorProcesses, index: int = 0) -> int:
    """SIGKILL one actor process and wait until it is gone; returns its pid."""
    proc = supervisor.actors[index].handle
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(timeout=10)
    assert proc.exitcode == -signal.SIGKILL
    return proc.pid


def check_until_restarted(supervisor: ActorProcesses, restarts: int) -> None:
    """Call ``check(training=True)`` as the training loop does, until ``restarts`` restarts happened."""
    def restarted() -> bool:
        supervisor.check(training=True)
        return supervisor.restarts == restarts
    wait_for(restarted, timeout=5.0)


class Silent:
    """A TCP port that accepts connections and never says a word."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(30.0)
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections: list[socket.socket] = []

    def wait_for_actor(self) -> None:
        """Wait until an actor process is up and connecting."""
        self.connections.append(self.sock.accept()[0])

    def close(self) -> None:
        for conn in self.connections:
            conn.close()
        self.sock.close()


@pytest.fixture
def silent():
    port = Silent()
    yield port
    port.close()


@pytest.fixture
def supervise(silent):
    """Start a supervisor of ``n`` actors connecting to the silent port; wait until each one connects."""
    supervisors = []

    def make(max_restarts: int, n: int = 1) -> ActorProcesses:
        options = [ActorOptions(learner=silent.address, actor_id=i, connect_timeout=60.0, retry_for_s=60.0)
                   for i in range(n)]
        supervisor = ActorProcesses(options, RestartPolicy(max_restarts, backoff_s=BACKOFF_S, max_backoff_s=1.0))
        supervisors.append(supervisor)
        supervisor.start()
        for _ in range(n):
            silent.wait_for_actor()
        return supervisor

    yield make
    for supervisor in supervisors:
        supervisor.stop(grace_s=0.0)


def test_actor_killed_with_sigkill_is_restarted_after_the_backoff(supervise, silent):
    supervisor = supervise(max_restarts=3)
    first = kill(supervisor)
    supervisor.check(training=True)
    assert supervisor.restarts == 0  # not before the backoff: a restart is scheduled
    assert supervisor.actors[0].restart_at is not None and not supervisor.all_exited()
    started = time.monotonic()
    check_until_restarted(supervisor, 1)
    assert time.monotonic() - started >= BACKOFF_S * 0.9
    proc = supervisor.actors[0].handle
    assert proc.is_alive() and proc.pid != first
    assert supervisor.pids() == [proc.pid]
    silent.wait_for_actor()  # the new process is an actor that connects again
    supervisor.check(training=True)  # a live actor is left alone
    assert supervisor.restarts == 1 and supervisor.actors[0].handle is proc


def test_actor_that_dies_after_training_is_not_restarted(supervise):
    supervisor = supervise(max_restarts=3)
    kill(supervisor)
    for _ in range(5):
        supervisor.check(training=False)
        time.sleep(BACKOFF_S)
    assert supervisor.restarts == 0 and supervisor.all_exited()


def test_restart_limit_is_respected(supervise, silent):
    supervisor = supervise(max_restarts=1)
    kill(supervisor)
    check_until_restarted(supervisor, 1)
    silent.wait_for_actor()
    kill(supervisor)
    for _ in range(5):
        supervisor.check(training=True)
        time.sleep(BACKOFF_S * 2)  # longer than the second backoff (0.1 s) would have been
    assert supervisor.restarts == 1
    assert supervisor.actors[0].handle is None and supervisor.actors[0].restart_at is None
    assert supervisor.all_exited() and supervisor.pids() == []


def test_restarts_are_counted_over_all_actors(supervise):
    supervisor = supervise(max_restarts=2, n=2)
    kill(supervisor, 0)
    kill(supervisor, 1)
    check_until_restarted(supervisor, 2)
    assert [supervisor.policy.restarts_of(a.actor_id) for a in supervisor.actors] == [1, 1]
    assert len(supervisor.pids()) == 2


TOKEN = "supervisor-test-token"


@pytest.fixture
def learner(running_learner, tiny_config):
    """A real learner that wants a token and trains one phase of one actor with one env (8 steps)."""
    return running_learner(config=tiny_config, token=TOKEN)


def supervise_until_exit(options: ActorOptions) -> ActorProcesses:
    supervisor = ActorProcesses([options], RestartPolicy(3, backoff_s=BACKOFF_S, max_backoff_s=1.0))
    supervisor.start()
    try:
        supervisor.actors[0].handle.join(timeout=60)
        for _ in range(5):
            supervisor.check(training=True)
            time.sleep(BACKOFF_S * 2)
    finally:
        supervisor.stop(grace_s=0.0)
    return supervisor


def test_actor_refused_by_the_learner_or_finished_is_not_restarted(learner):
    refused = supervise_until_exit(ActorOptions(learner=learner.address, token="wrong", retry_for_s=60.0))
    assert refused.actors[0].handle.exitcode == 2
    assert refused.restarts == 0 and refused.all_exited()

    finished = supervise_until_exit(ActorOptions(learner=learner.address, envs_per_actor=1, token=TOKEN,
                                                 retry_for_s=60.0))
    assert finished.actors[0].handle.exitcode == 0
    assert finished.restarts == 0 and finished.all_exited()
    assert learner.wait_finished(timeout=30)["env_steps"] == 8
