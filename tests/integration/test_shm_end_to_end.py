"""Training over the same-host transport with real processes: ``lockstep train`` (its default), an actor
killed with SIGKILL mid-unroll, and one run with a shared-memory actor and a gRPC actor side by side."""

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
from lockstep_bench.soak import actor_pids

from lockstep.observe.run_dir import RunDir
from lockstep.tools import audit

pytestmark = pytest.mark.slow

UNIX = re.compile(r"unix:(/\S+)/learner\.sock")


def _socket_folders(log: str) -> set[str]:
    """The private folders of the unix sockets a log names."""
    return set(UNIX.findall(log))


def _assert_on_policy(run_dir: Path) -> list[dict]:
    rows = RunDir(run_dir).metrics()
    assert rows and all(int(r["off_policy_samples"]) == 0 for r in rows)
    assert all(float(r["policy_lag_max"]) == 0 for r in rows)
    assert [int(r["iteration"]) for r in rows] == list(range(1, len(rows) + 1))
    return rows


@pytest.mark.parametrize("event_loop", ["asyncio", "uvloop"])
def test_train_over_shared_memory_is_on_policy_and_passes_the_audit(tmp_path, event_loop):
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [*lockstep_cmd(), "train", "--config", "cartpole-cleanrl", "--transport", "shm",
         "--actors", "2", "--envs-per-actor", "2", "--learner.event_loop", event_loop,
         "--steps-per-env", "32", "--total-steps", str(2 * 2 * 32 * 6), "--audit", "--run-dir", str(run_dir),
         "--no-progress"], capture_output=True, text=True, timeout=120)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log
    assert ("event loop: uvloop.Loop" in log) == (event_loop == "uvloop"), log  # the loop that ran is the one asked
    assert log.count("connected to unix:") == 2, log  # both actors took the same-host transport
    assert "transport: shm" in (run_dir / "config.yaml").read_text()
    assert len(_assert_on_policy(run_dir)) == 6
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == 2 * 2 * 32 * 6 and summary["off_policy_samples"] == 0
    report = audit.check(run_dir)
    assert report.differing == 0 and report.exit_code == 0, audit.format_report(report)
    folders = _socket_folders(log)
    assert len(folders) == 1 and not any(os.path.exists(f) for f in folders), "the socket's folder outlived the run"


def test_shared_memory_actor_killed_mid_unroll_is_dropped_restarted_and_training_completes(tmp_path):
    run_dir = tmp_path / "run"
    total = 3 * 256 * 12
    proc = subprocess.Popen(
        [*lockstep_cmd(), "train", "--config", "cartpole-cleanrl", "--transport", "shm",
         "--actors", "3", "--envs-per-actor", "1",
         "--steps-per-env", "256", "--total-steps", str(total), "--run-dir", str(run_dir), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed = 0
    try:
        deadline = time.monotonic() + 60
        while len(RunDir(run_dir).metrics()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        # An actor held between phases has nothing to drop: kill until a kill lands mid-unroll.
        while time.monotonic() < deadline and killed < 5:
            pids = actor_pids(proc.pid)
            if not pids:
                time.sleep(0.1)
                continue
            os.kill(pids[killed % len(pids)], signal.SIGKILL)
            killed += 1
            time.sleep(1.5)
            if any(int(r["dropped_transitions"]) > 0 for r in RunDir(run_dir).metrics()):
                break
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert killed >= 1 and "connected to unix:" in out
    rows = _assert_on_policy(run_dir)
    assert sum(int(r["dropped_transitions"]) for r in rows) > 0, out
    assert "restarting actor" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["actor_restarts"] >= 1
    assert summary["transitions_collected"] == summary["transitions_trained"] + summary["dropped_transitions"]
    assert summary["env_steps"] >= total


class _Lines:
    """A process's output, read by a thread, so a test can wait for a line without blocking on the pipe."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=lambda: self.lines.extend(proc.stdout), daemon=True)
        self._thread.start()

    def wait_for(self, pattern: re.Pattern, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if match := pattern.search(line):
                    return match
            time.sleep(0.05)
        raise AssertionError(f"no line matching {pattern.pattern!r}:\n{''.join(self.lines)}")

    def text(self) -> str:
        self._thread.join(timeout=10)
        return "".join(self.lines)


def test_a_shared_memory_actor_and_a_grpc_actor_train_in_one_run(tmp_path, free_port):
    run_dir = tmp_path / "run"
    learner = subprocess.Popen(
        [*lockstep_cmd(), "learner", "--env", "CartPole-v1", "--listen", f"127.0.0.1:{free_port}",
         "--min-actors", "2", "--steps-per-env", "32", "--total-steps", str(2 * 2 * 32 * 6), "--audit",
         "--run-dir", str(run_dir), "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = _Lines(learner)
    actors = []
    try:
        folder = output.wait_for(UNIX, timeout=60).group(1)
        for actor_id, address in ((0, f"unix:{folder}/learner.sock"), (1, f"127.0.0.1:{free_port}")):
            actors.append(subprocess.Popen(
                [*lockstep_cmd(), "actor", "--learner", address, "--env", "CartPole-v1", "--num-envs", "2",
                 "--actor-id", str(actor_id)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        logs = [actor.communicate(timeout=120)[0] for actor in actors]
        learner.wait(timeout=60)
    finally:
        for proc in (learner, *actors):
            proc.kill()
    log = output.text()
    assert learner.returncode == 0, log
    assert [actor.returncode for actor in actors] == [0, 0], logs
    assert "connected to unix:" in logs[0] and f"connected to 127.0.0.1:{free_port}" in logs[1]
    assert "shared memory instead: --learner unix:" in log  # `lockstep learner` says how to attach on this host
    rows = _assert_on_policy(run_dir)
    assert len(rows) == 6 and all(int(r["actors"]) == 2 for r in rows)
    report = audit.check(run_dir)
    assert report.differing == 0 and report.exit_code == 0, audit.format_report(report)
    assert not os.path.exists(folder), "the socket's folder outlived the learner"
