"""The minigrid-doorkey preset: its env starts as a Dict of the grid codes and the direction, the mission
text left out, and a short run of the preset trains over real actor processes and passes the audit."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import with_settings

from lockstep import config as config_lib
from lockstep.envs import env_spec, make_env
from lockstep.launch.local import train
from lockstep.observe.run_dir import RunDir
from lockstep.tools import audit

pytest.importorskip("minigrid")

PRESET = "minigrid-doorkey"


def test_the_preset_env_is_the_grid_codes_and_the_direction_without_the_mission():
    config = config_lib.load(PRESET)
    spec = env_spec(config.env.id, config.env.obs_keys).observation
    leaves = dict(spec.leaves)
    assert spec.paths() == ("direction", "image")
    assert (leaves["direction"].kind, leaves["direction"].n) == ("discrete", 4)
    image = leaves["image"]
    assert (image.kind, image.shape, image.dtype) == ("multi_discrete", (7, 7, 3), "uint8")
    assert image.nvec[:3] == (11, 6, 3) and len(image.nvec) == 7 * 7 * 3 and not image.image
    obs, _ = make_env(config.env.id).reset(seed=1)
    assert obs["image"].dtype == np.uint8 and obs["image"].shape == (7, 7, 3)
    with pytest.raises(ValueError, match="'mission' is a MissionSpace space.*env.obs_keys"):
        env_spec(config.env.id)


def test_an_unknown_minigrid_env_suggests_the_close_ids():
    with pytest.raises(ValueError, match="did you mean MiniGrid-DoorKey-5x5-v0"):
        make_env("minigrid:MiniGrid-DoorKey-5x5-v9")


def test_a_short_run_of_the_preset_trains_over_actor_processes_and_passes_the_audit(tmp_path):
    config = with_settings(config_lib.load(PRESET), {
        "actors.count": 2, "actors.envs_per_actor": 2, "actors.transport": "grpc", "ppo.steps_per_env": 64,
        "ppo.total_steps": 1024, "ppo.minibatches": 2, "model.hidden": [16], "learner.device": "cpu",
        "run.progress": False, "run.audit": True})
    run_dir = tmp_path / "run"
    config.run.run_dir = str(run_dir)
    train(config, run_dir)
    assert [int(r["env_steps"]) for r in RunDir(run_dir).metrics()] == [256 * i for i in range(1, 5)]
    report = audit.check(run_dir)
    assert report.exit_code == 0 and report.differing == 0 and report.samples == 1024
    # what reached the learner: the two leaves, each in its own dtype, and no mission
    with np.load(run_dir / "audit" / "batch_000001.npz") as batch:
        obs = {name: batch[name] for name in batch.files if name.startswith("obs")}
    assert {name: a.dtype.name for name, a in obs.items()} == {"obs/direction": "int64", "obs/image": "uint8"}
    assert obs["obs/image"].shape[-3:] == (7, 7, 3) and obs["obs/image"][..., 0].max() <= 10
