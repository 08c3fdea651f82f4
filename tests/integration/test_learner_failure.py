"""An exception in the learner's own code (here its forward pass) ends the run once, with that error (issue 34,
item 8): ``lockstep train`` exits 1 showing the error a few times, not in an endless reconnect loop; its books
end at the last iteration it completed; and an actor told by its learner that it failed (INTERNAL) stops
after ``LEARNER_FAILURES`` such answers instead of reconnecting for ever. A watchdog that raises ends the run
the same way.

The fault is a real user's: a policy (``model.policy``) whose forward pass raises once it has answered a few
requests, as a bug in a network, a kernel or the observation statistics would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from conftest import learner_config, lockstep_cmd

from lockstep.actor import LEARNER_FAILURES
from lockstep.learner import RunFailed, checkpoint
from lockstep.observe.run_dir import RunDir

FAULT = "injected fault in the forward pass"

# A policy whose inference (under torch.inference_mode, as the learner's batcher runs it) raises from its
# (FAULT_AFTER + 1)-th call on; training and everything else run as usual.
FAULTY_POLICY = f'''
import os

import torch
from torch import nn

import lockstep

AFTER = int(os.environ.get("FAULT_AFTER", "0"))
calls = 0


class FaultyPolicy(lockstep.Policy):
    def __init__(self, observation, action):
        super().__init__(action)
        self.policy_net = nn.Linear(observation.shape[0], self.action_dim)
        self.value_net = nn.Linear(observation.shape[0], 1)

    def features(self, obs):
        global calls
        if torch.is_inference_mode_enabled():
            calls += 1
            if calls > AFTER:
                raise RuntimeError("{FAULT}")
        return self.policy_net(obs.float()), self.value_net(obs.float()).squeeze(-1)


def make_policy(observation, action, model):
    return FaultyPolicy(observation, action)
'''

ACTORS = 2


@pytest.fixture
def faulty_policy(tmp_path, monkeypatch) -> str:
    """The faulty policy's module on the path of this process and of the processes it starts."""
    (tmp_path / "faulty_policy.py").write_text(FAULTY_POLICY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    sys.modules.pop("faulty_policy", None)
    yield "faulty_policy:make_policy"
    sys.modules.pop("faulty_policy", None)


# 2 actors x 2 envs, 16 steps each per iteration: at most 32 forward passes an iteration, so the fault at
# the 81st comes after 2 iterations at least, in the third or a later one
FAULT_AFTER = "80"
SETTINGS = {"actors.count": ACTORS, "actors.envs_per_actor": 2, "ppo.steps_per_env": 16, "ppo.total_steps": 10**6,
            "run.checkpoint_every": 1, "run.keep_checkpoints": 100, "ppo.epochs": 1, "ppo.minibatches": 1}


def test_a_forward_pass_that_raises_ends_lockstep_train_once_with_its_error_and_the_books_intact(
        tmp_path, faulty_policy, monkeypatch):
    monkeypatch.setenv("FAULT_AFTER", FAULT_AFTER)
    run_dir = tmp_path / "run"
    train = subprocess.run(
        [*lockstep_cmd(), "train", "--env", "CartPole-v1", "--run-dir", str(run_dir), "--transport", "shm",
         "--no-progress", "--set", f"model.policy={faulty_policy}",
         *(f"--{key}={value}" for key, value in SETTINGS.items())],
        capture_output=True, text=True, timeout=120)
    out = train.stdout + train.stderr
    assert train.returncode == 1, out[-5000:]
    # the learner's traceback and the command's last line, and at most a line from each actor told of it
    # (plus one told again at a hello while the learner stopped): not once per request
    assert 2 <= out.count(FAULT) <= 2 + 2 * ACTORS, out[-5000:]
    assert out.count("Traceback") == 1, out[-5000:]
    assert out.count("reconnecting to") <= 2 * ACTORS * LEARNER_FAILURES, out[-5000:]
    assert "restarting actor" not in out, out[-5000:]
    assert f"lockstep: the learner failed: RuntimeError: {FAULT}" in train.stderr.splitlines()[-1]
    _assert_books_end_at_the_last_completed_iteration(run_dir)


def test_in_process_actors_of_a_failed_learner_stop_and_are_not_restarted(tmp_path, faulty_policy, monkeypatch,
                                                                          caplog):
    from lockstep.launch.local import train

    monkeypatch.setenv("FAULT_AFTER", FAULT_AFTER)
    config = learner_config({**SETTINGS, "actors.transport": "inprocess", "model.policy": faulty_policy,
                             "run.run_dir": str(tmp_path / "run")})
    raised: list[BaseException] = []

    def run() -> None:
        try:
            train(config, tmp_path / "run")
        except BaseException as err:
            raised.append(err)

    thread = threading.Thread(target=run, daemon=True)  # a learner that never stops fails the test, not hangs it
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive(), "the learner still serves 120 s later"
    assert len(raised) == 1 and isinstance(raised[0], RunFailed) and FAULT in str(raised[0]), raised
    failures = [r for r in caplog.records if r.exc_info is not None]
    assert [r.getMessage() for r in failures] == ["serving the actors failed; the run stops"]  # once, not per actor
    assert "restarting actor" not in caplog.text and "(in process) failed" not in caplog.text
    _assert_books_end_at_the_last_completed_iteration(tmp_path / "run")


def _assert_books_end_at_the_last_completed_iteration(run_dir) -> None:
    rows = [row["iteration"] for row in RunDir(run_dir).metrics()]
    assert len(rows) >= 2 and rows == list(range(1, len(rows) + 1)), rows
    summary = json.loads((run_dir / "summary.json").read_text())
    assert FAULT in summary["error"] and summary["checkpoint"] is None and summary["status"] == "failed"
    assert summary["iterations"] == rows[-1]
    assert summary["transitions_collected"] == summary["transitions_trained"] + summary["dropped_transitions"]
    checkpoints = run_dir / "checkpoints"
    assert not (checkpoints / "final.pt").exists()
    newest = checkpoint.periodic(checkpoints)[-1]
    assert newest.name == f"iter_{rows[-1]:06d}.pt"  # no checkpoint claims more, none is missing
    assert checkpoint.load(newest)["trainer"]["iteration"] == rows[-1]


def test_an_actor_stops_after_its_learner_failed_three_times_and_says_why(running_learner, free_port, tmp_path,
                                                                          faulty_policy):
    token = "learner-failure-test"
    actor = subprocess.Popen(
        [*lockstep_cmd(), "actor", "--learner", f"127.0.0.1:{free_port}", "--token", token, "--env", "CartPole-v1",
         "--actors.envs_per_actor", "2", "--retry-for", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        for _ in range(LEARNER_FAILURES):  # a failed learner restarted, as a supervisor would, at most 3 times
            if actor.poll() is not None:  # (a learner that is stopping refuses a hello with INTERNAL too)
                break
            learner = running_learner({"model.policy": faulty_policy, "learner.listen": f"127.0.0.1:{free_port}"},
                                      token=token)  # each fails at its first forward pass
            while learner.thread.is_alive() and actor.poll() is None:
                assert time.monotonic() < deadline, "the learner neither failed nor stopped"
                time.sleep(0.05)
            if not learner.thread.is_alive():
                with pytest.raises(RunFailed, match=FAULT):
                    learner.wait_finished()
        out, _ = actor.communicate(timeout=30)  # it gives up at once, not after --retry-for
    finally:
        actor.kill()
    assert actor.returncode == 3, out
    told = [line for line in out.splitlines() if f"the learner failed: RuntimeError: {FAULT}" in line]
    assert len(told) == LEARNER_FAILURES, out
    assert "giving up" in told[-1] and "failed 3 times without an action in between" in told[-1], out


def test_a_watchdog_that_raises_ends_the_run_with_its_error(running_learner, monkeypatch):
    from lockstep.learner.session import Sessions

    def evict_late(self, rule) -> None:  # what a fault in the step deadline's bookkeeping would raise
        raise RuntimeError("injected fault in the watchdog")

    monkeypatch.setattr(Sessions, "evict_late", evict_late)
    learner = running_learner({"sync.stall_s": 0.2})  # the watchdog looks every 0.1 s
    with pytest.raises(RunFailed, match="injected fault in the watchdog"):
        learner.wait_finished(timeout=30)
    assert "injected fault in the watchdog" in learner.run.summary()["error"]
