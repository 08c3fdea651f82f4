"""A PettingZoo parallel env end to end: its agents as slots of real actor processes (shared memory) and of
in-process env loops, agents leaving early masked out of training, and ``lockstep audit`` on the trail."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import learner_config

from lockstep.envs.departures import LIFETIMES
from lockstep.envs.spaces import ACTIVE_LEAF
from lockstep.launch.local import train
from lockstep.observe.run_dir import RunDir
from lockstep.tools import audit

DEPARTURES = "pettingzoo:lockstep.envs.departures"  # a0 leaves after 3 steps, a1 after 6, a2 after 10 (episode)
T = 20  # two episodes per unroll, each unroll starting at an episode's first step


def _config(transport: str, **overrides):
    return learner_config({"env.id": DEPARTURES, "actors.count": 2, "actors.envs_per_actor": 2,
                           "actors.transport": transport, "ppo.steps_per_env": T, "model.hidden": [16],
                           "learner.device": "cpu", **overrides})


@pytest.mark.parametrize("transport", ["shm", "inprocess"])
def test_agents_that_leave_early_are_masked_out_and_the_run_passes_the_audit(tmp_path, transport):
    run_dir = tmp_path / "run"
    summary = train(_config(transport, **{"ppo.total_steps": 4 * 2 * 2 * 3 * T, "run.audit": True,
                                          "env.agent_id": True}), run_dir)
    slots = 2 * 2 * 3  # actors x envs x agents
    assert summary["env_steps"] == 4 * slots * T
    # per-env returns: each env's episode (10 steps) the sum of its three agents'; 8 per env in 4 x 20 steps
    assert summary["team_episodes"] == 2 * 2 * 8, summary
    rows = RunDir(run_dir).metrics()
    assert int(rows[-1]["team_episodes"]) == 2 * 2 * 8
    assert float(rows[-1]["team_return_mean"]) == pytest.approx(summary["team_return_mean"])
    assert 0 <= summary["team_return_mean"] <= 3 + 6 + 10
    report = audit.check(run_dir)
    assert report.exit_code == 0 and report.differing == 0 and report.samples == 4 * slots * T
    gone_per_episode = {agent: 10 - life for agent, life in LIFETIMES.items()}  # a0: 7, a1: 4, a2: 0
    assert report.inactive == 4 * 2 * 2 * 2 * sum(gone_per_episode.values())  # iterations x envs x episodes
    for path in sorted((run_dir / "audit").glob("batch_*.npz")):
        with np.load(path) as batch:
            active = batch[f"obs/{ACTIVE_LEAF}"][..., 0]  # [T, N]
            observation = batch["obs/observation"]  # [T, N, 3]
            agent_id = batch["obs/agent_id"]  # [T, N, 3]: env.agent_id, in every step, inactive ones too
        for n in range(slots):
            agent = list(LIFETIMES)[n % 3]
            expected = (np.arange(T) % 10) < LIFETIMES[agent]
            assert (active[:, n] == expected).all(), (path.name, n)
            assert not observation[~expected, n].any()  # a departed agent's placeholder reached nobody's loss
            assert (agent_id[:, n] == np.eye(3)[n % 3]).all(), (path.name, n)
    assert "agents that had left" in audit.format_report(report)


def test_the_agents_learn_to_say_their_cue_back(tmp_path):
    # random: half of each agent's lifetime, (1.5 + 3 + 5) / 3 = 3.17 a mean agent episode; best (3 + 6 + 10) / 3
    summary = train(_config("inprocess", **{"ppo.total_steps": 48 * 12 * T, "ppo.lr": 0.003}), tmp_path / "run")
    assert summary["episode_return_mean"] > 4.5, summary["episode_return_mean"]  # seeds 1-3: 5.4, 5.2, 5.3


@pytest.mark.parametrize("transport", ["shm", "inprocess"])
def test_env_kwargs_build_every_actor_env(tmp_path, transport):
    """simple_spread with N=2 instead of its default 3: 2 actors x 2 envs x 2 agents = 8 slots."""
    pytest.importorskip("mpe2")
    run_dir = tmp_path / "run"
    config = learner_config({"env.id": "pettingzoo:mpe2.simple_spread_v3", "env.kwargs": {"N": 2, "max_cycles": 8},
                             "actors.count": 2, "actors.envs_per_actor": 2, "actors.transport": transport,
                             "ppo.steps_per_env": 16, "ppo.total_steps": 2 * 8 * 16, "model.hidden": [8],
                             "learner.device": "cpu", "run.audit": True})
    summary = train(config, run_dir)
    assert summary["env_steps"] == 2 * 8 * 16
    with np.load(run_dir / "audit" / "batch_000001.npz") as batch:
        assert batch["obs/observation"].shape[:2] == (16, 8)
    assert audit.check(run_dir).exit_code == 0


@pytest.mark.parametrize("transport", ["shm", "inprocess"])
def test_a_mask_of_another_key_nested_observations_and_obs_keys_train_with_departures(tmp_path, transport):
    """Where the slots meet the other features: an action mask under ``legal`` (departed agents' slots must still
    allow an action, and the env raises for an illegal one), a Tuple observation holding a Dict, and
    ``env.obs_keys`` that does not name ``agent_active`` (which must stay, or departed steps would be trained on)."""
    run_dir = tmp_path / "run"
    summary = train(_config(transport, **{"env.kwargs": {"mask_key": "legal", "nested": True},
                                          "env.action_mask_key": "legal", "env.obs_keys": ["cue", "legal"],
                                          "ppo.total_steps": 2 * 2 * 2 * 3 * T, "run.audit": True}), run_dir)
    assert summary["env_steps"] == 2 * 2 * 2 * 3 * T
    report = audit.check(run_dir)
    assert report.exit_code == 0 and report.differing == 0
    assert report.inactive == 2 * 2 * 2 * 2 * (7 + 4)  # iterations x actors x envs x episodes x departed steps
    with np.load(run_dir / "audit" / "batch_000001.npz") as batch:
        assert batch["obs/cue[0]"].shape == (T, 12, 3) and batch["obs/cue[1].bit"].shape == (T, 12)
        legal, active = batch["obs/legal"], batch[f"obs/{ACTIVE_LEAF}"][..., 0]
        assert (legal[active == 0] == 1).all() and (legal.sum(-1) >= 1).all()
