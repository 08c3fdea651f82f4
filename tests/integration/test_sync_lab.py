"""Synchronization strategies on the real learner: real actor processes over the default same-host transport
(shared memory and a unix socket), real PPO."""

from __future__ import annotations

import pytest
from conftest import preset_config
from lockstep_bench import hooks
from lockstep_bench.reference import DESIGNS
from lockstep_bench.runs import Knobs

from lockstep import config as config_lib
from lockstep.launch.local import train
from lockstep.observe.run_dir import RunDir
from lockstep.tools import audit

pytestmark = pytest.mark.slow


def _config(tmp_path, strategy: str, **overrides) -> config_lib.Config:
    return preset_config("cartpole-cleanrl", tmp_path / "run", {"sync.strategy": strategy, **overrides})


def test_strict_with_random_delays_and_16_actors_trains_only_on_policy(tmp_path):
    config = _config(tmp_path, "strict", **{
        "actors.count": 16, "actors.envs_per_actor": 1, "ppo.steps_per_env": 16, "ppo.total_steps": 16 * 16 * 6,
        "run.audit": True,
    })
    summary = train(config, tmp_path / "run", parts=hooks.parts(Knobs(jitter_ms=3.0)))
    rows = RunDir(tmp_path / "run").metrics()
    assert len(rows) == 6
    assert summary["off_policy_samples"] == 0 and summary["torn_reads"] == 0 and summary["torn_reads_used"] == 0
    # Snapshots need no guard around inference: nothing is rejected or computed twice.
    assert summary["wasted_forward_passes"] == 0 and summary["rejected_rpcs"] == 0
    assert all(int(r["off_policy_samples"]) == 0 and int(r["policy_lag_max"]) == 0 for r in rows)
    report = audit.check(tmp_path / "run")
    assert len(report.iterations) == 6
    assert report.differing == 0 and report.off_version == 0
    assert report.exit_code == 0


@pytest.mark.parametrize("max_lag", [1, 2])
def test_pipelined_lag_stays_within_its_bound_and_cartpole_still_learns(tmp_path, max_lag):
    config = _config(tmp_path, "pipelined", **{
        "sync.max_lag": max_lag, "actors.count": 2, "actors.envs_per_actor": 4,
        "ppo.steps_per_env": 32, "ppo.lr": 1e-3, "ppo.total_steps": 80_000, "run.stop_at_return": 195,
    })
    summary = train(config, tmp_path / "run", parts=hooks.parts(Knobs(jitter_ms=2.0)))
    rows = RunDir(tmp_path / "run").metrics()
    lags = [int(r["policy_lag_max"]) for r in rows]
    assert max(lags) <= max_lag
    assert max(lags) >= 1, "collection never overlapped training: the test does not exercise pipelining"
    assert summary["policy_lag_max"] <= max_lag
    assert summary["off_policy_samples"] == sum(int(r["off_policy_samples"]) for r in rows) > 0
    assert summary["torn_reads"] == 0 and summary["wasted_forward_passes"] == 0 and summary["rejected_rpcs"] == 0
    assert summary["first_reached"]["195"] is not None, summary


@pytest.mark.parametrize("strategy", sorted(DESIGNS))
def test_reference_strategy_runs_a_short_real_training_and_reports_its_counters(tmp_path, strategy):
    config = _config(tmp_path, "strict", **{
        "actors.count": 3, "actors.envs_per_actor": 2, "ppo.steps_per_env": 16, "ppo.total_steps": 3 * 2 * 16 * 4,
        "run.time_limit_s": 30,
    })
    summary = train(config, tmp_path / "run", parts=hooks.parts(Knobs(design=strategy, inference_threads=2)))
    assert summary["error"] is None and summary["sync"] == strategy
    assert summary["iterations"] >= 1
    keys = ("wasted_forward_passes", "rejected_rpcs", "torn_reads", "torn_reads_used", "off_policy_samples", "stalls")
    for key in keys:
        assert isinstance(summary[key], int) and summary[key] >= 0
    rows = RunDir(tmp_path / "run").metrics()
    assert len(rows) == summary["iterations"]

    # metrics.csv has each iteration's increase of the run's totals in summary.json.
    for key in keys:
        assert sum(int(r[key]) for r in rows) <= summary[key], key
    assert sum(int(r["off_policy_samples"]) for r in rows) == summary["off_policy_samples"]
    assert max(int(r["policy_lag_max"]) for r in rows) == summary["policy_lag_max"]
    # Lags are measured from the versions the samples were stamped with: never from the future, never from
    # before version 0, and a sample is off-policy exactly when its lag is not 0.
    assert [int(r["policy_version"]) for r in rows] == sorted({int(r["policy_version"]) for r in rows})
    for r in rows:
        assert 0 <= int(r["policy_lag_max"]) <= int(r["policy_version"]), r
        assert (int(r["off_policy_samples"]) > 0) == (int(r["policy_lag_max"]) > 0), r
    assert summary["torn_reads_used"] <= summary["torn_reads"]

    # What each design does by construction (lockstep_bench/reference.py).
    if strategy == "spin-flags":  # waits on flags: never rejects, never throws a pass away
        assert summary["wasted_forward_passes"] == 0 and summary["rejected_rpcs"] == 0
    if strategy == "spin-redo":  # redoes a pass instead of rejecting the request
        assert summary["rejected_rpcs"] == 0
    if strategy in ("reject-retry", "seqlock"):
        # With no lag bound the actors are never held, so they keep sending steps during every PPO update
        # (each update takes tens of milliseconds, a step round trip about one): requests are rejected.
        assert summary["rejected_rpcs"] > 0
        # A pass thrown away is always answered "retry" too.
        assert summary["wasted_forward_passes"] <= summary["rejected_rpcs"]
    if strategy == "seqlock":  # the sound design: a pass that overlapped an update is never used
        assert summary["torn_reads_used"] == 0
