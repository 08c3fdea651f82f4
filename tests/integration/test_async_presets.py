"""Every preset family trains in async mode: each one's preset, shrunk to a few tiny iterations (one actor of two
envs, unrolls of 8 steps, one epoch), with ``--sync async --max-lag 2`` and V-trace (async's default), over the
in-process transport; the run completes, no sample lags beyond the bound, and ``lockstep audit`` passes every
policy's trail. The families: masks with an LSTM, continuous actions, MuJoCo, MinAtar, Atari frames, MiniGrid,
several policies, MAPPO's centralized critic, self-play, VizDoom frames with an LSTM."""

from __future__ import annotations

import pytest

from lockstep import config as config_lib
from lockstep.launch.local import train
from lockstep.tools import audit

pytestmark = pytest.mark.slow

FAMILIES = ["cartpole-masked-lstm", "pendulum", "hopper", "minatar-breakout", "breakout", "minigrid-doorkey",
            "mpe-tag", "mpe-spread-mappo", "connect-four", "doom-basic"]
T = 8


@pytest.mark.parametrize("preset", FAMILIES)
def test_each_preset_family_trains_in_async_mode_and_passes_its_audit(preset, tmp_path):
    config = config_lib.load(preset)
    config_lib.apply_sets(config, [
        "actors.count=1", "actors.envs_per_actor=2", "actors.transport=inprocess", "actors.vector=sync",
        f"ppo.steps_per_env={T}", f"ppo.total_steps={3 * 2 * T * 4}", "ppo.epochs=1", "ppo.minibatches=1",
        "sync.strategy=async", "sync.max_lag=2", "run.audit=true", "run.progress=false", "run.eval_every=0",
        "run.checkpoint_every=0", "run.stop_at_return=none", "learner.device=cpu"])
    config.validate()
    summary = train(config, tmp_path / "run")
    assert summary["error"] is None and summary["iterations"] >= 3, summary
    assert summary["sync"] == "async" and 0 <= summary["policy_lag_max"] <= 2
    assert sum(summary["policy_lag_counts"]) == summary["transitions_trained"]
    assert "vtrace_truncated" in summary
    for policy in config.policies or [None]:
        report = audit.check(tmp_path / "run", policy=policy)
        assert report.exit_code == 0, audit.format_report(report)
