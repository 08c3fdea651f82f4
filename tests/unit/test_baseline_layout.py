"""The in-process baseline runs the learner's slot layout: for the same config and seed, a strict learner
and the baseline learn the same curve, so ``bench learn`` and ``bench throughput`` compare speed alone.
With an LSTM too: the baseline carries each slot's state as a session does."""

from __future__ import annotations

import math

import pytest
from lockstep_bench import baseline

from lockstep.config import Config
from lockstep.launch.local import train
from lockstep.observe.run_dir import RunDir

ITERATIONS = 12


def _config(lstm_size: int) -> Config:
    config = Config()
    config.model.lstm_size = lstm_size
    config.actors.count, config.actors.envs_per_actor = 2, 3  # actor 1's slots after actor 0's, in both
    config.ppo.steps_per_env, config.ppo.total_steps = 16, 2 * 3 * 16 * ITERATIONS
    config.ppo.lr = 1e-2  # large, so that the policy (and with it every later episode) changes each update
    config.actors.transport = "inprocess"
    config.learner.device = "cpu"
    config.run.progress = False
    config.run.thresholds = []
    return config


@pytest.mark.parametrize("lstm_size", [0, 8], ids=["mlp", "lstm"])
def test_a_strict_learner_and_the_baseline_with_the_same_layout_learn_the_same_curve(tmp_path, lstm_size):
    summary = train(_config(lstm_size), tmp_path / "run")
    rows = RunDir(tmp_path / "run").metrics()
    result = baseline.run(_config(lstm_size))

    assert summary["iterations"] == result["iterations"] == ITERATIONS
    assert summary["episodes"] == result["episodes"] > 20
    learner = [r["episode_return_mean20"] for r in rows]
    ours = [r for _, _, r in result["curve"]]
    assert sum(r is not None for r in ours) >= ITERATIONS // 2  # enough episodes to compare running means
    for i, (a, b) in enumerate(zip(learner, ours, strict=True)):
        assert (a is None) == (b is None), f"iteration {i + 1}: {a} vs {b}"
        assert a is None or a == pytest.approx(b, abs=0.006), f"iteration {i + 1}: learner {a}, baseline {b}"
    assert math.isclose(summary["episode_return_mean"], result["episode_return_mean"], abs_tol=1e-6)
