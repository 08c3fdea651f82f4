"""Self-play on turn-based games end to end: the learning player's moves over real actor processes (shared
memory) and in-process env loops, the opponents' moves served by the learner over each actor's second
connection and never recorded, ``lockstep audit`` on the trail, and ``lockstep eval --opponent``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import learner_config
from lockstep_bench import suites

from lockstep.envs import selfplay, turns
from lockstep.launch.local import train
from lockstep.observe.run_dir import RunDir
from lockstep.tools import audit
from lockstep.tools import eval as evaluation

TURNS = "pettingzoo:lockstep.envs.turns"  # 8 plies a game, 4 per seat; observations say who moves at which ply
FOLDS = "pettingzoo:lockstep.envs.folds"  # a fold ends a game: the opponent moving first may end it at once
T = 16  # four games of the learning player per unroll: every unroll starts at a game's first move


def _config(transport: str, **overrides):
    return learner_config({"env.id": TURNS, "actors.count": 2, "actors.envs_per_actor": 2,
                           "actors.transport": transport, "ppo.steps_per_env": T, "model.hidden": [16],
                           "learner.device": "cpu", "selfplay.snapshot_every": 2, **overrides})


@pytest.mark.parametrize("transport", ["shm", "inprocess"])
def test_only_the_learning_players_moves_are_recorded_and_a_strict_run_passes_the_audit(tmp_path, transport):
    run_dir = tmp_path / "run"
    summary = train(_config(transport, **{"ppo.total_steps": 4 * 4 * T, "run.audit": True}), run_dir)
    assert summary["env_steps"] == 4 * 4 * T
    # as many opponent moves as learning ones (each game: 4 and 4), the last games' not all played yet
    assert 4 * 4 * T - 4 * 4 <= summary["opponent_moves"] <= 4 * 4 * T + 4
    report = audit.check(run_dir)
    assert report.exit_code == 0 and report.differing == 0 and report.samples == 4 * 4 * T
    assert report.opponent_moves == summary["opponent_moves"]
    assert "none is in any batch" in audit.format_report(report)
    per_game = turns.PLIES // 2
    for path in sorted((run_dir / "audit").glob("batch_*.npz")):
        with np.load(path) as batch:
            observation = batch["obs/observation"]  # [T, N, 3]: mover is seat 0, mover is seat 1, ply / 8
        seat = observation[..., 1].astype(int)  # [T, N]
        ply = np.rint(observation[..., 2] * turns.PLIES).astype(int)
        for n in range(observation.shape[1]):
            games = seat[:, n].reshape(-1, per_game), ply[:, n].reshape(-1, per_game)
            for g, (seats, plies) in enumerate(zip(*games)):
                # one seat per game, its plies every other one: an opponent's move would be the other seat's,
                # at an odd distance
                assert (seats == seats[0]).all(), (path.name, n, g, seats)
                assert plies.tolist() == list(range(seats[0], turns.PLIES, 2)), (path.name, n, g, plies)
            firsts = games[0][:, 0]
            assert (firsts[1:] != firsts[:-1]).all()  # the learning seat alternates game by game


def test_self_play_learns_to_beat_a_random_opponent_and_eval_reports_the_win_rate(tmp_path, capsys):
    # always playing 1 wins 94% against random moves; random against random wins 36%
    run_dir = tmp_path / "run"
    summary = train(_config("inprocess", **{"actors.envs_per_actor": 4, "ppo.total_steps": 48 * 8 * T,
                                            "ppo.lr": 0.003, "run.eval_every": 8, "run.eval_episodes": 40}), run_dir)
    # evaluation while training: the win rates against random moves and against the pool's oldest member
    # (on a busy host the evaluation process may start late: then the one in flight at the end is all there is,
    # in summary.json and no metrics row)
    last = summary["evaluation"]["last"]
    assert last is not None and 0 <= last["win_rate_random"] <= 1 and 0 <= last["win_rate_oldest"] <= 1, summary
    assert last["oldest_version"] % 2 == 0 and last["oldest_version"] < last["version"]
    evaluated = [r for r in RunDir(run_dir).metrics() if r["eval_win_rate_random"]]
    assert summary["evaluation"]["finished"] >= len(evaluated)
    for row in evaluated:
        win, mean = float(row["eval_win_rate_random"]), float(row["eval_return_mean"])  # mean: wins less losses
        assert 2 * win - 1 - 1e-9 <= mean <= win + 1e-9, row
        assert 0 <= float(row["eval_win_rate_oldest"]) <= 1  # the pool holds version 0 from the start
        assert int(row["eval_oldest_version"]) % 2 == 0 and int(row["eval_oldest_version"]) < int(row["eval_iteration"])
    assert evaluation.main(run_dir, episodes=200, opponent="random") == 0
    out = capsys.readouterr().out
    assert "against random: win_rate" in out
    report = evaluation.evaluate(run_dir, episodes=200, opponent="random")
    assert report.to_dict()["win_rate"] > 0.75, report.outcomes()
    assert sum(report.outcomes().values()) == pytest.approx(1.0)
    # what `lockstep bench learn --suite selfplay` reports of each seed: the mode's win rate over 200 games
    assert selfplay.is_game(TURNS) and not selfplay.is_game("pettingzoo:lockstep.envs.departures")
    assert suites._win_rate_against_random(run_dir) > 0.75


@pytest.mark.parametrize("transport", ["shm", "inprocess"])
def test_games_the_opponent_ends_before_the_learner_moves_are_counted_apart_and_eval_leaves_them_out(
        tmp_path, capsys, transport):
    # the opponent moves first in every other game and, acting at random at first, folds it at once half the
    # time: those games are no episodes (none of length 0 reaches the learner, which would refuse it)
    run_dir = tmp_path / "run"
    total = 3 * 2 * 2 * T
    summary = train(_config(transport, **{"env.id": FOLDS, "ppo.total_steps": total, "selfplay.random": 0.5}),
                    run_dir)
    assert summary["env_steps"] == total and summary["error"] is None
    decided = summary["games_decided_before_move"]
    assert decided > 0 and summary["games"] == summary["episodes"] + decided
    rows = RunDir(run_dir).metrics()
    assert [r["games"] - r["episodes"] for r in rows] == [r["games_decided_before_move"] for r in rows]
    assert rows[-1]["games_decided_before_move"] == decided
    # lockstep eval: the win rate of the learning player's games only, the others counted apart
    assert evaluation.main(run_dir, episodes=40, opponent="random", out=str(tmp_path / "eval.json")) == 0
    out = capsys.readouterr().out
    report = json.loads((tmp_path / "eval.json").read_text())
    assert len(report["episodes"]) == 40 and all(e["length"] >= 1 for e in report["episodes"])
    assert report["decided_before_move"] > 0 and report["games"] == 40 + report["decided_before_move"]
    assert (f"{report['games']} games played, {report['decided_before_move']} of them decided before the learning "
            "player moved") in out
