"""``lockstep bench learn``: the threshold it trains to, its medians, a tiny end-to-end run of both modes; and
``--suite``: its members, scaled budgets, published figures, and a tiny suite end to end."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess

import pytest
import yaml
from conftest import lockstep_cmd
from lockstep_bench import learn, suites

from lockstep import cli
from lockstep import config as config_lib

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
    assert learn.build_config(learn.LearnOptions(transport="grpc"))[0].actors.transport == "grpc"
    default = learn.build_config(learn.LearnOptions())[0].actors.transport
    assert default == config_lib.load(config_lib.DEFAULT_PRESET).actors.transport
    with pytest.raises(config_lib.ConfigError, match=r"actors\.transport"):
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
        "env": {"id": "CartPole-v1"},
        "actors": {"count": 1, "envs_per_actor": 4},
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
    config_path.write_text(yaml.safe_dump({"env": {"id": "CartPole-v1"}, "actors": {"count": 1, "envs_per_actor": 2},
                                           "ppo": {"steps_per_env": 32, "total_steps": 128}}))
    run_dir = tmp_path / "run"
    result = subprocess.run([*lockstep_cmd(), "train", "--config", str(config_path), "--run-dir", str(run_dir),
                             "--device", "cpu", "--no-progress"], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["first_reached"] == {"475": None}
    assert "first reached 475: not reached" in result.stdout


# --- suites: the final return of presets at their budgets ----------------------------------------------------------


def test_a_suite_lists_its_presets_and_a_missing_one_says_which_suite_needs_it(monkeypatch):
    monkeypatch.setitem(suites.SUITES, "tiny", ("cartpole-cleanrl", "no-such-preset"))
    present, missing = suites.entries("tiny")
    assert (present.name, present.source, present.error) == ("cartpole-cleanrl", "cartpole-cleanrl", None)
    assert missing.name == "no-such-preset"
    assert "preset 'no-such-preset' does not exist (the tiny suite lists it); presets: " in missing.error
    assert [e.name for e in suites.entries("mujoco")] == ["halfcheetah", "hopper", "walker2d", "ant"]
    assert all(e.error is None for e in suites.entries("mujoco"))


def test_a_custom_suite_takes_presets_and_yaml_files_and_an_unknown_name_lists_the_suites(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("env: {id: CartPole-v1}\n")
    assert [(e.name, e.source) for e in suites.entries(f"acrobot,{path}")] == [("acrobot", "acrobot"),
                                                                              ("mine", str(path))]
    with pytest.raises(config_lib.ConfigError,
                       match="unknown suite 'mujocoo'; suites: classic, minatar, minigrid, multiagent, selfplay, "
                             "mujoco"):
        suites.entries("mujocoo")


def test_a_suite_run_trains_the_scaled_budget_to_its_end():
    config = suites.build_config(suites.Entry("cartpole-fast", "cartpole-fast"), suites.SuiteOptions(
        suite="cartpole-fast", budget_scale=0.01, overrides=["learner.device=cpu"]))
    assert config.ppo.total_steps == 2500 and config.run.stop_at_return is None and not config.run.progress
    tiny = suites.build_config(suites.Entry("halfcheetah", "halfcheetah"),
                               suites.SuiteOptions(suite="mujoco", budget_scale=1e-6))
    assert tiny.ppo.total_steps == tiny.batch_size == 2048  # at least one batch


def test_a_variant_is_its_preset_with_settings_changed_and_the_table_gives_each_seeds_steps_to_threshold():
    flat, split = suites.entries("dict-split")
    assert (flat.name, flat.settings) == ("cartpole-fast", ())
    assert (split.name, split.source) == ("cartpole-fast-dict", "cartpole-fast") and split.error is None
    options = suites.SuiteOptions(suite="dict-split")
    config = suites.build_config(split, options)
    assert config.env.id == "lockstep.envs.tasks:SplitCartPole"
    assert config.ppo.lr == suites.build_config(flat, options).ppo.lr and config.return_thresholds() == [195, 475]
    runs = [{"error": None, "first_reached": {"195": {"env_steps": 9_000}, "475": {"env_steps": 51_520}}},
            {"error": None, "first_reached": {"195": {"env_steps": 9_000}, "475": None}},
            {"error": "exit code 1", "first_reached": None}]
    assert suites._reached_cell({"thresholds": [195, 475], "runs": runs}) == "475: 51,520, not reached, failed"
    assert suites._reached_cell({"thresholds": [], "runs": runs}) == "-"


def test_the_published_figure_counts_as_the_same_budget_within_one_batch():
    entry = suites.Entry("halfcheetah", "halfcheetah")
    full = suites.published_for(entry, suites.build_config(entry, suites.SuiteOptions(suite="mujoco")))
    assert full["same_budget"] and (full["mean"], full["std"], full["env"]) == (1442.64, 46.03, "HalfCheetah-v4")
    assert full["source"].startswith("https://docs.cleanrl.dev/")
    scaled = suites.build_config(entry, suites.SuiteOptions(suite="mujoco", budget_scale=0.5))
    assert not suites.published_for(entry, scaled)["same_budget"]
    ant = suites.Entry("ant", "ant")
    assert not suites.published_for(ant, suites.build_config(ant, suites.SuiteOptions(suite="mujoco")))["same_budget"]
    assert suites.published_for(suites.Entry("cartpole-fast", "cartpole-fast"), config_lib.Config()) is None


def test_an_entry_summary_is_the_mean_and_population_std_over_the_seeds_that_finished():
    rows = [{"final_return": 10.0, "env_steps": 100, "wall_s": 2.0, "sps": 50.0, "error": None,
             "loadavg_start": 0.5, "loadavg_end": 0.7},
            {"final_return": 20.0, "env_steps": 100, "wall_s": 4.0, "sps": 25.0, "error": None,
             "loadavg_start": 0.7, "loadavg_end": 0.9},
            {"final_return": None, "env_steps": None, "wall_s": None, "sps": None, "error": "exit code 1",
             "loadavg_start": 0.9, "loadavg_end": 1.1}]
    assert suites.summarize(rows) == {"seeds_ok": 2, "final_return_mean": 15.0, "final_return_std": 5.0,
                                      "win_rate_random_mean": None, "win_rate_random_std": None,
                                      "env_steps": 100.0, "seconds": 3.0, "sps": 37.5,
                                      "loadavg_start": 0.5, "loadavg_end": 1.1}
    rows[0]["win_rate_random"], rows[1]["win_rate_random"] = 0.9, 0.96  # a self-play game's, after training
    summary = suites.summarize(rows)
    assert (summary["win_rate_random_mean"], summary["win_rate_random_std"]) == (0.93, 0.03)


def test_an_entry_without_a_cleanrl_table_reports_the_random_and_solved_returns_with_their_source():
    bounds = dataclasses.asdict(suites.BOUNDS["minigrid-doorkey"])
    entry = {"name": "minigrid-doorkey", "error": None, "env": "minigrid:MiniGrid-DoorKey-5x5-v0", "seeds_ok": 1,
             "runs": [{"seed": 1, "error": None}], "final_return_mean": 0.95, "final_return_std": 0.0,
             "env_steps": 301_056, "seconds": 200.0, "sps": 1500.0, "loadavg_start": 1.0, "loadavg_end": 1.0,
             "published": None, "bounds": bounds, "plot": None}
    report = {"command": "lockstep bench learn --suite minigrid", "seeds": [1], "budget_scale": 1.0, "cpu_count": 2,
              "torch": "2", "loadavg_at_start": [1.0], "loadavg_at_end": [1.0], "elapsed_s": 1.0,
              "final_return": suites.FINAL_RETURN, "spread": suites.SPREAD, "curves": "curves", "entries": [entry]}
    text = suites.markdown(report)
    assert "- minigrid-doorkey: a random policy scores 0.04 on MiniGrid-DoorKey-5x5-v0, solved at 0.9 (" in text
    assert "https://github.com/lcswillems/rl-starter-files" in text
    assert suites.entries("minigrid")[0].error is None


def test_a_suite_whose_presets_all_are_missing_exits_2_before_training(tmp_path, capsys):
    assert cli.main(["bench", "learn", "--suite", "no-such-a,no-such-b", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "nothing to run" in err and "preset 'no-such-a' does not exist" in err
    assert not (tmp_path / "out").exists()


def test_budget_scale_without_a_suite_is_refused(tmp_path, capsys):
    assert cli.main(["bench", "learn", "--budget-scale", "0.1", "--out", str(tmp_path / "out")]) == 2
    assert "--budget-scale scales the presets of a --suite" in capsys.readouterr().err


@pytest.mark.slow
def test_bench_learn_suite_trains_each_seed_and_writes_results_and_curves(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "out"
    result = subprocess.run([*lockstep_cmd(), "bench", "learn", "--suite", "cartpole-cleanrl,no-such-preset",
                             "--seeds", "2", "--budget-scale", "0.004", "--set", "learner.device=cpu",
                             "--out", "out"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]  # one entry could not run
    report = json.loads((out / "results.json").read_text())
    assert {"command", "suite", "seeds", "budget_scale", "final_return", "spread", "loadavg_at_start",
            "loadavg_at_end", "entries"} <= set(report)
    assert report["seeds"] == [1, 2] and report["budget_scale"] == 0.004
    cartpole, missing = report["entries"]
    assert missing["name"] == "no-such-preset" and "does not exist" in missing["error"]
    assert cartpole["error"] is None and cartpole["env"] == "CartPole-v1" and cartpole["total_steps"] == 2000
    assert [r["seed"] for r in cartpole["runs"]] == [1, 2]
    finals = []
    for run in cartpole["runs"]:
        assert set(run) == set(suites.RUN_KEYS) and run["error"] is None, run
        summary = json.loads((tmp_path / run["run_dir"] / "summary.json").read_text())
        assert run["final_return"] == summary["episode_return_mean"] and run["env_steps"] == summary["env_steps"]
        assert summary["env_steps"] >= 2000 and run["loadavg_start"] is not None and run["loadavg_end"] is not None
        finals.append(run["final_return"])
    assert cartpole["seeds_ok"] == 2
    assert cartpole["final_return_mean"] == pytest.approx(sum(finals) / 2, abs=0.01)
    assert cartpole["final_return_std"] == pytest.approx(abs(finals[0] - finals[1]) / 2, abs=0.01)
    assert cartpole["published"]["mean"] == 490.04 and cartpole["published"]["same_budget"] is False
    png = out / cartpole["plot"]
    assert png.name == "cartpole-cleanrl.png" and png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    text = (out / "results.md").read_text()
    assert "| CartPole-v1 (cartpole-cleanrl) | 2/2 |" in text and "| no-such-preset | not run |" in text
    assert "*Final return*: the mean undiscounted return of the last 100 episodes" in text
    assert "https://docs.cleanrl.dev/rl-algorithms/ppo/#ppopy" in text
