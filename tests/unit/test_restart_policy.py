"""The one restart policy (``launch.restart.RestartPolicy``): what it restarts, after which backoff, how often;
and the in-process launcher following it with a real learner and a real env that raises."""

from __future__ import annotations

import sys
import time

import pytest

from lockstep.launch.inprocess import InProcessActors
from lockstep.launch.restart import FAILED, FINISHED, LEARNER_FAILED, REFUSED, RestartPolicy

RAISING_ENV = '''
import gymnasium as gym


class Raises(gym.Wrapper):
    """Raises at every env's third step: each actor fails soon after each start."""

    def reset(self, **kwargs):
        self.steps = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        self.steps += 1
        if self.steps == 3:
            raise RuntimeError("the simulator crashed (injected)")
        return self.env.step(action)


def make(**kwargs):
    return Raises(gym.make("CartPole-v1", **kwargs))
'''


def test_a_dead_actor_is_restarted_after_a_doubling_backoff_up_to_its_cap():
    policy = RestartPolicy(max_restarts=10, backoff_s=1.0, max_backoff_s=4.0)
    delays = []
    for _ in range(4):
        delays.append(policy.delay(0, -9, "died (exit code -9)", training=True))
        policy.restarted(0)
    assert delays == [1.0, 2.0, 4.0, 4.0]
    assert policy.delay(1, None, "died", training=True) == 1.0  # each actor has its own backoff
    assert policy.restarts == 4 and policy.restarts_of(0) == 4 and policy.restarts_of(1) == 0


@pytest.mark.parametrize("code", [FINISHED, REFUSED, LEARNER_FAILED])
def test_an_actor_that_finished_was_refused_or_whose_learner_failed_is_not_restarted(code):
    assert RestartPolicy(max_restarts=10).delay(0, code, f"exited with code {code}", training=True) is None


def test_no_restart_once_training_is_over_nor_past_max_restarts():
    policy = RestartPolicy(max_restarts=1, backoff_s=0.5)
    assert policy.delay(0, FAILED, "died", training=False) is None
    assert policy.delay(0, FAILED, "died", training=True) == 0.5
    policy.restarted(0)
    assert policy.delay(0, FAILED, "died", training=True) is None
    assert policy.restarts == 1


@pytest.fixture
def learner(tmp_path, monkeypatch, running_learner):
    (tmp_path / "raisingenv.py").write_text(RAISING_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("raisingenv", None)
    return running_learner()


def test_in_process_actors_whose_env_raises_are_restarted_with_backoff_until_their_restarts_are_spent(learner):
    backoff_s = 0.2
    actors = InProcessActors("raisingenv:make", 2, [0], RestartPolicy(2, backoff_s=backoff_s, max_backoff_s=1.0))
    actors.start(learner.learner)
    started, restarted_at = time.monotonic(), []
    try:
        deadline = started + 30
        while True:  # as launch.local.train drives a launcher: check, then ask whether all exited
            before = actors.restarts
            actors.check(training=True)
            if actors.restarts > before:
                restarted_at.append(time.monotonic() - started)
            if actors.all_exited():
                break
            assert time.monotonic() < deadline, "the actor was never given up"
            time.sleep(0.01)
    finally:
        actors.stop(grace_s=0.0)
    assert actors.restarts == 2 and actors.actors[0].handle is None  # gone for good after its 2 restarts
    assert restarted_at[0] >= backoff_s and restarted_at[1] - restarted_at[0] >= 2 * backoff_s
