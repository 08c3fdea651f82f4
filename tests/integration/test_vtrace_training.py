"""``ppo.vtrace`` in a real pipelined run: CartPole over the in-process transport with ``sync.max_lag`` 2 trains on
lagged samples, reports how many V-trace truncated (metrics.csv, TensorBoard, summary.json), and passes the
audit; so does a run of two recurrent policies, each corrected by its own trainer."""

from __future__ import annotations

from conftest import learner_config
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lockstep import config as config_lib
from lockstep.launch.local import train
from lockstep.observe.run_dir import RunDir
from lockstep.tools import audit

T = 16
ITERATIONS = 6


def test_a_pipelined_run_with_vtrace_reports_truncated_samples_and_passes_its_audit(tmp_path):
    run_dir = tmp_path / "run"
    config = learner_config({"actors.transport": "inprocess", "actors.count": 2, "actors.envs_per_actor": 2,
                             "ppo.steps_per_env": T, "ppo.total_steps": ITERATIONS * 2 * 2 * T,
                             "sync.strategy": "pipelined", "sync.max_lag": 2, "ppo.vtrace": True,
                             "run.audit": True, "learner.device": "cpu"})
    summary = train(config, run_dir)
    assert summary["error"] is None and summary["iterations"] == ITERATIONS
    rows = RunDir(run_dir).metrics()
    lagged = [row for row in rows if row["policy_lag_max"] > 0]
    assert lagged, "a pipelined run trains on samples of older versions"
    assert all(0.0 <= row["vtrace_truncated"] <= 1.0 for row in rows)
    assert all(row["vtrace_truncated"] == 0.0 for row in rows if row["policy_lag_max"] == 0)  # every ratio is 1
    assert any(row["vtrace_truncated"] > 0.0 for row in lagged)
    assert 0.0 < summary["vtrace_truncated"] <= 1.0
    events = EventAccumulator(str(run_dir))
    events.Reload()
    assert len(events.Scalars("lockstep/vtrace_truncated")) == ITERATIONS
    report = audit.check(run_dir)
    assert report.exit_code == 0, audit.format_report(report)
    assert max(it.lag_max for it in report.iterations) == 2


def test_two_recurrent_policies_with_vtrace_each_report_and_pass_their_audits(tmp_path):
    run_dir = tmp_path / "run"
    config = learner_config({"env.id": "pettingzoo:lockstep.envs.kinds", "actors.transport": "inprocess",
                             "actors.count": 2, "actors.envs_per_actor": 2, "ppo.steps_per_env": T,
                             "ppo.total_steps": 4 * 2 * 2 * 3 * T, "model.hidden": [16], "model.lstm_size": 4,
                             "sync.strategy": "pipelined", "sync.max_lag": 2, "ppo.vtrace": True,
                             "run.audit": True, "learner.device": "cpu"})
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
