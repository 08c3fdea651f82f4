"""The run's books across faults: metrics rows, checkpoints and the transition account.

collected = trained + dropped must hold at the end of every run, whatever stopped or
resumed it, and metrics.csv must hold each iteration's increase exactly once.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time

import numpy as np
import pytest
from conftest import lockstep_cmd

from lockstep.config import Config
from lockstep.launch.local import train
from lockstep.learner import RunFailed, checkpoint
from lockstep.learner.rollout import Batch, TrainingPhase
from lockstep.learner.wiring import Learner
from lockstep.observe.metrics import MetricsWriter
from lockstep.observe.run_dir import RunDir

pytestmark = pytest.mark.slow

INCREASE_COLUMNS = ("dropped_transitions", "stalls", "wasted_forward_passes", "rejected_rpcs", "torn_reads",
                    "torn_reads_used")


def _small_config(run_dir) -> Config:
    config = Config()
    config.actors.count, config.actors.envs_per_actor = 2, 4
    config.ppo.steps_per_env, config.ppo.total_steps = 16, 10**9
    config.run.progress = False
    config.run.run_dir = str(run_dir)
    config.run.checkpoint_every = 1
    return config


def test_a_checkpoint_never_claims_an_iteration_whose_metrics_row_was_not_written(tmp_path, monkeypatch):
    """The learner dies while writing row 3: the newest checkpoint must not be at iteration 3."""
    write = MetricsWriter.write

    def failing_write(self, row):
        if row["iteration"] == 3:
            raise OSError("disk full (injected)")
        write(self, row)

    monkeypatch.setattr(MetricsWriter, "write", failing_write)
    run_dir = tmp_path / "run"
    with pytest.raises(RunFailed, match="injected") as failed:  # the learner's own error ends the run
        train(_small_config(run_dir), run_dir)
    assert isinstance(failed.value.__cause__, OSError)
    rows = RunDir(run_dir).metrics()
    assert [int(r["iteration"]) for r in rows] == [1, 2]
    periodic = sorted(p.name for p in (run_dir / "checkpoints").glob("iter_*.pt"))
    assert periodic == ["iter_000001.pt", "iter_000002.pt"]


def test_pipelined_run_killed_and_resumed_balances_its_books_and_counts_each_increase_once(tmp_path):
    run_dir = tmp_path / "run"
    args = ["--env", "CartPole-v1", "--actors", "2", "--envs-per-actor", "4", "--steps-per-env", "16",
            "--total-steps", str(2 * 4 * 16 * 16), "--sync", "pipelined", "--no-progress"]
    first = subprocess.Popen([*lockstep_cmd(), "train", *args, "--run-dir", str(run_dir), "--checkpoint-every", "1"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(RunDir(run_dir).metrics()) < 6 and time.monotonic() < deadline:
            time.sleep(0.02)
        first.kill()  # SIGKILL while the next phase is being collected
        first.wait()
    finally:
        first.kill()
    saved = checkpoint.load(checkpoint.find(run_dir / "checkpoints"))
    in_flight = (saved["counters"]["transitions_collected"] - saved["trainer"]["env_steps"]
                 - saved["counters"]["dropped_transitions"])
    assert in_flight > 0, "pipelined mode collects while it trains: the checkpoint should have work in flight"

    resumed = subprocess.run([*lockstep_cmd(), "train", "--resume", str(run_dir), *args],
                             capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["transitions_collected"] == summary["transitions_trained"] + summary["dropped_transitions"]
    rows = RunDir(run_dir).metrics()
    assert [int(r["iteration"]) for r in rows] == list(range(1, summary["iterations"] + 1))
    for column in INCREASE_COLUMNS:  # each row holds its iteration's increase, so the column adds up to the total
        assert sum(int(r[column]) for r in rows) <= summary[column], column
    # The work lost with the killed process is dropped, and nothing else was, so the column adds up exactly
    # up to what the final discard of the last phase in flight adds after the last row.
    final_discard = summary["dropped_transitions"] - sum(int(r["dropped_transitions"]) for r in rows)
    assert 0 <= final_discard <= 2 * 2 * 4 * 16


def test_a_closed_phase_taken_after_the_learner_stopped_counts_as_dropped(tmp_path):
    config = _small_config(tmp_path / "run")
    learner = Learner(config, tmp_path / "run")
    T, N = 16, 8
    batch = Batch(version=0, members=(0, 1), slots_per_member=(4, 4), obs=np.zeros((T, N, 4), np.float32),
                  actions=np.zeros((T, N), np.int64), logprobs=np.zeros((T, N), np.float32),
                  values=np.zeros((T, N), np.float32), rewards=np.zeros((T, N), np.float32),
                  terminated=np.zeros((T, N), bool), truncated=np.zeros((T, N), bool),
                  versions=np.zeros((T, N), np.int64), bootstrap_obs=np.zeros((N, 4), np.float32),
                  lengths=np.full(N, T, np.int64))
    learner.sessions.finish()  # stopped from outside ...
    learner.phases._closed.put(TrainingPhase(0, batch, 0.1))  # ... just as a phase had closed
    learner.phases.stop()
    trainer = threading.Thread(target=learner._train_loop)
    trainer.start()
    trainer.join(timeout=10)
    assert learner.trainer.env_steps == 0
    assert learner.report.counters.dropped_transitions == T * N
