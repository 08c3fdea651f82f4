"""``lockstep train --launcher ray`` on a Ray cluster of several nodes, each started by ``ray start`` on this
host, as on several machines: actors placed by a custom resource, a node killed mid-run, a node added back.

Every node runs in a session of its own (``start_new_session``), and every process Ray starts for that node,
its workers included, stays in that session: the session says on which node an actor's worker runs, and
killing the sessions' processes removes the cluster whatever the test did (``ray stop`` would stop every Ray
process of the host, other users' too).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import lockstep_cmd

from lockstep.launch.ray import INSTALL
from lockstep.observe.run_dir import RunDir

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason=f"Ray is not installed ({INSTALL})")

RAY = str(Path(sys.executable).with_name("ray"))
WAIT_S = 240.0  # for each thing awaited: a loaded host makes everything slow, and nothing here is a timing claim


class _Cluster:
    """A Ray head and its worker nodes on this host, each node in a session of its own."""

    def __init__(self, root: Path) -> None:
        self.root = root
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
                    "RAY_AUTH_TOKEN": secrets.token_hex(16),
                    # the head declares a node dead after 2 failed checks 1 s apart (default: 5, 3 s apart)
                    "RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "2"}
        # set to 0 it keeps nodes on 127.0.0.1, and `ray start --address` then refuses to join any head
        self.env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        self.env.pop("RAY_ADDRESS", None)
        self.sessions: dict[str, int] = {}  # node name -> its session id
        self.temp_dirs: list[str] = []

    def start(self, names_and_args: list[tuple[str, list[str]]]) -> None:
        """Start nodes side by side (``ray start`` returns once its node is up)."""
        procs = []
        for name, args in names_and_args:
            temp_dir = tempfile.mkdtemp(prefix="lockstep-rc-", dir="/tmp")  # short: Ray's unix sockets live here
            self.temp_dirs.append(temp_dir)
            log = (self.root / f"{name}.log").open("w")
            proc = subprocess.Popen([RAY, "start", *args, "--temp-dir", temp_dir, "--object-store-memory", "100000000",
                                     "--log-style", "record"], stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, env=self.env, start_new_session=True)
            self.sessions[name] = proc.pid
            procs.append((name, proc, log))
        for name, proc, log in procs:
            code = proc.wait(timeout=WAIT_S)
            log.close()
            assert code == 0, (self.root / f"{name}.log").read_text()

    def head(self) -> None:
        self.start([("head", ["--head", "--port", str(self.port), "--num-cpus", "2", "--resources", "{}",
                              "--include-dashboard", "false", "--disable-usage-stats"])])

    def nodes(self, *names: str, actor_host: int = 1) -> None:
        self.start([(name, ["--address", self.address, "--num-cpus", "1",
                            "--resources", json.dumps({"actor_host": actor_host})]) for name in names])

    def node_of(self, pid: int) -> str:
        """The node whose session ``pid`` is in."""
        sid = os.getsid(pid)
        return next((name for name, s in self.sessions.items() if s == sid), f"no node (session {sid})")

    def processes(self, name: str) -> list[int]:
        """The processes of node ``name`` that have not ended (zombies have: init reaps them)."""
        pids = []
        for entry in os.listdir("/proc"):
            try:
                if entry.isdigit() and os.getsid(int(entry)) == self.sessions[name] and _state(int(entry)) != "Z":
                    pids.append(int(entry))
            except (ProcessLookupError, FileNotFoundError):
                pass
        return pids

    def kill_raylet(self, name: str) -> int:
        """SIGKILL the node's raylet, as a machine's failure would end it; its workers end with it."""
        for pid in self.processes(name):
            try:
                if Path(f"/proc/{pid}/comm").read_text().strip() == "raylet":
                    os.kill(pid, signal.SIGKILL)
                    return pid
            except (FileNotFoundError, ProcessLookupError):
                pass
        raise AssertionError(f"node {name} has no raylet")

    def remove(self) -> None:
        """Kill every process of every node (a node's workers included), then remove their files."""
        for _ in range(3):
            pids = [pid for name in self.sessions for pid in self.processes(name)]
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if not pids:
                break
            time.sleep(0.5)
        for temp_dir in self.temp_dirs:
            shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture
def ray_cluster(tmp_path):
    cluster = _Cluster(tmp_path)
    try:
        yield cluster
    finally:
        cluster.remove()
    left = [pid for name in cluster.sessions for pid in cluster.processes(name)]
    assert not left, f"Ray processes left behind: {left}"


def _state(pid: int) -> str:
    """A process's state letter (R, S, Z, ...) from /proc; its name, in parentheses, may hold spaces."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def _wait_for(condition, what: str, proc: subprocess.Popen, log: Path) -> None:
    """Until ``condition()`` holds; a failure, with the run's log, once ``proc`` has ended or WAIT_S has passed."""
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert proc.poll() is None, f"lockstep train ended (code {proc.returncode}) before {what}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"waited {WAIT_S:.0f} s for {what}:\n{log.read_text()}"
        time.sleep(0.2)


@needs_ray
@pytest.mark.slow
def test_actors_on_a_node_that_dies_come_back_when_a_node_with_their_resource_joins(tmp_path, ray_cluster):
    cluster = ray_cluster
    cluster.head()  # CPUs for actors, but no actor_host: no actor may run here
    cluster.nodes("node-a", "node-b")  # one actor_host each
    run_dir, log = tmp_path / "run", tmp_path / "train.log"
    with log.open("w") as log_file:
        proc = subprocess.Popen(  # a budget no run reaches here: it is stopped once the actor is back
            [*lockstep_cmd(), "train", "--launcher", "ray", "--ray-address", cluster.address,
             "--ray-resources", "{actor_host: 1}", "--config", "cartpole-cleanrl", "--actors", "2",
             "--envs-per-actor", "2", "--no-progress", "--set", "ppo.epochs=1", "--steps-per-env", "64",
             "--total-steps", str(10**9), "--run-dir", str(run_dir)],
            stdout=log_file, stderr=subprocess.STDOUT, env=cluster.env)
    try:
        def rows() -> list[dict]:
            return RunDir(run_dir).metrics()

        def text() -> str:
            return log.read_text()

        _wait_for(lambda: len(re.findall(r"actor \d runs in Ray worker pid", text())) == 2 and rows(),
                  "both actors and a first iteration", proc, log)
        workers = {int(a): int(p) for a, p in re.findall(r"actor (\d) runs in Ray worker pid (\d+)", text())}
        placed = {actor: cluster.node_of(pid) for actor, pid in workers.items()}
        assert sorted(placed.values()) == ["node-a", "node-b"], (placed, text())  # one per actor_host

        victim = next(actor for actor, node in placed.items() if node == "node-a")
        survivor = 1 - victim
        cluster.kill_raylet("node-a")
        killed_at = len(rows())
        # the victim's stream closed with its worker: the learner trains on with the survivor alone
        _wait_for(lambda: any(r["actors"] == 1 for r in rows()[killed_at:]), "an iteration with one actor", proc,
                  log)
        assert f"actor {victim} left" in text()

        cluster.nodes("node-c")  # room again for the victim, which Ray restarts there
        back = re.compile(rf"actor {victim} restarted by Ray \(restart 1 of at most 10\): worker pid (\d+)")
        _wait_for(lambda: back.search(text()) or f"actor {victim} is gone" in text(), "the restart on node-c",
                  proc, log)
        assert back.search(text()), text()
        assert cluster.node_of(int(back.search(text()).group(1))) == "node-c", text()
        rejoined = len(rows())
        _wait_for(lambda: any(r["actors"] == 2 for r in rows()[rejoined:]), "an iteration with both actors", proc,
                  log)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=WAIT_S)
    finally:
        proc.kill()
    out = text()
    assert proc.returncode == 128 + signal.SIGTERM, out
    assert out.count(f"actor {victim} joined") == 2 and out.count(f"actor {survivor} joined") == 1, out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["actor_restarts"] == 1 and summary["off_policy_samples"] == 0, out
    assert summary["transitions_collected"] == summary["transitions_trained"] + summary["dropped_transitions"]
