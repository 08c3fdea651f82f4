"""Evaluation while training (``run.eval_every``): its columns, best.pt and videos, an unchanged training curve,
and ``lockstep eval --checkpoint best``.

The evaluation process starts beside training and takes seconds to load torch at its lower priority, so a
short run can end before any evaluation reaches a metrics row. The run with evaluation therefore trains
until its metrics.csv has an evaluation row and at least ``ITERATIONS`` rows (then it is stopped, as a
user's Ctrl-C stops it); the run without trains ``ITERATIONS`` iterations. Strict runs are reproducible
row by row, so their first ``ITERATIONS`` rows must be identical.
"""

from __future__ import annotations

import csv
import logging
import os
import signal
import sys
import threading
import time

import pytest

from lockstep import cli
from lockstep.config import Config
from lockstep.launch.inprocess import InProcessActors
from lockstep.launch.local import train
from lockstep.launch.restart import RestartPolicy
from lockstep.learner import checkpoint
from lockstep.learner.wiring import Learner
from lockstep.tools import eval as evaluation

# CartPole whose step takes a millisecond, as a real env's does: training then leaves the evaluation process
# (at its lower priority) enough CPU to load torch within seconds; plain CartPole in process keeps a core
# busy, and on a loaded 2-core machine the first evaluation came after half a minute.
SLOW_ENV = '''
import time

import gymnasium as gym


class Slow(gym.Wrapper):
    def step(self, action):
        time.sleep(0.001)
        return self.env.step(action)


def make(**kwargs):
    return Slow(gym.make("CartPole-v1", **kwargs))
'''
ENV_ID = "slowcartpole:make"
ITERATIONS = 60
T, ENVS = 8, 2
WAIT_S = 240  # the most the run with evaluation trains while its first evaluation is awaited (a failure after)
REPRODUCIBLE = ("episodes", "episode_return_mean", "episode_return_mean20", "policy_loss", "value_loss", "env_steps")
EVAL = ("eval_return_mean", "eval_return_std", "eval_iteration", "eval_env_steps")


def _config(eval_every: int, iterations: int) -> Config:
    config = Config()
    config.env.id = ENV_ID
    config.actors.count, config.actors.envs_per_actor = 1, ENVS
    config.ppo.steps_per_env, config.ppo.total_steps = T, ENVS * T * iterations
    config.ppo.epochs, config.ppo.minibatches = 1, 1  # cheap iterations: the point is the rows, not learning
    config.ppo.anneal_lr = False  # its schedule depends on ppo.total_steps, which the two runs do not share
    config.model.hidden = [16]
    config.actors.transport = "inprocess"
    config.learner.device = "cpu"
    config.run.progress = False
    config.run.thresholds = []
    config.run.eval_every, config.run.eval_episodes = eval_every, 2
    config.run.eval_video_every = 1000 if eval_every else 0  # the first evaluation only
    return config


def _rows(run_dir) -> list[dict[str, str]]:
    path = run_dir / "metrics.csv"
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _train_until(run_dir, done) -> tuple[Learner, dict]:
    """Train with evaluation every iteration until ``done(learner, rows)``; the learner and its summary."""
    learner = Learner(_config(eval_every=1, iterations=100_000), run_dir)
    result = {}
    serving = threading.Thread(target=lambda: result.update(summary=learner.serve()))
    serving.start()
    try:
        learner.wait_ready(timeout=60)
        actors = InProcessActors(ENV_ID, ENVS, [0], RestartPolicy(max_restarts=0))
        actors.start(learner)
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and serving.is_alive() and not done(learner, _rows(run_dir)):
            time.sleep(0.2)
    finally:
        learner.stop()
        serving.join(timeout=60)
    assert not serving.is_alive() and "summary" in result
    return learner, result["summary"]


def _train_until_evaluated(run_dir) -> dict:
    """Train until a row holds an evaluation and there are ITERATIONS rows."""
    return _train_until(run_dir, lambda _, rows: len(rows) >= ITERATIONS
                        and any(r["eval_return_mean"] for r in rows))[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("evaltrain")
    (base / "slowcartpole.py").write_text(SLOW_ENV)
    sys.path.insert(0, str(base))  # the evaluation process is spawned with this sys.path, and finds it too
    try:
        plain = train(_config(eval_every=0, iterations=ITERATIONS), base / "plain")
        yield base, plain, _train_until_evaluated(base / "evaluated")
    finally:
        sys.path.remove(str(base))
        sys.modules.pop("slowcartpole", None)


def test_evaluation_while_training_writes_its_columns_and_best_pt(runs):
    base, _, summary = runs
    rows = _rows(base / "evaluated")
    assert any(r["eval_return_mean"] for r in rows), "no evaluation reached metrics.csv within the run"
    for row in rows:
        if row["eval_return_mean"]:  # an evaluation's row: of a version trained at or before it
            assert all(row[c] for c in EVAL)
            assert 1 <= int(row["eval_iteration"]) <= int(row["iteration"])
            assert float(row["eval_return_mean"]) > 0 and float(row["eval_return_std"]) >= 0
        else:
            assert not any(row[c] for c in EVAL)  # empty where no evaluation finished
    found = summary["evaluation"]
    # every iteration was due: each one was either evaluated (the last one in flight is awaited at the end) or skipped
    assert found["finished"] + summary["skipped_evaluations"] == summary["iterations"]
    assert summary["skipped_evaluations"] == sum(int(r["skipped_evaluations"]) for r in rows)
    best = checkpoint.load(base / "evaluated" / "checkpoints" / checkpoint.BEST_FILE)
    assert best["eval"]["return_mean"] == found["best"]["return_mean"]
    assert best["eval"]["return_mean"] >= max(float(r["eval_return_mean"]) for r in rows if r["eval_return_mean"])
    assert best["trainer"]["iteration"] == found["best"]["iteration"]
    assert checkpoint.find(base / "evaluated" / "checkpoints", checkpoint.NEWEST).name != checkpoint.BEST_FILE


def test_the_first_evaluation_records_its_episodes_as_lockstep_eval_video_does(runs):
    base, _, _ = runs
    videos = base / "evaluated" / "videos"
    assert sorted(p.name for p in videos.iterdir()) == ["iter_000001"]  # evaluations 1, 1001, ...: the first
    assert sorted(p.name for p in (videos / "iter_000001").iterdir()) == ["episode-000.mp4", "episode-001.mp4"]
    assert all(p.stat().st_size > 0 for p in (videos / "iter_000001").iterdir())


def test_a_strict_run_trains_the_same_with_and_without_evaluation(runs):
    base, _, _ = runs
    plain, evaluated = _rows(base / "plain"), _rows(base / "evaluated")
    assert len(plain) == ITERATIONS and len(evaluated) >= ITERATIONS
    for column in REPRODUCIBLE:
        assert [r[column] for r in evaluated[:ITERATIONS]] == [r[column] for r in plain], column
    assert not any(r[c] for r in plain for c in EVAL)


def test_lockstep_eval_plays_best_pt_as_the_evaluation_did(runs, capsys):
    base, _, summary = runs
    found = summary["evaluation"]
    run_dir = base / "evaluated"
    # the evaluation's own seed and actions: the same episodes, so the same mean return
    assert cli.main(["eval", str(run_dir), "--checkpoint", "best", "--episodes", "2", "--deterministic",
                     "--seed", str(found["seed"]), "--out", str(base / "best.json")]) == 0
    assert "best.pt (iteration" in capsys.readouterr().out
    report = evaluation.evaluate(run_dir, episodes=2, deterministic=True, seed=found["seed"], checkpoint="best")
    assert report.iteration == found["best"]["iteration"]
    assert report.returns.mean() == pytest.approx(found["best"]["return_mean"])


def test_a_killed_evaluation_process_stops_evaluation_and_training_goes_on(runs, caplog):
    base, _, _ = runs
    killed = {}

    def kill_then_train_on(learner, rows):
        evaluator = learner.report.evaluator
        if not killed and evaluator.submitted:  # an evaluation in flight
            os.kill(evaluator._process.pid, signal.SIGKILL)
            killed["at"] = len(rows)
        return bool(killed) and len(rows) >= killed["at"] + 20

    caplog.set_level(logging.INFO, logger="lockstep.learner.evaluation")
    learner, summary = _train_until(base / "killed", kill_then_train_on)
    assert summary["error"] is None and summary["iterations"] >= killed["at"] + 20
    assert "the evaluation process died (exit code -9)" in caplog.text
    evaluation_summary = summary["evaluation"]
    assert evaluation_summary["finished"] == 0 and not learner.report.evaluator.due(summary["iterations"])
    assert not any(r["eval_return_mean"] for r in _rows(base / "killed"))
