"""What a resume may change, and the files it trusts (issue 20, item 11).

A resume that changes what the checkpoint's parameters mean (its env.* or model.* settings: the
environment, observation normalization, the architecture, recurrent or not; with several policies, which
policies there are, each one's agents and network) is refused naming the key; a harmless change (a
larger step budget, logging, checkpoints, freezing a policy) goes on. ``config.yaml`` is written atomically,
and every metrics.csv row a checkpoint claims is fsynced before that checkpoint is written.
Runs are real ``lockstep train`` commands (env loops inside the learner process), run in this process.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
import yaml

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
                       ("model.activation", "relu"), ("model.rnn", "gru")]:
        changed = Config()
        config_lib.set_value(changed, key, value)
        with pytest.raises(ConfigError, match=f"--resume: {key} is"):
            checkpoint.check_resume(stored, dataclasses.asdict(changed), checkpoint.Path("iter_000001.pt"))
    checkpoint.check_resume(None, dataclasses.asdict(changed), checkpoint.Path("old.pt"))  # nothing stored


KINDS_POLICIES = {"a": {"agents": ["scout_0"]}, "b": {"agents": ["scout_1"]}, "p": {"agents": ["pilot_*"]}}


def _edit_policies(run_dir, change) -> None:
    """Rewrite RUN_DIR/config.yaml with ``change`` applied to its policies (how a user changes them: no flag
    sets a policy)."""
    path = run_dir / "config.yaml"
    config = config_lib.load(path)
    change(config.policies)
    config_lib.save(config, path)


@pytest.mark.parametrize("change, named", [
    (lambda p: p["a"].model.update(activation="relu"), "policies.a.model.activation is 'relu'"),
    (lambda p: p["a"].model.update(hidden=[16]), "policies.a.model.hidden is [16]"),
    # a and b act for agents of one space: swapped, each policy's parameters would act for the other's agent
    (lambda p: (p["a"].agents.__setitem__(0, "scout_1"), p["b"].agents.__setitem__(0, "scout_0")),
     "policies.a.agents is ['scout_1']"),
    (lambda p: p.pop("b") and p["a"].agents.append("scout_1"), "policies are ['a', 'p']"),
])
def test_a_resume_that_changes_a_policys_network_agents_or_the_policies_is_refused_naming_the_field(
        tmp_path, capsys, change, named):
    config = tmp_path / "kinds.yaml"
    config.write_text(yaml.safe_dump({"env": {"id": "pettingzoo:lockstep.envs.kinds"}, "policies": KINDS_POLICIES,
                                      "model": {"hidden": [8]}}))
    run_dir = tmp_path / "run"
    train = ["--config", str(config), *ARGS[2:]]  # ARGS without its env
    assert cli.main(["train", "--run-dir", str(run_dir), *train, "--total-steps", str(2 * 2 * 3 * 16),
                     "--checkpoint-every", "1"]) == 0
    saved = (run_dir / "config.yaml").read_text()

    _edit_policies(run_dir, change)
    assert _resume(run_dir, "--total-steps", str(4 * 2 * 3 * 16)) == 2
    err = capsys.readouterr().err
    assert f"--resume: {named}" in err and "but the checkpoint iter_000002.pt was trained with" in err, err
    assert RunDir(run_dir).summary()["iterations"] == 2  # nothing ran

    # what does not change the parameters' meaning may: here, freezing a policy
    (run_dir / "config.yaml").write_text(saved)
    _edit_policies(run_dir, lambda p: setattr(p["b"], "train", False))
    assert _resume(run_dir, "--total-steps", str(3 * 2 * 3 * 16)) == 0
    assert RunDir(run_dir).summary()["iterations"] == 3


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
