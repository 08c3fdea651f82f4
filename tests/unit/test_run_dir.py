"""The run-directory reader: what ``MetricsWriter`` writes comes back typed, a row being written is left out,
and summary.json and config.yaml read back as the run wrote them."""

from __future__ import annotations

import json
import math

import pytest

from lockstep import config as config_lib
from lockstep.observe.metrics import COLUMNS, MetricsWriter
from lockstep.observe.run_dir import INTEGER_COLUMNS, NotARunDir, RunDir


def _write(run_dir, rows: list[dict]) -> None:
    writer = MetricsWriter(run_dir, tensorboard=False)
    for row in rows:
        writer.write(row)
    writer.close()


def _row(iteration: int, **values) -> dict:
    return {"iteration": iteration, "policy_version": iteration - 1, "env_steps": 96 * iteration, "wall_s": 1.5,
            "episode_return_mean20": math.nan, "policy_lag_max": 0, "lr": 2.5e-4, **values}


def test_counting_columns_are_ints_the_others_floats_and_empty_cells_none(tmp_path):
    _write(tmp_path, [_row(1), _row(2, episode_return_mean20=17.25)])
    rows = RunDir(tmp_path).metrics()
    assert [r["iteration"] for r in rows] == [1, 2] and [r["env_steps"] for r in rows] == [96, 192]
    assert all(type(rows[1][c]) is int for c in ("iteration", "policy_version", "env_steps", "policy_lag_max"))
    assert type(rows[1]["wall_s"]) is float and rows[1]["lr"] == 2.5e-4
    assert rows[0]["episode_return_mean20"] is None and rows[1]["episode_return_mean20"] == 17.25
    assert rows[0]["actors"] is None  # a column the row did not fill
    assert RunDir(tmp_path).column("env_steps") == [96, 192]
    assert INTEGER_COLUMNS <= set(COLUMNS)


def test_a_row_still_being_written_is_left_out_and_no_file_is_no_rows(tmp_path):
    assert RunDir(tmp_path).metrics() == []
    _write(tmp_path, [_row(1), _row(2)])
    with (tmp_path / "metrics.csv").open("a") as f:
        f.write("3,2,28")  # the learner is writing row 3: env_steps 288 is not all there yet
    assert [r["iteration"] for r in RunDir(tmp_path).metrics()] == [1, 2]


def test_summary_and_config_read_back_as_written(tmp_path):
    run = RunDir(tmp_path)
    assert run.summary() is None and run.config_dict() == {}
    with pytest.raises(NotARunDir, match=r"no config\.yaml in .*not a lockstep run directory"):
        run.config()
    config = config_lib.Config()
    config.env.id, config.ppo.steps_per_env = "Pendulum-v1", 64
    config_lib.save(config, run.config_path)
    (tmp_path / "summary.json").write_text(json.dumps({"env_steps": 192, "first_reached": {"475": None}}))
    assert run.config().env.id == "Pendulum-v1" and run.config().ppo.steps_per_env == 64
    assert run.config_dict()["env"]["id"] == "Pendulum-v1"
    assert run.summary() == {"env_steps": 192, "first_reached": {"475": None}}
    with pytest.raises(NotARunDir, match="no metrics.csv"):
        run.columns()
