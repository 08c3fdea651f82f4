"""``lockstep bench soak``'s health check on crafted run directories: besides deadlocks, off-policy
samples and the transition account, a run that exited non-zero or recorded an error in
``summary.json`` is unhealthy."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from lockstep_bench import soak

from lockstep.observe.metrics import COLUMNS

HEALTHY_SUMMARY = {"transitions_collected": 1000, "transitions_trained": 960, "dropped_transitions": 40,
                   "episode_return_mean": 180.5, "error": None}


def _run_dir(tmp_path: Path, summary: dict | None, iterations: int = 3, off_policy: int = 0) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True)
    with (run_dir / "metrics.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for i in range(1, iterations + 1):
            writer.writerow({**{c: 0 for c in COLUMNS}, "iteration": i, "off_policy_samples": off_policy})
    if summary is not None:
        (run_dir / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "soak.log").write_text("restarting actor 1 (restart 1 of at most 10)\n")
    return run_dir


def _report(tmp_path: Path, summary: dict | None, exit_code: int | None = 0, **fields) -> dict:
    run_dir = _run_dir(tmp_path, summary, **fields)
    return soak.build_report(run_dir, tmp_path / "soak.log", minutes=1.0, deadlocks=0, actor_kills=2,
                             learner_restarts=1, exit_code=exit_code)


def test_a_clean_run_is_healthy(tmp_path):
    report = _report(tmp_path, HEALTHY_SUMMARY)
    assert soak.problems(report) == [] and soak.healthy(report)
    assert (report["balanced"], report["iterations"], report["actor_restarts"], report["error"]) == (True, 3, 1, None)
    assert report["healthy"] is True


def test_a_recorded_error_is_unhealthy(tmp_path):
    report = _report(tmp_path, {**HEALTHY_SUMMARY, "error": "RuntimeError('the trainer failed')"})
    assert not soak.healthy(report) and report["healthy"] is False
    assert soak.problems(report) == ["the run recorded an error: RuntimeError('the trainer failed')"]


@pytest.mark.parametrize("exit_code", [1, -9, None])
def test_a_run_that_did_not_exit_0_is_unhealthy(tmp_path, exit_code):
    report = _report(tmp_path, HEALTHY_SUMMARY, exit_code=exit_code)
    assert not soak.healthy(report)
    assert f"lockstep train exited with {exit_code}" in soak.problems(report)[0]


def test_the_earlier_criteria_still_count(tmp_path):
    assert "no summary.json" in " ".join(soak.problems(_report(tmp_path / "a", None)))
    report = _report(tmp_path / "b", {**HEALTHY_SUMMARY, "dropped_transitions": 39}, off_policy=2)
    assert soak.problems(report) == ["6 off-policy sample(s)",
                                     "transitions do not balance: collected 1000 != trained 960 + dropped 39"]
    report["deadlocks"] = 1
    assert soak.problems(report)[0] == "1 deadlock(s)"
