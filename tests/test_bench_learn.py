"""``lockstep bench learn``: the threshold it trains to, its medians, and a tiny end-to-end run of both modes."""

from __future__ import annotations

import json
import math
import subprocess

import pytest
import yaml
from conftest import lockstep_cmd

from lockstep import config as config_lib
from lockstep.bench import learn

RUN_KEYS = set(learn.RUN_KEYS)


def test_the_threshold_is_the_configs_stop_at_return_else_the_envs_reward_threshold():
    config = config_lib.Config()
    assert learn.threshold_of(config) == (475.0, "reward_threshold of CartPole-v1")
    config.run.stop_at_return = 200
    assert learn.threshold_of(config) == (200.0, "run.stop_at_return")


def test_an_env_without_a_threshold_asks_for_stop_at_return():
    config = config_lib.Config()
    config.env.id = "Pendulum-v1"
    with pytest.raises(config_lib.ConfigError, match=r"Pendulum-v1 .* run\.stop_at_return"):
        learn.threshold_of(config)


def test_both_modes_train_to_the_threshold_and_record_it():
    config, threshold, source = learn.build_config(learn.LearnOptions(source="cartpole-cleanrl"))
    assert (threshold, source) == (475.0, "reward_threshold of CartPole-v1")
    assert config.run.stop_at_return == 475.0 and 475.0 in config.run.thresholds
    assert config.run.time_limit_s == learn.DEFAULT_TIME_LIMIT_S and not config.run.progress


def test_transport_passes_through_to_the_distributed_runs():
    assert learn.build_config(learn.LearnOptions(transport="grpc"))[0].learner.transport == "grpc"
    default = learn.build_config(learn.LearnOptions())[0].learner.transport
    assert default == config_lib.load(config_lib.DEFAULT_PRESET).learner.transport
    with pytest.raises(config_lib.ConfigError, match=r"learner\.transport"):
        learn.build_config(learn.LearnOptions(transport="pigeon"))


def _row(mode: str, seconds: float | None, steps: int | None) -> dict:
    return {"mode": mode, "reached": seconds is not None, "seconds_to_threshold": seconds,
            "env_steps_to_threshold": steps}


def test_medians_count_a_run_that_never_reached_as_infinitely_slow():
    runs = [_row("distributed", 8.0, 100), _row("in-process", 4.0, 90),
            _row("distributed", None, None), _row("in-process", 5.0, 110),
            _row("distributed", 6.0, 80), _row("in-process", 3.0, 70)]
    summary = learn.summarize(runs)
    assert summary["distributed"] == {"runs": 3, "reached": 2, "median_seconds_to_threshold": 8.0,
                                      "median_env_steps_to_threshold": 100}
    assert summary["in-process"]["median_seconds_to_threshold"] == 4.0
    assert summary["ratio_seconds"] == 2.0 and summary["ratio_env_steps"] == round(100 / 90, 3)
    assert learn._median([None, None, 1.0]) is None and not math.isinf(learn._median([1.0, 2.0]))


@pytest.mark.slow
def test_bench_learn_runs_both_modes_per_seed_and_writes_both_files(tmp_path):
    config_path = tmp_path / "tiny.yaml"
    config_path.write_text(yaml.safe_dump({
        "env": {"id": "CartPole-v1", "actors": 1, "envs_per_actor": 4},
        "ppo": {"steps_per_env": 16, "total_steps": 2048},
        "learner": {"device": "cpu"},
        "run": {"stop_at_return": 15},  # a random policy's running mean is about 20
    }))
    out = tmp_path / "out"
    result = subprocess.run([*lockstep_cmd(), "bench", "learn", "--config", str(config_path), "--seeds", "1",
                             "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "learn.json").read_text())
    assert {"command", "config", "env", "threshold", "threshold_source", "transport", "seeds", "summary", "runs",
            "loadavg_at_start"} <= set(report)
    assert report["threshold"] == 15 and report["threshold_source"] == "run.stop_at_return"
    assert report["command"].startswith("lockstep bench learn --config")
    assert [(r["seed"], r["mode"]) for r in report["runs"]] == [(1, "distributed"), (1, "in-process")]
    for run in report["runs"]:
        assert set(run) == RUN_KEYS
        assert run["error"] is None and run["reached"] is True, run
        assert run["seconds_to_threshold"] >= 0 and run["env_steps_to_threshold"] > 0
        assert run["final_return"] is not None and run["loadavg_1m"] is not None and run["command"]
    for mode in learn.MODES:
        assert report["summary"][mode]["reached"] == 1
        assert report["summary"][mode]["median_seconds_to_threshold"] is not None
    assert report["summary"]["ratio_seconds"] is not None
    text = (out / "learn.md").read_text()
    assert "| seed | mode | reached | seconds to 15 |" in text and "Distributed / in-process" in text


@pytest.mark.slow
def test_train_without_thresholds_reports_the_envs_reward_threshold(tmp_path):
    """The learner wiring end to end: no run.thresholds, so summary.json and the last line track CartPole's 475."""
    config_path = tmp_path / "plain.yaml"
    config_path.write_text(yaml.safe_dump({"env": {"id": "CartPole-v1", "actors": 1, "envs_per_actor": 2},
                                           "ppo": {"steps_per_env": 32, "total_steps": 128}}))
    run_dir = tmp_path / "run"
    result = subprocess.run([*lockstep_cmd(), "train", "--config", str(config_path), "--run-dir", str(run_dir),
                             "--device", "cpu", "--no-progress"], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["first_reached"] == {"475": None}
    assert "first reached 475: not reached" in result.stdout
