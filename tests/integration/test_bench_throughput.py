"""``lockstep bench throughput`` and its in-process baseline, at tiny sizes."""

from __future__ import annotations

import json

import pytest
from lockstep_bench import baseline, throughput

from lockstep import config as config_lib

REQUIRED = {"config", "mode", "env_steps_per_s", "ratio_to_baseline", "inference_batch_mean", "learner_peak_rss_mb",
            "time_split_s", "env_steps", "wall_s", "device"}


def _cartpole(**overrides) -> config_lib.Config:
    config = config_lib.from_dict(throughput.CONFIGS["cartpole-cleanrl"].base)
    for key, value in {**throughput.CONFIGS["cartpole-cleanrl"].settings, **overrides}.items():
        config_lib.set_value(config, key, value)
    config.learner.device = "cpu"
    return config


def test_baseline_trains_to_its_step_budget(tmp_path):
    config = _cartpole(**{"ppo.total_steps": 2048})
    path = tmp_path / "config.yaml"
    config_lib.save(config, path)
    assert baseline.main([str(path), str(tmp_path / "baseline.json")]) == 0
    result = json.loads((tmp_path / "baseline.json").read_text())
    assert result["env_steps"] == 2048 and result["iterations"] == 4
    assert result["env_steps_per_s"] > 0 and result["wall_s"] > 0
    assert set(result["time_split_s"]) == {"env", "inference", "training", "other"}
    assert result["time_split_s"]["training"] > 0
    assert result["inference_batch_mean"] == 4 and result["peak_rss_mb"] > 0
    assert not result["time_limited"]


def test_baseline_collect_only_and_box_actions_with_truncation():
    # Pendulum episodes end by truncation at 200 steps: exercises the final-observation path.
    config = throughput.build_config(throughput.CONFIGS["pendulum-scaled"], 1024, 60.0, "cpu")
    config_lib.set_value(config, "actors.count", 1)
    config_lib.set_value(config, "actors.envs_per_actor", 2)
    config_lib.set_value(config, "ppo.steps_per_env", 128)
    result = baseline.run(config)
    assert result["env_steps"] == 1024 and result["iterations"] == 4
    assert result["episodes"] == 4  # 2 envs x 512 steps: two 200-step (truncated) episodes each
    counted = baseline.run(config, collect_only=True)
    assert counted["env_steps"] == 1024 and counted["time_split_s"]["training"] < result["time_split_s"]["training"]


def test_baseline_learns_cartpole():
    config = _cartpole(**{"actors.envs_per_actor": 4, "ppo.steps_per_env": 32, "ppo.lr": 1e-3,
                          "ppo.total_steps": 30_000, "run.stop_at_return": 195})
    result = baseline.run(config)
    assert result["first_reached"]["195"] is not None, result["curve"][-5:]
    assert result["curve"][0][2] < 50  # a random policy first


@pytest.mark.slow
def test_quick_throughput_writes_a_row_per_mode_and_transport_and_the_round_trips(tmp_path):
    rows = throughput.run(tmp_path, quick=True, device="cpu", configs=["cartpole-cleanrl"],
                          total_steps=1024, time_limit_s=30.0, modes=["strict"], roundtrip_messages=1024)
    data = json.loads((tmp_path / "throughput.json").read_text())
    assert data == rows
    assert isinstance(data, list) and all(isinstance(r, dict) for r in data)
    assert [(r["mode"], r["transport"]) for r in data] == [("baseline", None), ("strict", "inprocess"),
                                                           ("strict", "shm"), ("strict", "grpc")]
    for row in data:
        assert REQUIRED <= set(row), REQUIRED - set(row)
        assert row["error"] is None, row
        assert row["mode"] in throughput.MODES
        assert isinstance(row["ratio_to_baseline"], float) and row["ratio_to_baseline"] > 0
        assert row["env_steps"] == 1024 and row["env_steps_per_s"] > 0
        assert row["learner_peak_rss_mb"] > 0 and row["device"] == "cpu"
    assert data[0]["ratio_to_baseline"] == 1.0
    assert (tmp_path / "configs" / "cartpole-cleanrl.yaml").is_file()
    md = (tmp_path / "throughput.md").read_text()
    table = [line for line in md.splitlines() if line.startswith("| cartpole-cleanrl |")]
    assert len(table) == len(data)
    assert "lockstep bench throughput" in md and "CPU cores" in md
    trips = json.loads((tmp_path / "roundtrip" / "roundtrip.json").read_text())
    assert [t["transport"] for t in trips] == ["inprocess", "shm", "grpc"]
    for trip in trips:
        assert trip["error"] is None and trip["messages"] == 1024
        assert trip["round_trips_per_s"] > 0 and trip["learner_cpu_us_per_message"] > 0
    assert "## Round trips" in md


@pytest.mark.slow
def test_baseline_computes_what_a_one_actor_strict_learner_computes(tmp_path):
    """With one actor the learner's noise keys and env seeds are the baseline's: the runs must agree exactly."""
    from lockstep.launch.local import train

    config = _cartpole(**{"actors.count": 1, "actors.envs_per_actor": 4, "ppo.total_steps": 5120})
    expected = baseline.run(config)
    config.run.progress = False
    config.run.run_dir = str(tmp_path / "run")
    summary = train(config, tmp_path / "run")
    assert summary["env_steps"] == expected["env_steps"] == 5120
    assert summary["episodes"] == expected["episodes"] > 50
    assert summary["episode_return_mean"] == pytest.approx(expected["episode_return_mean"], abs=1e-9)


@pytest.mark.parametrize("name, path, changes", [
    ("cartpole-cleanrl", "cartpole-cleanrl", {}),
    ("pendulum-scaled", "pendulum", {"actors.count": 4, "actors.envs_per_actor": 16,
                                     "ppo.steps_per_env": 64, "ppo.epochs": 4, "ppo.minibatches": 4}),
    ("atari-breakout", "breakout", {"ppo.steps_per_env": 32}),
    ("atari-breakout-envpool", "breakout", {"ppo.steps_per_env": 32, "env.id": "envpool:Breakout-v5"}),
])
def test_bench_configs_are_the_repository_configs_with_the_stated_changes(name, path, changes):
    built = throughput.build_config(throughput.CONFIGS[name], 4096, 10.0, "cpu")
    expected = config_lib.load(path)
    for key, value in {**changes, "ppo.total_steps": 4096, "run.time_limit_s": 10.0, "run.progress": False,
                       "learner.device": "cpu"}.items():
        config_lib.set_value(expected, key, value)
    assert built == expected


@pytest.mark.slow
def test_repeated_rounds_give_each_row_its_rounds_baseline_and_a_median_per_mode(tmp_path):
    rows = throughput.run(tmp_path, quick=True, device="cpu", configs=["cartpole-cleanrl"], total_steps=512,
                          time_limit_s=30.0, modes=["strict"], transports=("inprocess",), roundtrip_messages=0,
                          repeats=2)
    assert [(r["mode"], r["round"]) for r in rows] == [("baseline", 1), ("strict", 1), ("baseline", 2), ("strict", 2)]
    for baseline_row, strict_row in (rows[:2], rows[2:]):  # each ratio against its own round's baseline
        assert strict_row["error"] is None, strict_row
        assert strict_row["ratio_to_baseline"] == round(strict_row["env_steps_per_s"] / baseline_row["env_steps_per_s"],
                                                        3)
    central = json.loads((tmp_path / "medians.json").read_text())
    assert [(c["mode"], c["rounds"], c["failed"]) for c in central] == [("baseline", 2, 0), ("strict", 2, 0)]
    ratios = sorted(r["ratio_to_baseline"] for r in rows[1::2])
    assert central[1]["ratio_range"] == ratios
    assert central[1]["ratio_to_baseline"] == pytest.approx(sum(ratios) / 2, abs=1e-3)  # two rounds: their mean
    md = (tmp_path / "throughput.md").read_text()
    assert "## Medians over 2 rounds" in md and "| cartpole-cleanrl | strict | inprocess | 2 (0) |" in md
    assert (tmp_path / "runs" / "cartpole-cleanrl" / "strict-inprocess-r2" / "summary.json").is_file()
