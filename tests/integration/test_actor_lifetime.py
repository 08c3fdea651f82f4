"""An actor never outlives what it serves: a local actor whose parent dies at once (before the actor's
imports are done) exits, and a held actor notices a learner that stopped answering (keepalive pings
go on while no data flows) and exits instead of waiting forever. Real processes, real sockets."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import lockstep_cmd

PARENT = """
import os, signal, sys
from lockstep.actor import ActorOptions
from lockstep.launch.processes import ActorProcesses
from lockstep.launch.restart import RestartPolicy

# an actor that would wait ten minutes for a learner nobody starts
actors = ActorProcesses([ActorOptions(learner="127.0.0.1:1", connect_timeout=600, retry_for_s=600)], RestartPolicy(0))
actors.start()
print(actors.pids()[0], flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # gone before the actor has finished importing
"""


def _alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_an_actor_whose_parent_dies_while_it_starts_exits(tmp_path):
    out = tmp_path / "parent.out"  # a file, not a pipe: the actor inherits it, and a pipe would wait for it
    with out.open("w") as sink:
        parent = subprocess.run([sys.executable, "-c", PARENT], stdout=sink, stderr=subprocess.STDOUT, timeout=120,
                                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert parent.returncode == -signal.SIGKILL, out.read_text()
    actor = int(out.read_text().split()[0])
    try:
        assert _wait_gone(actor, timeout=60), f"actor {actor} outlived its parent"
    finally:
        if _alive(actor):
            os.kill(actor, signal.SIGKILL)


@pytest.mark.slow
def test_a_held_actor_notices_a_learner_that_stopped_answering_and_exits(tmp_path, free_port):
    env = {**os.environ, "LOCKSTEP_TOKEN": "frozen"}
    address = f"127.0.0.1:{free_port}"
    learner = subprocess.Popen(  # two actors before the first phase: the one actor's first step is held
        [*lockstep_cmd(), "learner", "--listen", address, "--min-actors", "2", "--run-dir", str(tmp_path / "run"),
         "--no-progress"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    actor = subprocess.Popen([*lockstep_cmd(), "actor", "--learner", address, "--retry-for", "0"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "run" / "config.yaml").exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        # held for longer than two keepalive intervals, the pings gRPC sends without data unless told otherwise
        time.sleep(35)
        assert actor.poll() is None, actor.stdout.read()
        learner.send_signal(signal.SIGSTOP)  # its sockets stay open, but nothing answers a ping any more
        try:
            out, _ = actor.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            pytest.fail("a held actor did not notice in 60 s that its learner stopped answering")
        assert actor.returncode == 1, out
        assert "lost the learner" in out, out
    finally:
        learner.send_signal(signal.SIGCONT)
        for proc in (actor, learner):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
