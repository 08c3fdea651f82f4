"""A stop during start-up is not lost: ``Learner.stop()`` before or right after ``serve`` starts ends it within
seconds (no actor ever connects, so a lost stop would serve forever); ``lockstep train`` sent SIGTERM while it
starts (W&B's start, before the learner listens) ends promptly with exit code 143, starts no actor and leaves no
process behind (with ``--launcher ray``: the Ray instance it started is stopped)."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import lockstep_cmd, preset_config

from lockstep import config as config_lib
from lockstep.learner.wiring import Learner


def _config(run_dir: Path) -> config_lib.Config:
    return preset_config("cartpole-cleanrl", run_dir, {"learner.listen": "127.0.0.1:0"})


@pytest.mark.parametrize("before", [True, False], ids=["stop-before-serve", "stop-right-after-serve-starts"])
def test_stop_right_after_start_ends_serve_within_10_s(tmp_path, before):
    learner = Learner(_config(tmp_path / "run"), tmp_path / "run")
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(summary=learner.serve()), daemon=True)
    if before:
        learner.stop()
    thread.start()
    if not before:
        learner.stop()  # the event loop does not exist yet, or has just started
    thread.join(timeout=10)
    assert not thread.is_alive(), "the learner kept serving after stop()"
    assert outcome["summary"]["iterations"] == 0
    assert outcome["summary"]["status"] == "stopped" and outcome["summary"]["time_limited"] is True


def _descendants(pid: int) -> set[int]:
    parents = {}
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            ppid = next(line for line in status.read_text().splitlines() if line.startswith("PPid:"))
        except (OSError, StopIteration):
            continue
        parents.setdefault(int(ppid.split()[1]), set()).add(int(status.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in parents.get(todo.pop(), ()):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["local", "ray"])
def test_sigterm_while_lockstep_train_starts_ends_it_with_143(tmp_path, launcher):
    pytest.importorskip("wandb")
    if launcher == "ray":
        pytest.importorskip("ray")
    run_dir = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DISABLE_GIT": "true", "HOME": str(tmp_path),
           "RAY_ADDRESS": ""}
    proc = subprocess.Popen(
        [*lockstep_cmd(), "train", "--config", "cartpole-cleanrl", "--actors", "2", "--total-steps", "100000000",
         "--launcher", launcher, "--wandb", "--run-dir", str(run_dir), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "config.yaml").exists():  # written by serve() just before W&B starts (Ray is up)
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[0]
            time.sleep(0.01)
        started = _descendants(proc.pid)  # with Ray: its own processes
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 143, out
    assert "SIGTERM: stopping the learner" in out
    assert "Ray actor(s)" not in out and "actor process(es)" not in out  # stopped before any actor started
    deadline = time.monotonic() + 10
    while [pid for pid in started if _alive(pid)] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in started if _alive(pid)], f"left behind: {started}"
