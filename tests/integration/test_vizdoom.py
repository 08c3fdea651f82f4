"""VizDoom as users run it: the doom-basic and doom-health presets train over the real actor path (an actor
process stepping ViZDoom's games, shared memory or gRPC to the learner), their RGB frames travel as uint8
[3, 72, 128], the recurrent policy acts on them, and the audit recomputes every log-prob from what it stored."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import lockstep_cmd

from lockstep.learner import checkpoint
from lockstep.tools import audit

pytestmark = pytest.mark.slow
pytest.importorskip("vizdoom")


def _train_two_iterations(run_dir: Path, preset: str, transport: str) -> dict[str, np.ndarray]:
    """``lockstep train --config PRESET`` cut to 1 actor x 2 envs x 8 steps, 2 iterations, audited; the frames
    and the rest of the first batch the audit stored."""
    result = subprocess.run([*lockstep_cmd(), "train", "--config", preset, "--transport", transport, "--actors", "1",
                             "--envs-per-actor", "2", "--steps-per-env", "8", "--total-steps", str(2 * 2 * 8),
                             "--audit", "--run-dir", str(run_dir), "--no-progress"],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    with (run_dir / "metrics.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert [int(row["env_steps"]) for row in rows] == [16, 32]
    summary = json.loads((run_dir / "summary.json").read_text())
    # the presets train pipelined: a sample may lag by one version, never more
    assert summary["status"] == "completed" and summary["sync"] == "pipelined" and summary["policy_lag_max"] <= 1
    report = audit.check(run_dir)
    assert report.exit_code == 0 and report.differing == 0 and len(report.iterations) == 2, audit.format_report(
        report)
    with np.load(run_dir / "audit" / "batch_000001.npz") as data:
        return {key: data[key] for key in data.files}


def test_doom_basic_trains_on_rgb_frames_through_the_cnn_and_gru_over_shared_memory(tmp_path):
    stored = _train_two_iterations(tmp_path / "basic", "doom-basic", "shm")
    frames = stored["obs"]
    assert frames.dtype == np.uint8 and frames.shape == (8, 2, 3, 72, 128) and frames.std() > 0
    assert stored["initial_state"].shape == (2, 512)  # the GRU's h of each slot
    assert set(np.unique(stored["actions"])) <= {0, 1, 2, 3}
    # the preset normalizes each pixel (env.normalize_images): the checkpoint keeps a mean and variance per pixel,
    # fitted to the frames trained on, and the audit above recomputed every log-prob through them
    mean = checkpoint.load(tmp_path / "basic" / "checkpoints" / "final.pt")["trainer"]["obs_rms"]["mean"]
    assert mean.shape == (3, 72, 128) and 0 < mean.min() < mean.max() < 255


def test_doom_health_sends_its_health_beside_the_screen_over_grpc(tmp_path):
    stored = _train_two_iterations(tmp_path / "health", "doom-health", "grpc")
    assert stored["obs/screen"].shape == (8, 2, 3, 72, 128) and stored["obs/screen"].dtype == np.uint8
    health = stored["obs/vars"]
    assert health.shape == (8, 2, 1) and health.dtype == np.float32 and 0 < health.min() <= health.max() <= 100
