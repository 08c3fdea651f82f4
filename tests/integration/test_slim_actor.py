"""The slim actor install (requirements-actor.txt, then lockstep with --no-deps) has no torch and still trains.

A fresh venv gets only what docs/quickstart.md's "Actors on other machines" says an actor needs; its ``lockstep actor``
then connects to a learner served from this process (the full install) and runs until training ends.
Any module that ``lockstep actor`` loads and that imports torch, rich, TensorBoard or matplotlib at
module level fails here.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "rich", "tensorboard", "matplotlib")
OFFLINE = ("NewConnectionError", "Temporary failure in name resolution", "Network is unreachable")


def _pip_install(python: Path, *args: str) -> None:
    result = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
                            capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        if any(sign in result.stdout + result.stderr for sign in OFFLINE):
            pytest.skip("the package index cannot be reached")
        raise AssertionError(f"pip install {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")


@pytest.mark.slow
def test_an_actor_installed_without_torch_trains_with_a_learner(tmp_path, running_learner):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # Install from a copy, so that pip's build leaves nothing in the checkout.
    project = tmp_path / "project"
    shutil.copytree(ROOT / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    _pip_install(python, "-r", str(ROOT / "requirements-actor.txt"))
    _pip_install(python, "--no-deps", str(project))
    found = subprocess.run([str(python), "-c", "import importlib.util as u; "
                            f"print([m for m in {HEAVY!r} if u.find_spec(m)])"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert found == "[]", f"the slim venv has {found}"

    learner = running_learner({"run.thresholds": [], "actors.envs_per_actor": 2, "ppo.steps_per_env": 16,
                               "ppo.total_steps": 2 * 16 * 3, "learner.device": "cpu"})
    actor = subprocess.run([str(venv / "bin" / "lockstep"), "actor", "--learner", learner.address, "--num-envs", "2"],
                           capture_output=True, text=True, timeout=120)
    assert actor.returncode == 0, actor.stderr
    assert "the learner finished training" in actor.stderr
    assert learner.wait_finished(timeout=60)["env_steps"] == 2 * 16 * 3
