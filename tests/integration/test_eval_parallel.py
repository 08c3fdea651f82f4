"""Evaluation of PettingZoo parallel envs: ``lockstep eval`` and ``run.eval_every`` play whole episodes of one
env with the policy acting for every agent, and report each agent's, each policy's and the team's returns."""

from __future__ import annotations

import json
import logging
import math
import threading
import time

import numpy as np
import pytest
import torch
from conftest import learner_config

from lockstep import cli
from lockstep import config as config_lib
from lockstep.envs import to_records
from lockstep.envs.departures import LIFETIMES
from lockstep.launch.inprocess import InProcessActors
from lockstep.launch.local import train
from lockstep.launch.restart import RestartPolicy
from lockstep.learner import checkpoint
from lockstep.learner import evaluation as while_training
from lockstep.learner.episodes import (
    SHARED_POLICY,
    TeamEpisode,
    load_config,
    make_slots,
    policy_returns,
    slot_specs,
    slots_act,
)
from lockstep.learner.wiring import Learner
from lockstep.observe.run_dir import RunDir
from lockstep.tools import eval as evaluation

DEPARTURES = "pettingzoo:lockstep.envs.departures"  # a0 leaves after 3 steps, a1 after 6, a2 after 10 (episode)
SPREAD = "pettingzoo:mpe2.simple_spread_v3"
CYCLES = 8  # simple_spread's episode: every agent truncated after 8 steps
WAIT_S = 240  # the most the run with evaluation trains while its first evaluation is awaited (a failure after)


def _train(run_dir, env_id: str, agents: int, **overrides):
    """Three iterations of one actor with 2 envs of ``agents`` agents each."""
    config = learner_config({"env.id": env_id, "actors.envs_per_actor": 2, "actors.transport": "inprocess",
                             "ppo.steps_per_env": 16, "ppo.total_steps": 3 * 16 * 2 * agents, "model.hidden": [8],
                             "learner.device": "cpu", "env.normalize_obs": True, "run.thresholds": [],
                             **overrides})
    train(config, run_dir)
    return run_dir


@pytest.fixture(scope="module")
def spread(tmp_path_factory):
    pytest.importorskip("mpe2")
    return _train(tmp_path_factory.mktemp("spread") / "run", SPREAD, 2, **{"env.kwargs": {"N": 2, "max_cycles": CYCLES},
                                                                        "env.agent_id": True})


@pytest.fixture(scope="module")
def departures(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("departures") / "run", DEPARTURES, len(LIFETIMES))


def _agree(result: dict, agents: list[str]) -> None:
    """The figures of eval.json agree with its episodes: team = agents summed, per policy = over its agents."""
    episodes = result["episodes"]
    for e in episodes:
        assert list(e["agents"]) == agents
        assert e["team_return"] == pytest.approx(sum(a["return"] for a in e["agents"].values()))
    teams = [e["team_return"] for e in episodes]
    assert result["team"]["mean"] == pytest.approx(np.mean(teams)) and result["team"]["count"] == len(episodes)
    assert result["team"]["std"] == pytest.approx(np.std(teams))
    for agent in agents:
        returns = [e["agents"][agent]["return"] for e in episodes]
        assert result["agents"][agent]["mean"] == pytest.approx(np.mean(returns))
        assert result["agents"][agent]["count"] == len(episodes)
    every = [e["agents"][a]["return"] for e in episodes for a in agents]
    assert result["policies"] == {SHARED_POLICY: {"agents": agents, "mean": pytest.approx(np.mean(every)),
                                                  "std": pytest.approx(np.std(every)), "min": min(every),
                                                  "max": max(every), "count": len(every)}}
    assert result["return_mean"] == pytest.approx(np.mean(every))  # per agent, as metrics.csv's returns are
    assert result["return_mean"] == pytest.approx(result["team"]["mean"] / len(agents))


def test_lockstep_eval_of_a_parallel_run_writes_per_agent_team_and_per_policy_returns(spread, capsys):
    assert cli.main(["eval", str(spread), "--episodes", "2", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    result = json.loads((spread / "eval.json").read_text())
    assert result["env_id"] == SPREAD and result["iteration"] == 3 and len(result["episodes"]) == 2
    _agree(result, ["agent_0", "agent_1"])
    assert all(e["length"] == CYCLES for e in result["episodes"])
    assert all(a["length"] == CYCLES for e in result["episodes"] for a in e["agents"].values())
    shared = result["policies"][SHARED_POLICY]
    number, team = evaluation.number, result["team"]
    assert (f"policy {SHARED_POLICY} (agent_0, agent_1): mean return {number(shared['mean'])} ± "
            f"{number(shared['std'])} per agent over 4 agent episodes") in out
    assert f"team: mean return {number(team['mean'])} ± {number(team['std'])} over 2 episodes" in out
    first = result["episodes"][0]
    assert f"episode 1: team return {number(first['team_return'])}, length {CYCLES}; agent_0 " in out


def test_an_agents_return_counts_until_it_left_and_the_episode_until_every_agent_had(departures, tmp_path):
    out = tmp_path / "eval.json"
    assert cli.main(["eval", str(departures), "--episodes", "3", "--deterministic", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    _agree(result, list(LIFETIMES))
    for e in result["episodes"]:
        assert e["length"] == max(LIFETIMES.values())
        for agent, life in LIFETIMES.items():
            assert e["agents"][agent]["length"] == life
            assert 0 <= e["agents"][agent]["return"] <= life  # paid 1 a step for the cue said back, while there


def test_parallel_eval_is_repeatable_for_a_seed_deterministic_or_sampled(departures):
    def returns(seed: int, deterministic: bool) -> list[dict[str, float]]:
        report = evaluation.evaluate(departures, episodes=3, deterministic=deterministic, seed=seed)
        return [e.returns for e in report.episodes]

    assert returns(5, True) == returns(5, True)
    assert returns(5, False) == returns(5, False)
    assert returns(5, False) != returns(6, False)  # the seed plays other episodes


def test_a_recurrent_policy_keeps_a_state_per_agent_and_starts_each_agents_episode_from_zeros(tmp_path):
    run_dir = _train(tmp_path / "run", DEPARTURES, len(LIFETIMES), **{"model.lstm_size": 8})
    played = evaluation.evaluate(run_dir, episodes=2, deterministic=True, seed=2)
    assert [e.lengths for e in played.episodes] == [LIFETIMES] * 2
    config = load_config(run_dir)
    slots = make_slots(DEPARTURES, config.env.vector_kwargs(), render=False)
    specs = slot_specs(slots, config.env)
    _, model, normalize, _, _ = evaluation.load_from_checkpoint(run_dir, None, *specs, torch.device("cpu"))
    records = to_records(slots.reset(seed=0)[0], specs[0])
    fresh, carried = (slots_act(model, normalize, specs, True, 0, torch.device("cpu"), 3) for _ in range(2))
    carried(records, np.ones(3, bool))
    carried(records, np.array([True, False, False]))  # a0's episode starts again; a1's and a2's go on
    fresh(records, np.ones(3, bool))
    after, zeroed = carried.__self__.state, fresh.__self__.state  # [A, S] each player's state after its last step
    assert np.array_equal(after[0], zeroed[0])
    assert not np.array_equal(after[1:], zeroed[1:])
    slots.close()


def test_a_parallel_envs_video_has_a_frame_after_the_reset_and_after_every_step(spread, tmp_path):
    pytest.importorskip("imageio_ffmpeg")
    import imageio.v3 as iio

    filmed = evaluation.evaluate(spread, episodes=2, seed=1, video_dir=tmp_path / "videos")
    plain = evaluation.evaluate(spread, episodes=2, seed=1)
    assert [e.returns for e in filmed.episodes] == [e.returns for e in plain.episodes]  # filming changes no step
    frames = [iio.imread(e.video) for e in filmed.episodes]
    assert [e.frames for e in filmed.episodes] == [len(f) for f in frames] == [CYCLES + 1] * 2
    # the first episode's video ends on its own last step, not on the next episode's start (same-step reset)
    assert np.abs(frames[0][-1].astype(int) - frames[1][0].astype(int)).mean() > 1


def test_an_opponent_for_a_parallel_env_is_refused(departures, capsys):
    assert cli.main(["eval", str(departures), "--episodes", "1", "--opponent", "random"]) == 2
    assert "no self-play game" in capsys.readouterr().err


def test_a_video_of_an_env_that_does_not_render_is_a_clear_error(departures, tmp_path, capsys):
    assert cli.main(["eval", str(departures), "--episodes", "1", "--video", str(tmp_path / "videos")]) == 2
    assert "cannot record pettingzoo:lockstep.envs.departures: its parallel_env does not take render_mode" in (
        capsys.readouterr().err)


def test_each_policys_returns_are_those_of_its_agents():
    episodes = [TeamEpisode({"a": 1.0, "b": 2.0, "c": 4.0}, {"a": 1, "b": 1, "c": 1}, 1),
                TeamEpisode({"a": 8.0, "c": 16.0}, {"a": 1, "c": 1}, 1)]  # b absent from the second
    assert policy_returns(episodes, ["a", "b", "c"], ("x", "y", "x")) == {"x": [1.0, 4.0, 8.0, 16.0], "y": [2.0]}
    assert [e.ret for e in episodes] == [7.0, 24.0]


def test_evaluation_while_training_a_parallel_env_writes_per_agent_and_team_returns(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="lockstep.learner.evaluation")
    config = learner_config({"env.id": DEPARTURES, "actors.envs_per_actor": 2, "actors.transport": "inprocess",
                             "ppo.steps_per_env": 20, "ppo.epochs": 1, "model.hidden": [8], "learner.device": "cpu",
                             "run.thresholds": [], "run.eval_every": 1, "run.eval_episodes": 2,
                             "run.eval_video_every": 1000})  # the first evaluation tries a video: departures has none
    run_dir = tmp_path / "run"
    result = {"summary": _train_until_evaluated(config, run_dir)}
    rows = [row for row in RunDir(run_dir).metrics() if row["eval_return_mean"] is not None]
    for row in rows:  # every agent is in every episode: the team's mean is 3 agents' mean
        team, per_agent = float(row["eval_team_return_mean"]), float(row["eval_return_mean"])
        assert team == pytest.approx(3 * per_agent, rel=1e-4) and 0 <= team <= sum(LIFETIMES.values())
    last = result["summary"]["evaluation"]["last"]
    assert last["episodes"] == 2 and last["policies"] == {SHARED_POLICY: pytest.approx(last["return_mean"])}
    assert last["team_return_mean"] == pytest.approx(3 * last["return_mean"])
    assert "no video (cannot record pettingzoo:lockstep.envs.departures" in caplog.text  # and it went on without


def _evaluated(run_dir) -> bool:
    return any(row["eval_return_mean"] is not None for row in RunDir(run_dir).metrics())


def _train_until_evaluated(config, run_dir) -> dict:
    """Train ``config`` on departures with one in-process actor of 2 envs until an evaluation has reached
    metrics.csv (at most ``WAIT_S``), then stop the learner: its summary."""
    learner = Learner(config, run_dir)
    result = {}
    serving = threading.Thread(target=lambda: result.update(summary=learner.serve()))
    serving.start()
    try:
        learner.wait_ready(timeout=60)
        InProcessActors(DEPARTURES, 2, [0], RestartPolicy(max_restarts=0),
                        env_kwargs=config.vector_kwargs()).start(learner)
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and serving.is_alive() and not _evaluated(run_dir):
            time.sleep(0.2)
    finally:
        learner.stop()
        serving.join(timeout=60)
    assert not serving.is_alive() and "summary" in result
    assert _evaluated(run_dir), "no evaluation reached metrics.csv within the run"
    return result["summary"]


# departures with a policy that trains for a0 (which scores at most 3 an episode) and a frozen one for a1 and a2
# (up to 6 and 10): the mean over every agent would rank versions by what the frozen policy's agents score
TWO_POLICIES = {"early": {"agents": ["a0"]}, "rest": {"agents": ["a1", "a2"], "train": False}}


@pytest.fixture(scope="module")
def ranked(tmp_path_factory):
    """A run of TWO_POLICIES with evaluation while training, stopped after its first evaluation: (its run
    directory, its summary)."""
    config = learner_config({"env.id": DEPARTURES, "actors.envs_per_actor": 2, "actors.transport": "inprocess",
                             "ppo.steps_per_env": 20, "ppo.epochs": 1, "model.hidden": [8], "learner.device": "cpu",
                             "run.thresholds": [], "run.eval_every": 1, "run.eval_episodes": 2})
    config.policies = config_lib.from_dict({"policies": TWO_POLICIES}).policies
    run_dir = tmp_path_factory.mktemp("ranked") / "run"
    return run_dir, _train_until_evaluated(config, run_dir)


def test_with_several_policies_evaluations_rank_by_the_trained_policies_returns(ranked):
    run_dir, summary = ranked
    last = summary["evaluation"]["last"]
    assert last["return_mean"] == pytest.approx(last["policies"]["early"]) and last["rank_by"] == "trained"
    best = checkpoint.load(run_dir / "checkpoints" / "best.pt")["eval"]
    assert best["return_mean"] == pytest.approx(best["policies"]["early"]) and best["rank_by"] == "trained"
    for row in RunDir(run_dir).metrics():  # a0's returns: it stays 3 steps, paid 1 a step at most
        assert row["eval_return_mean"] is None or 0 <= float(row["eval_return_mean"]) <= LIFETIMES["a0"]


def test_the_frozen_policys_steps_are_acted_and_never_counted_as_trained(ranked):
    _, summary = ranked
    policies = summary["policies"]
    assert summary["transitions_trained"] == policies["early"]["samples"] > 0
    assert summary["transitions_frozen"] == policies["rest"]["samples"] == 2 * policies["early"]["samples"]
    assert summary["transitions_collected"] == (summary["transitions_trained"] + summary["transitions_frozen"]
                                                + summary["dropped_transitions"])


@pytest.mark.parametrize("rank_by", ["team", "early", "rest"])
def test_evaluations_rank_by_the_team_or_the_policy_that_run_eval_rank_by_names(ranked, tmp_path, rank_by):
    run_dir, _ = ranked
    config = RunDir(run_dir).config()
    config.run.eval_rank_by = rank_by
    config_lib.save(config, tmp_path / "config.yaml")  # a run directory of its own for the evaluation's best.pt
    final = checkpoint.load(run_dir / "checkpoints" / "final.pt")["trainer"]
    request = {"iteration": final["iteration"], "env_steps": final["samples"]["early"], "version": final["version"],
               "video": False, "oldest": None, "parameters": None, "obs_rms": None,
               "policies": {name: {"parameters": {key: value.numpy() for key, value in policy["model"].items()},
                                   "obs_rms": policy["obs_rms"], "version": policy["version"]}
                            for name, policy in final["policies"].items()}}
    result = while_training._Evaluation(tmp_path, 5, 2, True, -math.inf).evaluate(request)
    assert result.error is None
    expected = result.team_return_mean if rank_by == "team" else result.policies[rank_by]
    assert result.return_mean == pytest.approx(expected) and result.best and result.rank_by == rank_by
    assert checkpoint.load(tmp_path / "checkpoints" / "best.pt")["eval"]["rank_by"] == rank_by
