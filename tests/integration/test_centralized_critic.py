"""MAPPO's centralized critic (``model.critic_input: global``) in real training: the critic learns a value that
hangs on another agent's observation, and a strict run with the global state passes the audit."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import learner_config

from lockstep.envs.spaces import AGENT_ID_LEAF, GLOBAL_LEAF
from lockstep.launch.local import train
from lockstep.observe.run_dir import RunDir
from lockstep.tools import audit
from lockstep.tools.eval import evaluate

PARTNERS = "pettingzoo:lockstep.envs.partners"  # each agent's reward holds its partner's bit, which it cannot see
T = 16
SLOTS = 2 * 4 * 2  # actors x envs x agents


def _config(critic_input: str, **overrides):
    return learner_config({"env.id": PARTNERS, "actors.count": 2, "actors.envs_per_actor": 4,
                           "actors.transport": "inprocess", "ppo.steps_per_env": T, "ppo.total_steps": 40 * SLOTS * T,
                           "ppo.lr": 0.003, "model.hidden": [16], "model.critic_input": critic_input,
                           "learner.device": "cpu", **overrides})


def _late_value_loss(run_dir) -> float:
    rows = RunDir(run_dir).metrics()
    return float(np.mean([float(row["value_loss"]) for row in rows[-10:]]))


def test_the_centralized_critic_predicts_what_only_the_partner_sees(tmp_path):
    # a one-step episode's value is its reward: own bit said back (learnt by both) + the partner's bit, whose
    # variance (1/4) an own-observation critic keeps (value_loss = 0.5 * mse >= 0.125) and a global one does not
    losses = {}
    for critic_input in ("own", "global"):
        train(_config(critic_input), tmp_path / critic_input)
        losses[critic_input] = _late_value_loss(tmp_path / critic_input)
    assert losses["own"] > 0.1, losses
    assert losses["global"] < 0.3 * losses["own"], losses


@pytest.mark.parametrize("state", [False, True])
def test_a_strict_run_with_the_global_state_passes_the_audit_and_evaluates(tmp_path, state):
    run_dir = tmp_path / "run"
    train(_config("global", **{"ppo.total_steps": 3 * SLOTS * T, "run.audit": True, "env.normalize_obs": True,
                               "env.kwargs": {"length": 4, "state": state}, "actors.transport": "shm"}), run_dir)
    report = audit.check(run_dir)
    assert report.exit_code == 0 and report.differing == 0 and report.samples == 3 * SLOTS * T, report
    with np.load(run_dir / "audit" / "batch_000001.npz") as batch:
        bits, state_leaf = batch["obs/observation"][..., 0], batch[f"obs/{GLOBAL_LEAF}"]  # [T, N], [T, N, S]
        assert (batch[f"obs/{AGENT_ID_LEAF}"][:, 0] == [1, 0]).all()
    assert state_leaf.shape == (T, SLOTS, 3 if state else 2)
    # the state every slot of an env carries holds both agents' bits: the slot's own and its partner's
    assert (state_leaf[:, 0::2, 0] == bits[:, 0::2]).all() and (state_leaf[:, 0::2, 1] == bits[:, 1::2]).all()
    assert (state_leaf[:, 1::2, :2] == state_leaf[:, 0::2, :2]).all()
    assert len(evaluate(run_dir, episodes=2).episodes) == 2  # lockstep eval: the actor acts on its own observation
