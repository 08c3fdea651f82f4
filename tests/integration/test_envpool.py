"""EnvPool as an actor's vector env (``envpool:TASK``): the same spaces as the Gymnasium Atari stack, lockstep's
same-step autoreset, whole-game raw scores in the episode statistics, and a strict run end to end."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from conftest import lockstep_cmd

from lockstep import envs
from lockstep.actor import EnvLoop
from lockstep.tools import audit

pytest.importorskip("envpool")


def test_spaces_are_those_of_the_gymnasium_twin_and_a_bad_task_is_named():
    pool, twin = envs.env_spec("envpool:Breakout-v5"), envs.env_spec("atari:BreakoutNoFrameskip-v4")
    assert pool.observation.mismatch(twin.observation) is None and pool.action.mismatch(twin.action) is None
    vec = envs.make_vector_env("envpool:Breakout-v5", 2)
    try:
        assert envs.SpaceSpec.from_space(vec.single_observation_space).mismatch(twin.observation) is None
    finally:
        vec.close()
    with pytest.raises(ValueError, match="GAME-v5"):
        envs.make_vector_env("envpool:Breakout", 2)


def test_episodes_reset_in_the_step_that_ended_them_and_report_whole_games():
    vec = envs.make_vector_env("envpool:Breakout-v5", 2)
    loop = EnvLoop(vec, envs.SpaceSpec.from_space(vec.single_action_space))
    loop.reset([3, 4])
    rng = np.random.default_rng(0)
    lives_lost, games = 0, []
    try:
        for _ in range(1500):
            before = loop.obs.copy()
            loop.step(rng.integers(0, 4, 2))
            for i in np.flatnonzero(loop.terminated):
                # same step: the observation after a lost life is the next life's, not the last frame stacked again
                assert not np.array_equal(loop.obs[i], before[i])
            lives_lost += int(loop.terminated.sum())
            games += list(zip(loop.ep_return, loop.ep_length))
    finally:
        vec.close()
    assert games and lives_lost >= 4 * len(games)  # episodic life: a game is five lives
    returns = np.array([r for r, _ in games])
    assert (returns >= 0).all() and (returns == np.round(returns)).all()  # raw Breakout points, whole games
    assert np.mean([n for _, n in games]) > 100  # agent steps of a whole game, not of one life


@pytest.mark.slow
def test_a_strict_run_on_envpool_actors_passes_the_audit(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run([*lockstep_cmd(), "train", "--config", "breakout", "--env", "envpool:Breakout-v5",
                             "--transport", "shm", "--actors", "1", "--envs-per-actor", "2", "--steps-per-env", "32",
                             "--total-steps", "128", "--audit", "--run-dir", str(run_dir), "--no-progress"],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == 128 and summary["off_policy_samples"] == 0
    report = audit.check(run_dir)
    assert report.exit_code == 0, audit.format_report(report)
