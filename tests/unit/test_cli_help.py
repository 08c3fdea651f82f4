"""The command line explains itself: what lockstep and each command do, with examples, and errors that name the fix."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from conftest import lockstep_cmd

from lockstep import cli
from lockstep import config as config_lib
from lockstep.actor import ActorOptions
from lockstep.launch import ActorsGone


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as done:
        cli.main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


def test_lockstep_help_says_what_it_is_and_lists_every_command_with_examples(capsys):
    text = _help(capsys)
    assert text.split("\n\n")[1] == "lockstep: distributed PPO in the SEED architecture that stays on-policy."
    words = " ".join(text.split())  # argparse wraps the command list
    for name, (summary, _, _) in cli.HELP.items():
        assert f"{name} {summary}" in words
    assert "bench benchmarks" in words
    assert "examples:\n  lockstep train" in text and "lockstep actor --learner" in text


@pytest.mark.parametrize("name", sorted(cli.HELP))
def test_each_command_help_says_what_it_does_with_an_example(capsys, name):
    text = _help(capsys, name)
    summary, _, _ = cli.HELP[name]
    assert summary[1:] in text
    examples = text.split("examples:\n", 1)[1]
    assert f"lockstep {name}" in examples


@pytest.mark.parametrize("name", ["train", "learner", "actor"])
def test_env_help_names_the_id_schemes(capsys, name):
    text = " ".join(_help(capsys, name).split())
    for scheme in ("atari:GAME", "minatar:GAME", "vizdoom:SCENARIO", "masked:ENV", "package.module:callable"):
        assert scheme in text


@pytest.mark.parametrize("command", [["train", "--no-progress"], ["actor", "--learner", "127.0.0.1:1"]])
def test_an_unknown_env_id_exits_2_and_suggests_the_registered_id(tmp_path, command):
    result = subprocess.run([*lockstep_cmd(), *command, "--env", "CartPol-v1"], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "reconnecting" not in result.stderr  # refused before the actor tried any learner
    assert "unknown environment 'CartPol-v1'" in result.stderr and "did you mean CartPole-v1" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("module, env_id, extra", [("mujoco", "HalfCheetah-v5", "mujoco"),
                                                   ("ale_py", "atari:BreakoutNoFrameskip-v4", "atari")])
def test_a_missing_optional_extra_names_the_pip_install_line(tmp_path, module, env_id, extra):
    script = (f"import sys; sys.modules[{module!r}] = None\n"  # as if the package were not installed
              f"from lockstep.cli import main; sys.exit(main(['train', '--no-progress', '--env', {env_id!r}]))")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert f"pip install -e '.[{extra}]'" in result.stderr and "Traceback" not in result.stderr


# --- flags generated from the config's declarations ----------------------------------------------


def _options(command: str) -> dict[str, argparse.Action]:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {flag: action for action in sub.choices[command]._actions for flag in action.option_strings}


@pytest.mark.parametrize("command", ["train", "learner"])
def test_every_config_field_has_a_flag_whose_help_is_the_fields_help(command):
    options = _options(command)
    for s in config_lib.SETTINGS:
        action = options[f"--{s.dotted}"]
        assert (action.dest, action.help) == (s.dotted, s.help)
        if s.flag:
            assert options[s.flag].dest == s.dotted
        if s.choices:
            assert action.metavar == "{" + ",".join(s.choices) + "}"


def test_the_flags_users_know_are_aliases_of_the_generated_ones():
    expected = {"--env": "env.id", "--total-steps": "ppo.total_steps", "--seed": "run.seed", "--lr": "ppo.lr",
                "--steps-per-env": "ppo.steps_per_env", "--actors": "actors.count",
                "--envs-per-actor": "actors.envs_per_actor", "--device": "learner.device",
                "--transport": "actors.transport", "--sync": "sync.strategy", "--run-dir": "run.run_dir",
                "--launcher": "actors.launcher", "--audit": "run.audit", "--no-progress": "run.progress"}
    options = _options("train")
    assert {flag: options[flag].dest for flag in expected} == expected


def _resolve(*argv: str) -> config_lib.Config:
    return cli.resolve_config(cli.build_parser().parse_args(["train", "--run-dir", "runs/x", *argv]))


@pytest.mark.parametrize("argv", [["--actors", "3", "--transport", "grpc", "--lr", "1e-3"],
                                  ["--actors.count", "3", "--actors.transport", "grpc", "--ppo.lr", "1e-3"],
                                  ["--set", "actors.count=3", "--set", "actors.transport=grpc",
                                   "--set", "ppo.lr=1e-3"]])
def test_a_short_flag_its_long_form_and_set_give_the_same_config(argv):
    config = _resolve(*argv)
    assert (config.actors.count, config.actors.transport, config.ppo.lr) == (3, "grpc", 1e-3)


def test_boolean_flags_take_a_value_and_short_flags_flip_the_default():
    assert _resolve().run.audit is False and _resolve().run.progress is True
    assert _resolve("--audit").run.audit is True and _resolve("--run.audit").run.audit is True
    assert _resolve("--no-progress").run.progress is False
    assert _resolve("--run.progress", "false").run.progress is False
    assert _resolve("--ppo.anneal_lr", "no").ppo.anneal_lr is False
    assert _resolve("--sanitize").learner.sanitize is True


def test_set_wins_over_a_flag():
    assert _resolve("--actors", "3", "--set", "actors.count=5").actors.count == 5


@pytest.mark.parametrize("argv, message", [
    (["--transport", "tcp"], "actors.transport must be one of shm, grpc, inprocess, got 'tcp'"),
    (["--actors", "0"], "actors.count must be >= 1, got 0"),
    (["--set", "env.actors=2"], "env.actors moved to actors.count"),
    (["--set", "learner.transport=grpc"], "learner.transport moved to actors.transport"),
])
def test_a_value_the_config_refuses_exits_2_naming_the_key(capsys, argv, message):
    assert cli.main(["train", "--no-progress", *argv]) == 2
    assert message in capsys.readouterr().err


def _actor(*argv: str):
    return cli.actor_options(cli.build_parser().parse_args(["actor", "--learner", "127.0.0.1:1", *argv]))


def test_the_actor_reads_envs_per_actor_from_the_config_one_default_one_name_and_the_old_alias():
    assert _actor().envs_per_actor == config_lib.Config().actors.envs_per_actor == ActorOptions().envs_per_actor
    assert _actor().env == config_lib.Config().env.id == ActorOptions().env
    assert _actor("--envs-per-actor", "3").envs_per_actor == 3
    assert _actor("--num-envs", "5").envs_per_actor == 5
    options = _options("actor")
    assert options["--num-envs"] is options["--envs-per-actor"]
    assert options["--envs-per-actor"].help == config_lib.setting_of("actors.envs_per_actor").help
    assert options["--env"].help == config_lib.setting_of("env.id").help


def test_the_actor_checks_envs_per_actor_as_the_config_does():
    with pytest.raises(config_lib.ConfigError, match=r"actors\.envs_per_actor must be >= 1, got 0"):
        _actor("--num-envs", "0")


def test_a_run_whose_every_actor_exited_ends_with_one_line_and_exit_1_not_a_traceback(capsys):
    def gone(args: argparse.Namespace) -> int:
        raise ActorsGone("every actor exited while training, and none is due to restart (actors.restarts); see the "
                         "log above")

    assert cli.run(argparse.Namespace(func=gone, verbose=False)) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == ["lockstep: the run failed: every actor exited while training, and none is due to "
                                "restart (actors.restarts); see the log above"]
