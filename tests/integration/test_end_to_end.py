"""Training end to end: a learner, actor processes over the default same-host transport (shared memory and a
unix socket), real PPO."""

from __future__ import annotations

import json

import pytest
from conftest import preset_config

from lockstep import config as config_lib
from lockstep.launch.local import train
from lockstep.observe.run_dir import RunDir

pytestmark = pytest.mark.slow


def _config(preset: str, tmp_path, **overrides) -> config_lib.Config:
    return preset_config(preset, tmp_path / "run", overrides)


def test_cartpole_reaches_195_within_a_short_budget(tmp_path):
    config = _config("cartpole-cleanrl", tmp_path, **{
        "actors.count": 2, "actors.envs_per_actor": 4, "ppo.steps_per_env": 32, "ppo.lr": 1e-3,
        "ppo.total_steps": 60_000, "run.stop_at_return": 195,
    })
    summary = train(config, tmp_path / "run")
    assert summary["first_reached"]["195"] is not None, summary
    assert summary["env_steps"] <= 60_000 + config.batch_size
    rows = RunDir(tmp_path / "run").metrics()
    assert rows and all(int(r["off_policy_samples"]) == 0 for r in rows)
    assert [int(r["iteration"]) for r in rows] == list(range(1, len(rows) + 1))
    assert all(float(r["policy_lag_max"]) == 0 for r in rows)


def test_pendulum_improves_its_return_over_the_first_iterations(tmp_path):
    config = _config("pendulum", tmp_path, **{"ppo.total_steps": 36_000})
    summary = train(config, tmp_path / "run")
    rows = RunDir(tmp_path / "run").metrics()
    first = float(rows[1]["episode_return_mean"])  # a random Gaussian policy: about -1200
    last = float(rows[-1]["episode_return_mean20"])
    assert last > first + 300, (first, last)
    assert summary["env_steps"] >= 36_000


def test_run_directory_has_every_file_other_tools_read(tmp_path):
    config = _config("cartpole-cleanrl", tmp_path, **{"ppo.total_steps": 2048, "run.checkpoint_every": 2})
    train(config, tmp_path / "run")
    run = tmp_path / "run"
    resolved = config_lib.load(run / "config.yaml")
    assert resolved == config
    rows = RunDir(run).metrics()
    assert len(rows) == 4  # 2048 steps / (2 actors x 2 envs x 128 steps)
    required = ["iteration", "policy_version", "env_steps", "wall_s", "sps", "episodes", "episode_return_mean",
                "off_policy_samples", "policy_lag_mean", "policy_lag_max", "inference_batch_mean",
                "collect_s", "train_s"]
    assert set(required) <= set(rows[0])
    assert [int(r["env_steps"]) for r in rows] == [512, 1024, 1536, 2048]
    assert [int(r["policy_version"]) for r in rows] == [0, 1, 2, 3]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["env_steps"] == 2048
    assert set(summary["first_reached"]) == {"195", "475"}
    assert (run / "checkpoints" / "final.pt").is_file()
    assert sorted(p.name for p in (run / "checkpoints").glob("iter_*.pt")) == ["iter_000002.pt", "iter_000004.pt"]
    assert list(run.glob("events.out.tfevents.*"))
