"""The Ray launcher while Ray restarts a dead worker: Ray answers calls made before the worker is back with
``ActorUnavailableError`` at once (it does not queue them), and that is no reason to give the actor up.

Ray cannot be made to take a given time over a restart, so the Ray module here is a stand-in that answers
the launcher's calls from a script; the exceptions are Ray's own. The real restart is in
tests/integration/test_ray.py."""

from __future__ import annotations

import logging
import time

import pytest

exceptions = pytest.importorskip("ray.exceptions")

from conftest import learner_config  # noqa: E402

from lockstep.launch import ray as ray_launch  # noqa: E402
from lockstep.launch.restart import RestartPolicy  # noqa: E402

PENDING = object()  # a call that has not returned (a restarted actor's loop runs on)


class _Ref:
    def __init__(self, answer):
        self.answer = answer  # a value, or an exception to raise


class _ScriptedRay:
    """``ray.get`` and ``ray.wait`` over refs whose answers are known when they are made."""

    exceptions = exceptions

    def wait(self, refs, num_returns=1, timeout=None):
        ready = [ref for ref in refs if ref.answer is not PENDING]
        return ready, [ref for ref in refs if ref.answer is PENDING]

    def get(self, ref):
        if isinstance(ref.answer, BaseException):
            raise ref.answer
        return ref.answer


class _Method:
    def __init__(self, answers):
        self.answers = answers

    def remote(self):
        return _Ref(self.answers.pop(0))


class _Handle:
    def __init__(self, where, run):
        self.where, self.run = _Method(where), _Method(run)


def _restarting():
    return exceptions.ActorUnavailableError("The actor is temporarily unavailable: IOError: The actor is "
                                            "restarting.", None)


def _died():
    return exceptions.ActorUnavailableError("The actor is temporarily unavailable: RpcError: Socket closed", None)


def _one_actor(tmp_path, where: list, run: list) -> tuple[ray_launch.RayActors, ray_launch._Actor]:
    """A launcher of one actor whose calls are answered, in turn, by ``where`` and ``run``."""
    launcher = ray_launch.RayActors(learner_config({"actors.launcher": "ray", "actors.count": 1}), tmp_path, None,
                                    RestartPolicy(max_restarts=3, backoff_s=0.0))
    launcher._ray = _ScriptedRay()
    actor = ray_launch._Actor(0, _Handle(where, run))
    launcher._call(actor)
    launcher.actors.append(actor)
    launcher._started = time.monotonic()
    return launcher, actor


def test_calls_made_while_ray_restarts_the_worker_are_made_again_and_the_restart_is_counted(tmp_path, caplog,
                                                                                             monkeypatch):
    monkeypatch.setattr(ray_launch, "RESTARTING_POLL_S", 0.0)
    # started; its worker dies; twice the calls find it restarting; then it is back (its run never returns)
    launcher, actor = _one_actor(tmp_path, [(101, "vm"), _restarting(), _restarting(), (102, "vm")],
                                 [_died(), _restarting(), _restarting(), PENDING])
    with caplog.at_level(logging.INFO, logger="lockstep.train"):
        for _ in range(6):
            launcher.check(training=True)
    assert not actor.gone, caplog.text
    assert launcher.restarts == 1 and actor.pid == 102
    assert "actor 0 restarted by Ray (restart 1 of at most 3): worker pid 102" in caplog.text
    assert "could not restart" not in caplog.text


def test_an_actor_ray_cannot_bring_back_in_time_is_given_up(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(ray_launch, "RESTARTING_POLL_S", 0.0)
    monkeypatch.setattr(ray_launch, "RESTARTING_LIMIT_S", 0.0)
    launcher, actor = _one_actor(tmp_path, [(101, "vm"), _restarting(), _restarting()],
                                 [_died(), _restarting(), _restarting()])
    with caplog.at_level(logging.INFO, logger="lockstep.train"):
        for _ in range(4):
            launcher.check(training=True)
            time.sleep(0.001)
    assert actor.gone and launcher.restarts == 0
    assert "actor 0 is gone: Ray could not restart it" in caplog.text
