"""What a resume may change, and the files it trusts (issue 20, item 11).

A resume that changes what the checkpoint's parameters mean (its env.* or model.* settings: the
environment, observation normalization, the architecture, recurrent or not) is refused naming the
key; a harmless change (a larger step budget, logging, checkpoints) goes on. ``config.yaml`` is written
atomically, and every metrics.csv row a checkpoint claims is fsynced before that checkpoint is written.
Runs are real ``lockstep train`` commands (env loops inside the learner process), run in this process.
"""

from __future__ import annotations

import dataclasses
import os

import pytest

from lockstep import cli
from lockstep import config as config_lib
from lockstep.config import Config, ConfigError
from lockstep.learner import checkpoint
from lockstep.observe.run_dir import RunDir

pytestmark = pytest.mark.slow

ARGS = ["--env", "CartPole-v1", "--actors", "1", "--envs-per-actor", "2", "--transport", "inprocess",
        "--steps-per-env", "16", "--no-progress", "--set", "ppo.epochs=1"]


def _train(run_dir, *args: str) -> int:
    return cli.main(["train", "--run-dir", str(run_dir), *ARGS, *args])


def _resume(run_dir, *args: str) -> int:
    return cli.main(["train", "--resume", str(run_dir), "--no-progress", *args])


def test_a_resume_that_toggles_normalize_obs_is_refused_naming_the_key_and_a_larger_budget_goes_on(tmp_path,
                                                                                                   capsys):
    run_dir = tmp_path / "run"
    assert _train(run_dir, "--total-steps", str(2 * 32), "--checkpoint-every", "1") == 0

    assert _resume(run_dir, "--total-steps", str(4 * 32), "--set", "env.normalize_obs=true") == 2
    err = capsys.readouterr().err
    assert "env.normalize_obs is True, but the checkpoint iter_000002.pt was trained with False" in err
    assert "start a new run" in err
    assert RunDir(run_dir).summary()["iterations"] == 2  # nothing ran

    assert _resume(run_dir, "--total-steps", str(4 * 32), "--set", "model.hidden=[32]") == 2
    assert "model.hidden is [32]" in capsys.readouterr().err

    # the step budget, checkpoints and logging may change
    assert _resume(run_dir, "--total-steps", str(4 * 32), "--checkpoint-every", "2") == 0
    summary = RunDir(run_dir).summary()
    assert summary["iterations"] == 4 and summary["resumed_from"] == "checkpoints/iter_000002.pt"


def test_only_the_keys_that_decide_what_the_parameters_mean_are_compared():
    stored = dataclasses.asdict(Config())
    changed = Config()
    changed.ppo.total_steps, changed.ppo.lr, changed.run.checkpoint_every = 10**7, 1e-4, 5
    changed.actors.count, changed.learner.device, changed.run.wandb = 8, "cpu", True
    checkpoint.check_resume(stored, dataclasses.asdict(changed), checkpoint.Path("iter_000001.pt"))
    for key, value in [("env.id", "Acrobot-v1"), ("env.clip_obs", 5.0), ("model.lstm_size", 16),
                       ("model.activation", "relu")]:
        changed = Config()
        config_lib.set_value(changed, key, value)
        with pytest.raises(ConfigError, match=f"--resume: {key} is"):
            checkpoint.check_resume(stored, dataclasses.asdict(changed), checkpoint.Path("iter_000001.pt"))
    checkpoint.check_resume(None, dataclasses.asdict(changed), checkpoint.Path("old.pt"))  # nothing stored


def test_config_yaml_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    path = tmp_path / "config.yaml"
    config_lib.save(Config(), path)
    before = path.read_text()

    def failing_fsync(fd: int) -> None:  # the disk fails while the new file is written
        raise OSError(28, "No space left on device")

    changed = Config()
    changed.ppo.total_steps = 123
    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="No space left"):
        config_lib.save(changed, path)
    assert path.read_text() == before and config_lib.load(path).ppo.total_steps == Config().ppo.total_steps
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml"]  # no temporary file left


def test_metrics_csv_is_fsynced_before_each_checkpoint_that_claims_its_rows(tmp_path, monkeypatch):
    synced: list[str] = []
    fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    assert _train(tmp_path / "run", "--total-steps", str(3 * 32), "--checkpoint-every", "1") == 0
    checkpoints = [name for name in synced if name.endswith(".pt.tmp")]
    assert checkpoints == [".iter_000001.pt.tmp", ".iter_000002.pt.tmp", ".iter_000003.pt.tmp", ".final.pt.tmp"]
    for name in checkpoints:  # between one checkpoint and the next, metrics.csv was made durable first
        before = synced[:synced.index(name)]
        last_checkpoint = max((i for i, n in enumerate(before) if n.endswith(".pt.tmp")), default=-1)
        assert "metrics.csv" in before[last_checkpoint + 1:], (name, synced)
