"""Pixel workloads end to end: Atari frames and MinAtar grids travel as uint8 over the same-host
transport and over gRPC, the CNN acts on them on the learner, and the audit recomputes every
log-prob from the frames it stored."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import lockstep_cmd

from lockstep.tools import audit

pytestmark = pytest.mark.slow


def _train(run_dir: Path, *args: str) -> str:
    result = subprocess.run([*lockstep_cmd(), "train", *args, "--audit", "--run-dir", str(run_dir), "--no-progress"],
                            capture_output=True, text=True, timeout=240)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log
    return log


def _stored_frames(run_dir: Path) -> np.ndarray:
    with np.load(run_dir / "audit" / "batch_000001.npz") as data:
        return data["obs"]


def test_atari_trains_on_uint8_frames_through_the_nature_cnn_over_shared_memory(tmp_path):
    pytest.importorskip("ale_py")
    run_dir = tmp_path / "breakout"
    log = _train(run_dir, "--config", "breakout", "--transport", "shm", "--actors", "1", "--envs-per-actor", "2",
                 "--steps-per-env", "32", "--total-steps", str(2 * 32 * 2))
    assert "connected to unix:" in log
    frames = _stored_frames(run_dir)
    assert frames.dtype == np.uint8 and frames.shape == (32, 2, 4, 84, 84)
    assert frames.max() > 0  # real frames, not zeros
    assert "nature-cnn" in (run_dir / "config.yaml").read_text()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == 128 and summary["off_policy_samples"] == 0
    report = audit.check(run_dir)
    assert report.exit_code == 0 and report.differing == 0, audit.format_report(report)


def test_minatar_trains_on_uint8_grids_through_the_small_cnn_over_grpc(tmp_path):
    pytest.importorskip("minatar")
    run_dir = tmp_path / "minatar"
    log = _train(run_dir, "--config", "minatar-breakout", "--transport", "grpc", "--actors", "2",
                 "--envs-per-actor", "2", "--steps-per-env", "32", "--total-steps", str(4 * 32 * 3))
    assert "connected to 127.0.0.1:" in log
    frames = _stored_frames(run_dir)
    assert frames.dtype == np.uint8 and frames.shape[:3] == (32, 4, 4) and frames.shape[3:] == (10, 10)
    assert set(np.unique(frames)) <= {0, 1}
    report = audit.check(run_dir)
    assert report.exit_code == 0 and len(report.iterations) == 3, audit.format_report(report)
