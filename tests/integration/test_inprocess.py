"""In-process actors: env loops as tasks on the learner's event loop, through the same sessions and gate."""

from __future__ import annotations

import logging
import sys

import pytest
from conftest import with_settings

from lockstep.config import Config
from lockstep.launch import ActorsGone
from lockstep.launch.local import train
from lockstep.observe.run_dir import RunDir
from lockstep.tools import audit

FAILING_ENV = '''
import gymnasium as gym

FAILED = []


class FailsOnce(gym.Wrapper):
    """Raises once, at the 50th step of the first env created in this process."""

    steps = 0

    def step(self, action):
        FailsOnce.steps += 1
        if FailsOnce.steps == 50 and not FAILED:
            FAILED.append(True)
            raise RuntimeError("the simulator crashed (injected)")
        return self.env.step(action)


def make(**kwargs):
    return FailsOnce(gym.make("CartPole-v1", **kwargs))
'''


def _config(tmp_path, **changes) -> Config:
    config = Config()
    config.actors.count, config.actors.envs_per_actor = 2, 3
    config.ppo.steps_per_env, config.ppo.total_steps = 16, 2 * 3 * 16 * 8
    config.actors.transport = "inprocess"
    config.run.progress = False
    config.run.audit = True
    config.run.thresholds = []
    return with_settings(config, changes)


def test_in_process_actors_train_strictly_on_policy_and_the_audit_passes(tmp_path):
    summary = train(_config(tmp_path), tmp_path / "run")
    assert summary["env_steps"] == 2 * 3 * 16 * 8 and summary["iterations"] == 8
    assert summary["off_policy_samples"] == 0 and summary["dropped_transitions"] == 0
    assert summary["transitions_collected"] == summary["transitions_trained"]
    report = audit.check(tmp_path / "run")
    assert report.exit_code == 0 and report.differing == 0 and report.samples == 2 * 3 * 16 * 8


def test_an_in_process_actor_whose_env_raises_is_restarted_and_its_unroll_dropped(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    (tmp_path / "failingenv.py").write_text(FAILING_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("failingenv", None)
    budget = 2 * 3 * 16 * 200  # a few seconds: the restart comes after a 1 s backoff
    summary = train(_config(tmp_path, **{"env.id": "failingenv:make", "run.audit": False, "ppo.total_steps": budget}),
                    tmp_path / "run")
    assert summary["env_steps"] >= budget and summary["off_policy_samples"] == 0
    assert summary["iterations"] > 200  # phases closed with one actor while the other was restarted
    assert summary["dropped_transitions"] > 0
    assert summary["transitions_collected"] == summary["transitions_trained"] + summary["dropped_transitions"]
    _, _, after = caplog.text.partition("(in process) failed; restarting in")
    assert after and "joined" in after  # the failed actor said hello again


def test_a_run_whose_every_actor_died_for_good_ends_with_an_error_instead_of_waiting(tmp_path, monkeypatch):
    """One actor, no restarts, an env that raises at its 50th step: nothing is left to collect a phase. The
    run failed, and its summary says so: no final.pt, which ``lockstep eval`` would play as the run's policy."""
    (tmp_path / "failingenv.py").write_text(FAILING_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("failingenv", None)
    config = _config(tmp_path, **{"env.id": "failingenv:make", "run.audit": False, "actors.count": 1,
                                  "actors.envs_per_actor": 1, "actors.restarts": 0, "ppo.total_steps": 10**6})
    with pytest.raises(ActorsGone, match="every actor exited while training, and none is due to restart"):
        train(config, tmp_path / "run")
    run = RunDir(tmp_path / "run")
    assert len(run.metrics()) >= 2  # it trained before the env failed
    summary = run.summary()
    assert not (run.checkpoints / "final.pt").exists() and summary["checkpoint"] is None
    assert summary["time_limited"] is False
    assert summary["status"] == "failed" and "every actor exited while training" in summary["error"]
    assert summary["transitions_collected"] == summary["transitions_trained"] + summary["dropped_transitions"]


def test_a_run_that_spent_its_budget_or_its_time_limit_is_completed(tmp_path):
    summary = train(_config(tmp_path, **{"run.audit": False, "ppo.total_steps": 2 * 3 * 16 * 2}), tmp_path / "run")
    assert summary["status"] == "completed" and summary["time_limited"] is False and summary["error"] is None
    assert summary["checkpoint"] == "checkpoints/final.pt"
    # run.time_limit_s too ends a run as it was asked: completed, with the steps it had time for
    summary = train(_config(tmp_path, **{"run.audit": False, "ppo.total_steps": 10**6, "run.time_limit_s": 1e-3}),
                    tmp_path / "limited")
    assert summary["status"] == "completed" and summary["time_limited"] is True


@pytest.mark.parametrize("transport", ["inprocess"])
def test_the_transport_is_written_into_the_run_config(tmp_path, transport):
    train(_config(tmp_path, **{"actors.transport": transport, "ppo.total_steps": 2 * 3 * 16, "run.audit": False}),
          tmp_path / "run")
    assert f"transport: {transport}" in (tmp_path / "run" / "config.yaml").read_text()
