"""A stop during start-up is not lost: ``Learner.stop()`` before or right after ``serve`` starts ends it within
seconds (no actor ever connects, so a lost stop would serve forever); ``lockstep train`` sent SIGTERM while it
starts (W&B's start, before the learner listens) ends promptly with exit code 143 and leaves no actor behind."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import lockstep_cmd

from lockstep import config as config_lib
from lockstep.learner.wiring import Learner


def _config(run_dir: Path) -> config_lib.Config:
    config = config_lib.load("cartpole-cleanrl")
    config.learner.listen = "127.0.0.1:0"
    config.run.progress, config.run.run_dir = False, str(run_dir)
    return config


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


def _children(pid: int) -> set[int]:
    found = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        if int(fields.get("PPid", "0").strip()) == pid:
            found.add(int(status.parent.name))
    return found


@pytest.mark.slow
def test_sigterm_while_lockstep_train_starts_ends_it_with_143(tmp_path):
    pytest.importorskip("wandb")
    run_dir = tmp_path / "run"
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DISABLE_GIT": "true", "HOME": str(tmp_path)}
    proc = subprocess.Popen(
        [*lockstep_cmd(), "train", "--config", "cartpole-cleanrl", "--actors", "2", "--total-steps", "100000000",
         "--wandb", "--run-dir", str(run_dir), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "config.yaml").exists():  # written by serve() just before W&B starts
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()[0]
            time.sleep(0.01)
        actors = _children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=90)
    finally:
        proc.kill()
    assert proc.returncode == 143, out
    assert "SIGTERM: stopping the learner" in out
    assert not (run_dir / "metrics.csv").exists() or len((run_dir / "metrics.csv").read_text().splitlines()) <= 2
    time.sleep(0.5)
    assert not [pid for pid in actors if Path(f"/proc/{pid}").exists()
                and "zombie" not in Path(f"/proc/{pid}/status").read_text()], "actors left behind"
