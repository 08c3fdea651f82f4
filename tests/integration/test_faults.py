"""Faults with real processes: actors killed with SIGKILL mid-phase, restarted, and a learner that goes away."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import lockstep_cmd
from lockstep_bench.soak import actor_pids

from lockstep.observe.run_dir import RunDir
from lockstep.tools import audit

pytestmark = pytest.mark.slow


def test_actor_killed_mid_phase_is_dropped_restarted_and_training_continues(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [*lockstep_cmd(), "train", "--config", "cartpole-cleanrl", "--transport", "shm",
         "--actors", "3", "--envs-per-actor", "1",
         "--steps-per-env", "256", "--total-steps", str(3 * 256 * 30), "--run-dir", str(run_dir), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed = 0
    try:
        deadline = time.monotonic() + 120
        while len(RunDir(run_dir).metrics()) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        # Kill until a kill lands mid-unroll (an actor that is held between phases has nothing to drop).
        while time.monotonic() < deadline and killed < 5:
            pids = actor_pids(proc.pid)
            if not pids:
                time.sleep(0.2)
            else:
                os.kill(pids[killed % len(pids)], signal.SIGKILL)
                killed += 1
                time.sleep(2.0)
                if any(int(r["dropped_transitions"]) > 0 for r in RunDir(run_dir).metrics()):
                    break
        out, _ = proc.communicate(timeout=180)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert killed >= 1
    rows = RunDir(run_dir).metrics()
    assert sum(int(r["dropped_transitions"]) for r in rows) > 0, out
    assert all(int(r["off_policy_samples"]) == 0 for r in rows)
    assert [int(r["iteration"]) for r in rows] == list(range(1, len(rows) + 1))
    assert "restarting actor" in out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["actor_restarts"] >= 1
    assert summary["transitions_collected"] == summary["transitions_trained"] + summary["dropped_transitions"]
    assert summary["env_steps"] >= 3 * 256 * 30


def test_actor_reconnects_when_its_learner_is_killed_and_another_takes_its_place(tmp_path, free_port):
    """The actor outlives a learner killed with SIGKILL: it retries with backoff and trains with the next one."""
    address = f"127.0.0.1:{free_port}"

    def learner(run: str, total_steps: int) -> subprocess.Popen:
        return subprocess.Popen(
            [*lockstep_cmd(), "learner", "--listen", address, "--min-actors", "1", "--total-steps", str(total_steps),
             "--run-dir", str(tmp_path / run), "--no-progress"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    first = learner("run0", 10**9)
    actor = subprocess.Popen([*lockstep_cmd(), "actor", "--learner", address, "--num-envs", "2", "--retry-for", "60"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    second = None
    try:
        deadline = time.monotonic() + 60
        while len(RunDir(tmp_path / "run0").metrics()) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(RunDir(tmp_path / "run0").metrics()) >= 2
        first.kill()
        first.wait()
        time.sleep(1.0)
        second = learner("run1", 2 * 128 * 3)
        out, _ = actor.communicate(timeout=120)
        second.wait(timeout=60)
    finally:
        for proc in (first, actor, second):
            if proc is not None:
                proc.kill()
    assert actor.returncode == 0, out
    assert "lost the learner" in out and "reconnecting" in out
    summary = json.loads((tmp_path / "run1" / "summary.json").read_text())
    assert summary["iterations"] == 3


def _running(pids: list[int]) -> list[int]:
    """The processes of ``pids`` still running (a zombie has exited)."""
    running = []
    for pid in pids:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z":
                running.append(pid)
        except FileNotFoundError:  # gone
            pass
    return running


def test_learner_killed_and_resumed_continues_iteration_version_and_metrics(tmp_path):
    run_dir = tmp_path / "run"
    args = ["--total-steps", str(512 * 14), "--no-progress"]
    first = subprocess.Popen(
        [*lockstep_cmd(), "train", "--config", "cartpole-cleanrl", "--run-dir", str(run_dir),
         "--checkpoint-every", "1", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(RunDir(run_dir).metrics()) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        actors = actor_pids(first.pid)
        first.kill()  # SIGKILL: no final checkpoint, no summary
        first.wait()
    finally:
        first.kill()
    killed_at = len(RunDir(run_dir).metrics())
    assert killed_at >= 5
    assert not (run_dir / "summary.json").exists()
    deadline = time.monotonic() + 30  # however loaded the machine: the actors notice their learner is gone
    while _running(actors) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(actors), "actors outlived their learner"

    resumed = subprocess.run([*lockstep_cmd(), "train", "--resume", str(run_dir), *args],
                             capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from" in resumed.stderr
    rows = RunDir(run_dir).metrics()
    assert [int(r["iteration"]) for r in rows] == list(range(1, 15))
    assert [int(r["policy_version"]) for r in rows] == list(range(14))
    assert [int(r["env_steps"]) for r in rows] == [512 * i for i in range(1, 15)]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations"] == 14 and summary["policy_version"] == 14
    assert summary["resumed_from"].startswith("checkpoints/iter_")
    assert len(list((run_dir / "checkpoints").glob("iter_*.pt"))) == 3  # keep_checkpoints


SLOW_ENV = '''
import time
import gymnasium as gym


class Slow(gym.Wrapper):
    def step(self, action):
        time.sleep({delay})
        return self.env.step(action)


def make(**kwargs):
    return Slow(gym.make("CartPole-v1", **kwargs))
'''


def test_phase_cutoff_closes_phases_without_waiting_for_a_slow_actor(tmp_path, free_port):
    (tmp_path / "slowenv.py").write_text(SLOW_ENV.format(delay=0.03))
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    address = f"127.0.0.1:{free_port}"
    learner = subprocess.Popen(
        [*lockstep_cmd(), "learner", "--listen", address, "--min-actors", "3", "--steps-per-env", "64",
         "--total-steps", str(3 * 2 * 64 * 6), "--phase-cutoff", "0.6", "--min-unroll", "0.25", "--audit",
         "--run-dir", str(tmp_path / "run"), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    actors = [subprocess.Popen([*lockstep_cmd(), "actor", "--learner", address, "--num-envs", "2",
                                "--actor-id", str(i), "--env", "slowenv:make" if i == 2 else "CartPole-v1"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
              for i in range(3)]
    try:
        out, _ = learner.communicate(timeout=180)
        for actor in actors:
            actor.wait(timeout=60)
    finally:
        for proc in (learner, *actors):
            proc.kill()
    assert learner.returncode == 0, out
    rows = RunDir(tmp_path / "run").metrics()
    steps = [int(r["env_steps"]) for r in rows]
    batch_sizes = [b - a for a, b in zip([0, *steps], steps)]
    full = 3 * 2 * 64
    assert all(size < full for size in batch_sizes), batch_sizes  # the slow actor's unrolls were cut short ...
    assert all(size >= 2 * 2 * 64 + 2 * 16 for size in batch_sizes), batch_sizes  # ... but not below min_unroll
    assert all(int(r["off_policy_samples"]) == 0 for r in rows)
    lengths = np.load(tmp_path / "run" / "audit" / "batch_000001.npz")["lengths"]
    assert list(lengths[:4]) == [64] * 4 and 16 <= lengths[4] == lengths[5] < 64
    report = audit.check(tmp_path / "run")
    assert report.differing == 0 and report.exit_code == 0
