"""The command line explains itself: what lockstep and each command do, with examples, and errors that name the fix."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from conftest import lockstep_cmd

from lockstep import cli


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
    for scheme in ("atari:GAME", "minatar:GAME", "masked:ENV", "package.module:callable"):
        assert scheme in text


@pytest.mark.parametrize("command", [["train", "--no-progress"], ["actor", "--learner", "127.0.0.1:1"]])
def test_an_unknown_env_id_exits_2_and_suggests_the_registered_id(tmp_path, command):
    start = time.monotonic()
    result = subprocess.run([*lockstep_cmd(), *command, "--env", "CartPol-v1"], capture_output=True, text=True,
                            timeout=60, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert time.monotonic() - start < 20
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
