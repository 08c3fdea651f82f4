"""An actor whose envs run in processes of their own (``actors.vector: async``): one of them killed mid-run is
named in the actor's last log line, and the actor exits with its code for it (4) and leaves no env process behind;
an actor killed outright takes its env processes with it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import lockstep_cmd

pytestmark = pytest.mark.slow


def _env_processes(actor: int) -> list[int]:
    """The spawned children of process ``actor`` (its env processes; not multiprocessing's resource tracker)."""
    children = Path(f"/proc/{actor}/task/{actor}/children").read_text().split()
    return sorted(int(c) for c in children
                  if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes() and _alive(int(c)))


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_an_env_process_killed_mid_run_is_named_and_its_actor_exits(running_learner):
    learner = running_learner({"ppo.steps_per_env": 16})
    actor = subprocess.Popen([*lockstep_cmd(), "actor", "--learner", learner.address, "--envs-per-actor", "2",
                              "--vector", "async", "--retry-for", "5"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        while not learner.run.metrics() and time.monotonic() < deadline and actor.poll() is None:
            time.sleep(0.1)
        assert learner.run.metrics(), "the actor's envs never completed a phase"
        envs = _env_processes(actor.pid)
        assert len(envs) == 2
        os.kill(envs[1], signal.SIGKILL)
        out, _ = actor.communicate(timeout=60)
    finally:
        actor.kill()
    assert actor.returncode == 4, out
    assert re.search(rf"actor 0: env [01] of 2 \(CartPole-v1\) died: its process {envs[1]} ended \(killed by SIGKILL\)"
                     r"; exiting", out), out
    deadline = time.monotonic() + 10
    while _alive(envs[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(envs[0]), "the actor left an env process running"


def test_env_processes_end_with_an_actor_killed_outright(running_learner, tmp_path):
    """Killed in the middle of a step of a minute: an env process that waited to hear from its actor would live on
    until its step ended."""
    slow = {"env.id": "lockstep.envs.tasks:Slow", "env.kwargs": {"step_ms": 60_000}}
    learner = running_learner(slow)
    log = tmp_path / "actor.log"
    with open(log, "w") as out:
        actor = subprocess.Popen([*lockstep_cmd(), "actor", "--learner", learner.address, "--env", slow["env.id"],
                                  "--env-kwargs", "{step_ms: 60000}", "--envs-per-actor", "2", "--vector", "async"],
                                 stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "connected to" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        envs = _env_processes(actor.pid)
        assert len(envs) == 2, log.read_text()
        time.sleep(1.0)  # the first actions have come back: the envs are asleep in their step
    finally:
        actor.kill()
        actor.wait()
    deadline = time.monotonic() + 10
    while any(map(_alive, envs)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_alive, envs)), "an env process outlived its actor"
