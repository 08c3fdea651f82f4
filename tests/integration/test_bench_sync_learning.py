"""``lockstep bench sync --learning`` at a tiny budget: each run is a real ``lockstep train`` over shared memory, its
row carries the figures the table compares (steps/s, the actors' held share, returns at equal steps and seconds,
the lag, V-trace's truncation), and learning.md, learning.json and the curves are written."""

from __future__ import annotations

import json

import pytest
from lockstep_bench import sync_learning
from lockstep_bench.sync_learning import LearningOptions

pytestmark = pytest.mark.slow


def test_the_learning_benchmark_runs_each_config_and_reports_what_it_compares(tmp_path):
    options = LearningOptions(workloads=["cartpole"], configs=["strict", "async-2"], seeds=[1], scale=0.03)
    report = sync_learning.run(options, tmp_path, "lockstep bench sync --learning (test)")
    rows = {row["config"]: row for row in report["runs"]}
    assert set(rows) == {"strict", "async-2"} and not any(row["error"] for row in rows.values()), rows
    strict, lagged = rows["strict"], rows["async-2"]
    assert strict["env_steps"] == lagged["env_steps"] >= 3_000  # one budget: returns compare at equal steps
    assert (strict["lag_max"], strict["vtrace_truncated"]) == (0, None)  # strict: no lag, no V-trace
    assert 0 <= lagged["lag_max"] <= 2 and lagged["vtrace_truncated"] is not None
    for row in rows.values():
        assert 0.0 <= row["held_fraction"] <= 1.0 and row["sps"] > 0
        assert row["return_end"] is not None and row["return_at_equal_s"] is not None
        assert row["equal_s"] == min(strict["wall_s"], lagged["wall_s"])
    written = json.loads((tmp_path / "learning.json").read_text())
    assert [(t["workload"], t["config"], t["runs"]) for t in written["table"]] == [
        ("cartpole", "strict", 1), ("cartpole", "async-2", 1)]
    table = (tmp_path / "learning.md").read_text()
    assert "| cartpole | strict | 1 |" in table and "| cartpole | async-2 | 1 |" in table
    assert report["curves"] == ["learning-cartpole.png"] and (tmp_path / "learning-cartpole.png").stat().st_size
    again = sync_learning.rebuild(tmp_path)  # the table again from the runs' files, each run's load kept
    assert [(r["config"], r["return_end"], r["loadavg_1m"]) for r in again["runs"]] == [
        (r["config"], r["return_end"], r["loadavg_1m"]) for r in report["runs"]]
