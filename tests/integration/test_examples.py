"""The examples in examples/ run as a user runs them, and do what they say."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

pytestmark = pytest.mark.slow


def test_custom_policy_example_trains_cartpole_with_its_own_network_and_passes_the_audit(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run([sys.executable, str(EXAMPLES / "custom_policy.py"), "--total-steps", "40000", "--audit",
                             "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log  # 0: training finished and the audit passed
    assert "PASS" in log
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["model"]["policy"] == f"{EXAMPLES / 'custom_policy.py'}:make_policy"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["first_reached"]["195"] is not None  # it learns (the default preset's MLP: ~20k steps)
    import torch
    state = torch.load(run_dir / "checkpoints" / "final.pt", weights_only=False)["trainer"]["model"]
    # the example's own network was trained: its LayerNorm (policy_net.0.1) left its initial scale of ones
    assert not torch.equal(state["policy_net.0.1.weight"], torch.ones_like(state["policy_net.0.1.weight"]))


def test_a_policy_that_cannot_be_built_again_is_refused_by_name():
    import lockstep
    from lockstep.api import policy_reference

    with pytest.raises(ValueError, match="top level"):
        policy_reference(lambda observation, action, model: None)
    assert policy_reference(lockstep.api.load_config) == "lockstep.api:load_config"
    config = lockstep.load_config("cartpole-cleanrl", model__policy="no.such.module:make")
    from lockstep.envs import env_spec
    from lockstep.models import build_policy

    spec = env_spec("CartPole-v1")
    with pytest.raises(ValueError, match="cannot be loaded"):
        build_policy(spec.observation, spec.action, config.model)
    config.model.policy = "builtins:slice"  # a callable of three arguments that does not return a Policy
    with pytest.raises(TypeError, match="not a lockstep.Policy"):
        build_policy(spec.observation, spec.action, config.model)


def test_deploy_onnx_plays_an_exported_cartpole_policy_to_lockstep_evals_returns(tmp_path):
    pytest.importorskip("onnxruntime")  # the export extra
    from conftest import learner_config

    from lockstep.launch.local import train
    from lockstep.tools.eval import evaluate
    from lockstep.tools.export import export

    run_dir = tmp_path / "run"
    train(learner_config({"actors.envs_per_actor": 2, "actors.transport": "inprocess", "ppo.steps_per_env": 64,
                          "ppo.total_steps": 512, "model.hidden": [16], "learner.device": "cpu",
                          "env.normalize_obs": True, "run.run_dir": str(run_dir)}), run_dir)
    (model,) = export(run_dir, "onnx", tmp_path / "cartpole.onnx")
    expected = evaluate(run_dir, episodes=5, deterministic=True, seed=3).returns
    done = subprocess.run([sys.executable, str(EXAMPLES / "deploy_onnx.py"), str(model), "--episodes", "5",
                           "--seed", "3"], capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    played = json.loads(done.stdout.strip().splitlines()[-1])
    assert played["returns"] == expected.tolist()  # episode by episode, so the means are equal too
    assert played["return_mean"] == pytest.approx(expected.mean())
