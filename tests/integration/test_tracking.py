"""Weights & Biases logging (``--wandb``): offline, into the run directory; never required, never contacting
anything here (W&B's offline mode, which lockstep also chooses when it finds no credentials)."""

from __future__ import annotations

import sys

import pytest
from conftest import preset_config

from lockstep import config as config_lib
from lockstep.launch.local import train
from lockstep.observe.tracking import MissingExtra, WandbRun

pytestmark = pytest.mark.slow


def _config(run_dir) -> config_lib.Config:
    return preset_config("cartpole-cleanrl", run_dir, {"actors.transport": "inprocess", "ppo.steps_per_env": 32,
                                                       "ppo.total_steps": 2 * 2 * 32 * 3, "run.wandb": True})


def test_a_run_logs_offline_to_its_directory_without_credentials(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: no stored login
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    run_dir = tmp_path / "run"
    train(_config(run_dir), run_dir)
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((run_dir / "wandb").iterdir())
    logged = list(runs[0].glob("*.wandb"))
    assert logged and logged[0].stat().st_size > 0
    assert (run_dir / "summary.json").is_file()


def test_without_wandb_installed_the_error_names_the_install_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now fails as if it were not installed
    with pytest.raises(MissingExtra, match=r"pip install -e '\.\[wandb\]'"):
        WandbRun(tmp_path, "run", "lockstep", {}, resume=False)
