"""``sync.strategy async`` in real runs: CartPole over the in-process transport with ``sync.max_lag`` 2 trains on
lagged samples with V-trace (on by default in async mode), reports the lag's distribution and how many samples
V-trace truncated (metrics.csv, TensorBoard, summary.json), and passes the audit, whose lag histogram agrees with
the trainer's; so does a run of two recurrent policies, each corrected by its own trainer; with ``ppo.vtrace``
false nothing is truncated or reported."""

from __future__ import annotations

from conftest import learner_config
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lockstep import config as config_lib
from lockstep.launch.local import train
from lockstep.observe.run_dir import RunDir
from lockstep.tools import audit

T = 16
ITERATIONS = 6


def _async_config(**changes) -> config_lib.Config:
    return learner_config({"actors.transport": "inprocess", "actors.count": 2, "actors.envs_per_actor": 2,
                           "ppo.steps_per_env": T, "ppo.total_steps": ITERATIONS * 2 * 2 * T,
                           "sync.strategy": "async", "sync.max_lag": 2, "run.audit": True, "learner.device": "cpu",
                           **changes})


def test_an_async_run_corrects_with_vtrace_reports_its_lag_and_passes_its_audit(tmp_path):
    run_dir = tmp_path / "run"
    summary = train(_async_config(), run_dir)
    assert summary["error"] is None and summary["iterations"] == ITERATIONS
    rows = RunDir(run_dir).metrics()
    lagged = [row for row in rows if row["policy_lag_max"] > 0]
    assert lagged, "an async run trains on samples of older versions"
    # the lag's distribution: the run's histogram counts every trained sample, within the bound; per row the
    # percentiles lie between 0 and the row's max, and the share at the bound is a fraction
    counts = summary["policy_lag_counts"]
    assert sum(counts) == summary["transitions_trained"] and 2 <= len(counts) <= 3 and counts[-1] > 0
    for row in rows:
        assert 0 <= row["policy_lag_p50"] <= row["policy_lag_p90"] <= row["policy_lag_max"] <= 2
        assert 0.0 <= row["policy_lag_at_bound"] <= 1.0
    assert any(row["policy_lag_at_bound"] > 0.0 for row in rows) == (len(counts) == 3)
    assert all(0.0 <= row["vtrace_truncated"] <= 1.0 for row in rows)
    assert all(row["vtrace_truncated"] == 0.0 for row in rows if row["policy_lag_max"] == 0)  # every ratio is 1
    assert any(row["vtrace_truncated"] > 0.0 for row in lagged)
    assert 0.0 < summary["vtrace_truncated"] <= 1.0
    events = EventAccumulator(str(run_dir))
    events.Reload()
    assert len(events.Scalars("lockstep/vtrace_truncated")) == ITERATIONS
    assert len(events.Scalars("lockstep/policy_lag/1")) == len([row for row in rows if row["policy_lag_max"] >= 1])
    report = audit.check(run_dir)
    assert report.exit_code == 0, audit.format_report(report)
    assert report.lag_counts == counts  # the audit's histogram, from the trail, is the trainer's
    assert "lag (versions: samples): 0:" in audit.format_report(report)


def test_an_async_run_without_vtrace_trains_uncorrected_and_reports_no_truncation(tmp_path):
    run_dir = tmp_path / "run"
    summary = train(_async_config(**{"ppo.vtrace": False}), run_dir)
    assert summary["error"] is None and summary["iterations"] == ITERATIONS
    assert "vtrace_truncated" not in summary and summary["policy_lag_max"] > 0
    assert all(row["vtrace_truncated"] is None for row in RunDir(run_dir).metrics())
    assert audit.check(run_dir).exit_code == 0


def test_two_recurrent_policies_with_vtrace_each_report_and_pass_their_audits(tmp_path):
    run_dir = tmp_path / "run"
    config = learner_config({"env.id": "pettingzoo:lockstep.envs.kinds", "actors.transport": "inprocess",
                             "actors.count": 2, "actors.envs_per_actor": 2, "ppo.steps_per_env": T,
                             "ppo.total_steps": 4 * 2 * 2 * 3 * T, "model.hidden": [16], "model.lstm_size": 4,
                             "sync.strategy": "async", "sync.max_lag": 2, "run.audit": True,
                             "learner.device": "cpu"})
    config.policies = config_lib.from_dict(
        {"policies": {"scouts": {"agents": ["scout_*"]}, "pilots": {"agents": ["pilot_*"]}}}).policies
    summary = train(config, run_dir)
    assert summary["error"] is None and summary["iterations"] == 4
    rows = RunDir(run_dir).metrics()
    assert all(0.0 <= row["vtrace_truncated"] <= 1.0 for row in rows)
    assert any(row["vtrace_truncated"] > 0.0 for row in rows if row["policy_lag_max"] > 0)
    for policy in ("scouts", "pilots"):
        report = audit.check(run_dir, policy=policy)
        assert report.exit_code == 0, audit.format_report(report)
