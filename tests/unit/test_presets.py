"""Presets shipped in the package, the default that `lockstep train` starts from, and the env's own solved return."""

from __future__ import annotations

import importlib.resources
import subprocess
from pathlib import Path

import pytest

from lockstep import cli
from lockstep import config as config_lib
from lockstep.envs import reward_threshold
from lockstep.observe.metrics import EpisodeTracker

REPO = Path(__file__).resolve().parents[2]


def test_each_preset_has_one_copy_the_package_ships():
    """A preset lives in src/lockstep/presets/ alone: no other YAML file of the checkout repeats one, so a
    preset cannot differ between two places."""
    packaged = importlib.resources.files("lockstep").joinpath("presets")
    texts = {packaged.joinpath(f"{name}.yaml").read_text() for name in config_lib.preset_names()}
    tracked = subprocess.run(["git", "ls-files", "*.yaml", "*.yml"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    others = [path for path in tracked if not path.startswith("src/lockstep/presets/")]
    assert not [path for path in others if (REPO / path).read_text() in texts]
    assert not (REPO / "configs").exists()


def test_presets_are_package_data():
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "presets/*.yaml" in pyproject["tool"]["setuptools"]["package-data"]["lockstep"]


@pytest.mark.parametrize("name", config_lib.preset_names())
def test_every_preset_validates(name):
    config_lib.load(name).validate()


def test_the_default_preset_stops_at_cartpoles_solved_return():
    config = config_lib.load(config_lib.DEFAULT_PRESET)
    assert config.env.id == "CartPole-v1"
    assert config.run.stop_at_return == reward_threshold("CartPole-v1") == 475.0
    assert 475.0 in config.run.thresholds


def _resolve(*argv: str) -> config_lib.Config:
    return cli.resolve_config(cli.build_parser().parse_args(list(argv)))


def _settings(config: config_lib.Config) -> dict:
    data = config_lib.to_dict(config)
    data["run"] = {k: v for k, v in data["run"].items() if k not in ("name", "run_dir")}
    return data


def test_train_without_config_uses_the_default_preset():
    assert _settings(_resolve("train")) == _settings(config_lib.load(config_lib.DEFAULT_PRESET))
    assert _settings(_resolve("train", "--env", "CartPole-v1")) == _settings(config_lib.load("cartpole-fast"))


def test_train_accepts_a_preset_name_and_a_path():
    assert _settings(_resolve("train", "--config", "cartpole-cleanrl")) == \
        _settings(_resolve("train", "--config", str(REPO / "src" / "lockstep" / "presets" / "cartpole-cleanrl.yaml")))
    assert _resolve("train", "--config", "pendulum", "--seed", "4").run.seed == 4


def test_train_with_another_env_and_the_lone_learner_start_from_the_built_in_defaults():
    acrobot = _resolve("train", "--env", "Acrobot-v1")
    expected = config_lib.Config()
    expected.env.id = "Acrobot-v1"
    assert _settings(acrobot) == _settings(expected)
    assert _settings(_resolve("learner")) == _settings(config_lib.Config())


def test_an_unknown_preset_on_the_command_line_exits_2_and_lists_the_presets(capsys):
    assert cli.main(["train", "--config", "cartpole-turbo"]) == 2
    err = capsys.readouterr().err
    assert "unknown preset 'cartpole-turbo'" in err
    assert all(name in err for name in config_lib.preset_names())


# --- the env's reward_threshold --------------------------------------------------------------


@pytest.mark.parametrize("env_id, expected", [
    ("CartPole-v1", 475.0),
    ("CartPole-v0", 195.0),
    ("Acrobot-v1", -100.0),
    ("Pendulum-v1", None),  # registered without one
    ("NoSuchEnv-v0", None),
    ("tests.envs:make_env", None),  # an entry point is not a registration
])
def test_reward_threshold_reads_the_gymnasium_registration(env_id, expected):
    assert reward_threshold(env_id) == expected


def test_first_reached_tracks_cartpoles_reward_threshold_when_no_thresholds_are_given():
    tracker = EpisodeTracker(config_lib.Config().return_thresholds())
    assert tracker.first_reached == {"475": None}


def test_the_learner_records_the_envs_reward_threshold_without_given_thresholds(tmp_path):
    from lockstep.learner.wiring import Learner

    config = config_lib.Config()
    config.learner.device = "cpu"
    assert Learner(config, tmp_path / "run").episodes.first_reached == {"475": None}
    config.run.thresholds = [195.0]
    assert Learner(config, tmp_path / "run").episodes.first_reached == {"195": None}
