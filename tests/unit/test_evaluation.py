"""Evaluation while training, the parts that need no process: its seed, its figures, best.pt's name, its
TensorBoard events and its line in the progress display (the process itself: tests/integration/
test_eval_while_training.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import lockstep.envs
from lockstep.config import Config
from lockstep.learner import checkpoint, evaluation
from lockstep.observe.metrics import MetricsWriter
from lockstep.observe.progress import Progress, Status


def _config(seed: int, actors: int, envs: int) -> Config:
    config = Config()
    config.run.seed, config.actors.count, config.actors.envs_per_actor = seed, actors, envs
    return config


@pytest.mark.parametrize("seed,actors,envs", [(1, 2, 2), (0, 1, 1), (7, 8, 64)])
def test_the_evaluation_seed_is_reproducible_and_none_of_the_actors_env_seeds(seed, actors, envs):
    config = _config(seed, actors, envs)
    chosen = evaluation.eval_seed(config)
    assert chosen == evaluation.eval_seed(config)
    assert chosen not in {s for a in range(actors) for s in lockstep.envs.env_seeds(seed, a, envs)}
    assert chosen != evaluation.eval_seed(_config(seed + 1, actors, envs))


def test_the_evaluation_seed_is_none_of_the_seeds_of_an_actors_splits(monkeypatch):
    config = _config(3, 1, 4)
    config.actors.splits = 2  # members 0 and 1, of 2 envs each
    taken = lockstep.envs.env_seeds(3, 1, 2)[1]  # the second env of member 1: no env of 1 x 4 without splits
    assert taken not in lockstep.envs.env_seeds(3, 0, 4)
    real = np.random.SeedSequence

    class FirstDrawTaken(real):  # the evaluation's draw is that seed first, then the next one
        def generate_state(self, n_words, dtype=np.uint32):
            if self.spawn_key != (evaluation.EVAL_KEY,):
                return super().generate_state(n_words, dtype)
            return np.array([taken, taken + 1] + [0] * (n_words - 2), dtype)

    monkeypatch.setattr(np.random, "SeedSequence", FirstDrawTaken)
    assert evaluation.eval_seed(config) == taken + 1


def test_an_evaluation_seed_that_an_actor_has_is_passed_over(monkeypatch):
    config = _config(3, 2, 2)
    first = evaluation.eval_seed(config)
    monkeypatch.setattr(lockstep.envs, "env_seeds", lambda seed, actor, n: [first] * n)  # the same draw, taken
    chosen = evaluation.eval_seed(config)
    assert chosen != first and chosen == evaluation.eval_seed(config)


def test_an_evaluations_figures_are_the_mean_and_population_std_of_its_returns():
    result = evaluation.EvalResult(4, 512, 4, [10.0, 20.0, 30.0], [10, 20, 30], 0.1)
    assert result.return_mean == 20.0 and result.return_std == pytest.approx(np.std([10, 20, 30]))
    assert result.figures() == {"iteration": 4, "env_steps": 512, "version": 4, "episodes": 3,
                                "return_mean": 20.0, "return_std": pytest.approx(np.std([10, 20, 30]))}
    assert math.isnan(evaluation.EvalResult(4, 512, 4, [], [], 0.1, error="failed").return_mean)


def test_best_names_best_pt_and_its_absence_says_how_a_run_writes_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"run\.eval_every > 0, --eval-every N"):
        checkpoint.find(tmp_path, checkpoint.BEST)
    checkpoint.save({"trainer": {"iteration": 3}}, tmp_path / checkpoint.BEST_FILE)
    assert checkpoint.find(tmp_path, checkpoint.BEST) == tmp_path / "best.pt"
    with pytest.raises(FileNotFoundError, match="no checkpoint"):  # never what a run resumes from
        checkpoint.find(tmp_path, checkpoint.NEWEST)


def test_an_evaluations_numbers_reach_tensorboard_at_the_step_of_the_version_evaluated(tmp_path):
    writer = MetricsWriter(tmp_path)
    writer.write({"iteration": 1, "policy_version": 1, "env_steps": 512, "wall_s": 0.5, "episode_return_mean": 9.0})
    writer.write({"iteration": 2, "policy_version": 2, "env_steps": 1024, "wall_s": 1.0, "episode_return_mean": 11.0,
                  "eval_return_mean": 30.0, "eval_return_std": 2.0, "eval_iteration": 1, "eval_env_steps": 512})
    writer.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"lockstep/eval_return_mean", "lockstep/eval_return_std"} <= tags
    assert not {"lockstep/eval_iteration", "lockstep/eval_env_steps"} & tags  # the evaluation's axes
    assert [(e.step, e.value) for e in events.Scalars("lockstep/eval_return_mean")] == [(512, 30.0)]
    assert [e.step for e in events.Scalars("lockstep/episode_return_mean")] == [512, 1024]
    header, first, second = (tmp_path / "metrics.csv").read_text().splitlines()
    assert header.endswith("skipped_evaluations,eval_return_mean,eval_return_std,eval_iteration,eval_env_steps,"
                           "eval_win_rate_random,eval_win_rate_oldest,eval_oldest_version,team_episodes,"
                           "team_return_mean,eval_team_return_mean,games,games_decided_before_move,"
                           "vtrace_truncated,policy_lag_p50,policy_lag_p90,policy_lag_at_bound")
    first, second = first.rsplit(",", 3)[0], second.rsplit(",", 3)[0]  # (the lag's columns: strict's)
    assert first.endswith(",,,,,,,,,,,,,,") and second.endswith(",,30,2,1,512,,,,,,,,,")


def test_the_progress_line_shows_the_newest_evaluation_once_there_is_one():
    progress = Progress(Config(), enabled=False)
    status = Status(iteration=5, episode_return_mean=20.0)
    assert "eval" not in progress._line(status)
    evaluated = Status(iteration=5, eval_return_mean=123.4, eval_iteration=4)
    assert progress._line(evaluated).endswith("| eval 123.4 (iter 4)")


def test_the_end_of_run_lines_name_the_best_evaluation_and_best_pt(tmp_path, capsys):
    from lockstep import cli

    summary = {"env_steps": 2048, "wall_s": 3.0, "sps": 682.7, "episode_return_mean": 50.0, "first_reached": {}}
    cli._print_summary(summary, tmp_path)
    assert "best evaluation" not in capsys.readouterr().out
    best = {"iteration": 4, "env_steps": 1024, "return_mean": 87.5, "return_std": 3.25}
    cli._print_summary({**summary, "evaluation": {"best": best}}, tmp_path)
    assert (f"best evaluation: return 87.5 ± 3.2 at iteration 4 (1,024 env steps), {tmp_path}/checkpoints/best.pt"
            in capsys.readouterr().out)


def test_a_resumed_run_must_beat_the_best_pt_it_has(tmp_path):
    assert evaluation._stored_best(tmp_path, "trained") is None
    figures = evaluation.EvalResult(3, 96, 3, [40.0, 45.0], [40, 45], 0.1).figures()
    checkpoint.save({"trainer": {"iteration": 3}, "eval": {**figures, "deterministic": True, "seed": 5}},
                    tmp_path / "checkpoints" / checkpoint.BEST_FILE)
    assert evaluation._stored_best(tmp_path, "trained") == figures and figures["return_mean"] == 42.5
    # a parallel env's best.pt ranked by the team's returns: a run resumed to rank by another's compares with none
    team = evaluation.EvalResult(3, 96, 3, [9.0], [10], 0.1, team_returns=[9.0], rank_by="team").figures()
    checkpoint.save({"trainer": {"iteration": 3}, "eval": {**team, "deterministic": True, "seed": 5}},
                    tmp_path / "checkpoints" / checkpoint.BEST_FILE)
    assert evaluation._stored_best(tmp_path, "team")["return_mean"] == 9.0
    assert evaluation._stored_best(tmp_path, "trained") is None
