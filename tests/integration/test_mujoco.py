"""MuJoCo end to end: `lockstep train --config halfcheetah` over a real actor process, for a few short iterations.

The actor clips Gaussian actions to the action bounds before stepping the env; the learner must keep
the unclipped sample (and its log-prob) for training, as CleanRL's ClipAction wrapper does.
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from conftest import lockstep_cmd

from lockstep.observe.run_dir import RunDir

pytest.importorskip("mujoco")

pytestmark = pytest.mark.slow


def test_halfcheetah_trains_over_an_actor_process_and_stores_the_unclipped_actions(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [*lockstep_cmd(), "train", "--config", "halfcheetah", "--run-dir", str(run_dir), "--device", "cpu",
           "--no-progress", "--audit", "--transport", "shm",
           "--set", "ppo.steps_per_env=512", "--set", "ppo.total_steps=1536"]
    # MuJoCo writes MUJOCO_LOG.TXT into the working directory: keep it in tmp_path
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env"] == "HalfCheetah-v5" and summary["error"] is None
    assert summary["iterations"] == 3 and summary["env_steps"] == 1536 and summary["off_policy_samples"] == 0
    assert summary["episodes"] >= 1 and np.isfinite(summary["episode_return_mean"])  # one 1000-step episode
    rows = RunDir(run_dir).metrics()
    assert [int(r["env_steps"]) for r in rows] == [512, 1024, 1536]
    assert rows[-1]["episode_return_mean20"] is not None and float(rows[-1]["actors"]) == 1

    batches = sorted((run_dir / "audit").glob("batch_*.npz"))
    assert len(batches) == 3
    actions = np.concatenate([np.load(b)["actions"].reshape(-1, 6) for b in batches])  # [1536, 6]
    assert actions.shape == (1536, 6)
    # A fresh policy's std is 1 around a mean near 0: about a third of the components fall outside [-1, 1].
    # The env only ever saw them clipped; the learner trains on them as sampled.
    outside = np.abs(actions) > 1.0
    assert 0.2 < outside.mean() < 0.5, outside.mean()
    # and the stored behaviour log-probs are those of the stored, unclipped actions
    audit = subprocess.run([*lockstep_cmd(), "audit", str(run_dir)], capture_output=True, text=True, timeout=120,
                           cwd=tmp_path)
    assert audit.returncode == 0 and "PASS" in audit.stdout, audit.stdout[-3000:] + audit.stderr[-3000:]
