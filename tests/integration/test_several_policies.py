"""Several policies in one run (``policies``): agents of different spaces, each kind with a policy of its own,
trained by real actor processes over shared memory and gRPC; strict per policy, the audit per policy, and a
frozen policy that acts and never changes."""

from __future__ import annotations

import json
import subprocess
import time

import numpy as np
import pytest
import torch
from conftest import learner_config, lockstep_cmd

from lockstep import cli
from lockstep import config as config_lib
from lockstep.envs import env_spec
from lockstep.envs.kinds import CHOICES
from lockstep.launch.local import train
from lockstep.learner import checkpoint
from lockstep.observe.run_dir import RunDir
from lockstep.tools import audit

KINDS = "pettingzoo:lockstep.envs.kinds"  # scouts: Box(3) -> Discrete(3); the pilot: Box(5) -> Discrete(2)
T = 16
POLICIES = {"scouts": {"agents": ["scout_*"]}, "pilots": {"agents": ["pilot_*"]}}


def _config(transport: str, policies: dict = POLICIES, **overrides) -> config_lib.Config:
    config = learner_config({"env.id": KINDS, "actors.count": 2, "actors.envs_per_actor": 2,
                             "actors.transport": transport, "ppo.steps_per_env": T, "ppo.lr": 0.003,
                             "model.hidden": [16], "learner.device": "cpu", "run.audit": True, **overrides})
    config.policies = config_lib.from_dict({"policies": policies}).policies
    return config


def _batches(run_dir, policy: str) -> list[dict[str, np.ndarray]]:
    found = []
    for path in sorted((run_dir / "audit" / "policies" / policy).glob("batch_*.npz")):
        with np.load(path) as batch:
            found.append({key: batch[key] for key in batch.files})
    return found


def test_one_policy_for_agents_of_different_spaces_is_refused_with_the_way_out():
    with pytest.raises(ValueError, match="policies"):
        env_spec(KINDS)


@pytest.mark.parametrize("transport", ["shm", "grpc"])
def test_two_policies_of_different_spaces_learn_each_from_its_own_samples_and_pass_the_audit(tmp_path, transport):
    run_dir = tmp_path / "run"
    summary = train(_config(transport, **{"ppo.total_steps": 50 * 2 * 2 * 3 * T}), run_dir)
    policies = summary["policies"]
    assert policies["scouts"]["agents"] == ["scout_0", "scout_1"] and policies["pilots"]["agents"] == ["pilot_0"]
    # random: a scout names its cue in 1 of 3 steps (8/3 an episode), the pilot in 1 of 2 (4); best: LENGTH
    assert policies["scouts"]["episode_return_mean"] > 6.5, policies
    assert policies["pilots"]["episode_return_mean"] > 6.5, policies
    assert policies["scouts"]["version"] == policies["pilots"]["version"] == summary["iterations"] == 50
    rows = RunDir(run_dir).metrics()
    assert float(rows[-1]["policy/scouts/episode_return_mean"]) == pytest.approx(
        policies["scouts"]["episode_return_mean"])
    assert int(rows[-1]["policy/pilots/samples"]) == 2 * 2 * T  # 2 actors x 2 envs x 1 pilot x T
    for policy in ("scouts", "pilots"):
        report = audit.check(run_dir, policy=policy)
        assert report.exit_code == 0 and report.differing == 0, audit.format_report(report)
        assert report.samples == 50 * 2 * 2 * len(policies[policy]["agents"]) * T
    assert audit.main(str(run_dir)) == 0
    if transport == "shm":  # lockstep eval: each policy acting for its own agents, returns per policy
        assert cli.main(["eval", str(run_dir), "--episodes", "3", "--deterministic"]) == 0
        result = json.loads((run_dir / "eval.json").read_text())
        assert result["policies"]["scouts"]["agents"] == ["scout_0", "scout_1"]
        assert result["policies"]["scouts"]["count"] == 2 * 3 and result["policies"]["pilots"]["count"] == 3
        for policy in ("scouts", "pilots"):
            assert result["policies"][policy]["mean"] > 6.5, result["policies"]  # random: 8/3 and 4
        per_agent = [e["agents"][a]["return"] for e in result["episodes"] for a in ("scout_0", "scout_1")]
        assert result["policies"]["scouts"]["mean"] == pytest.approx(np.mean(per_agent))


def test_strict_holds_per_policy_each_batch_holds_only_its_own_policys_samples_of_its_version(tmp_path):
    run_dir = tmp_path / "run"
    train(_config("inprocess", **{"ppo.total_steps": 6 * 2 * 2 * 3 * T}), run_dir)
    for policy, width, slots in (("scouts", 3, 2 * 2 * 2), ("pilots", 5, 2 * 2 * 1)):
        batches = _batches(run_dir, policy)
        assert len(batches) == 6
        for iteration, batch in enumerate(batches):
            # its own observation only: a scout's cue is a one-hot of 3, the pilot's a bit and 4 distractors
            assert batch["obs/observation"].shape == (T, slots, width)
            if policy == "scouts":
                assert (batch["obs/observation"].sum(-1) == 1).all()
            else:
                assert np.isin(batch["obs/observation"][..., 0], (0.0, 1.0)).all()
            assert batch["actions"].shape == (T, slots) and batch["actions"].max() < CHOICES[policy[:-1]]
            # its own version only: the one that trained on the batch, the phase's
            assert (batch["versions"] == iteration).all() and int(batch["trained_by"]) == iteration


def test_a_frozen_policy_acts_with_the_parameters_it_was_loaded_with_and_never_changes(tmp_path):
    first = tmp_path / "first"
    train(_config("inprocess", **{"ppo.total_steps": 30 * 2 * 2 * 3 * T}), first)
    loaded = checkpoint.load(first / "checkpoints" / "final.pt")["trainer"]["policies"]["pilots"]

    frozen = {**POLICIES, "pilots": {"agents": ["pilot_*"], "train": False, "load": str(first)}}
    second = tmp_path / "second"
    summary = train(_config("shm", frozen, **{"ppo.total_steps": 20 * 2 * 2 * 3 * T, "run.eval_every": 10,
                                              "run.eval_episodes": 3}), second)
    final = checkpoint.load(second / "checkpoints" / "final.pt")["trainer"]["policies"]
    for key, value in loaded["model"].items():
        assert torch.equal(final["pilots"]["model"][key], value), key  # bit for bit
    pilots = summary["policies"]["pilots"]
    assert pilots["train"] is False and pilots["version"] == loaded["version"] == 30
    assert summary["policies"]["scouts"]["version"] == 20  # the other policy trained beside it
    # the frozen pilot plays as well as it had learned to; its samples are all stamped with its one version
    assert pilots["episode_return_mean"] > 6.0, pilots
    for batch in _batches(second, "pilots"):
        assert (batch["versions"] == 30).all() and int(batch["trained_by"]) == 30
    assert audit.check(second, policy="pilots").exit_code == 0
    assert audit.check(second, policy="scouts").exit_code == 0
    # evaluation while training plays each policy for its own agents: the frozen pilot as well as it learned
    evaluation = summary["evaluation"]
    assert evaluation["finished"] >= 1 and evaluation["last"]["policies"]["pilots"] > 6.0, evaluation
    best = checkpoint.load(second / "checkpoints" / "best.pt")["trainer"]["policies"]
    assert all(torch.equal(best["pilots"]["model"][key], value) for key, value in loaded["model"].items())


def test_one_policy_for_every_agent_trains_bit_for_bit_as_the_shared_policy(tmp_path):
    # The team's path (slots' observations under the policy's name, the batch split by columns, a trainer per
    # policy) with one policy is the shared policy's path: the same samples, updates and parameters.
    departures = "pettingzoo:lockstep.envs.departures"  # agents that leave early: inactive steps in every batch
    overrides = {"env.id": departures, "actors.count": 1, "ppo.total_steps": 4 * 2 * 2 * 3 * 20,
                 "ppo.steps_per_env": 20, "env.normalize_obs": True, "env.normalize_reward": True, "run.audit": False}
    shared = train(_config("inprocess", {}, **overrides), tmp_path / "shared")
    team = train(_config("inprocess", {"all": {"agents": ["*"]}}, **overrides), tmp_path / "team")
    assert team["env_steps"] == shared["env_steps"] and team["policies"]["all"]["version"] == shared["iterations"] == 8
    assert team["episode_return_mean"] == shared["episode_return_mean"]
    one = checkpoint.load(tmp_path / "shared" / "checkpoints" / "final.pt")["trainer"]
    all_ = checkpoint.load(tmp_path / "team" / "checkpoints" / "final.pt")["trainer"]["policies"]["all"]
    assert one["model"].keys() == all_["model"].keys()
    for key, value in one["model"].items():
        assert torch.equal(all_["model"][key], value), key
    for shared_row, team_row in zip(RunDir(tmp_path / "shared").metrics(), RunDir(tmp_path / "team").metrics()):
        for column in ("policy_loss", "value_loss", "entropy", "approx_kl"):
            assert shared_row[column] == team_row[column], column


def test_an_actor_started_by_hand_needs_the_learners_policies_and_is_told_so(running_learner):
    departures = "pettingzoo:lockstep.envs.departures"  # one space for every agent: a shared layout is possible
    learner = running_learner(config=_config("grpc", {"first": {"agents": ["a0"]}, "rest": {"agents": ["*"]}},
                                             **{"env.id": departures, "actors.count": 1, "run.audit": False}))
    base = [*lockstep_cmd(), "actor", "--learner", learner.address, "--env", departures, "--retry-for", "0"]
    refused = subprocess.run(base, capture_output=True, text=True, timeout=120)  # the shared layout: refused
    assert refused.returncode != 0 and "start actors by hand with the same" in refused.stderr, refused.stderr[-3000:]
    assert "--policies" in refused.stderr
    accepted = subprocess.Popen([*base, "--policies", "{first: [a0], rest: ['*']}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while not learner.run.metrics() and time.monotonic() < deadline and accepted.poll() is None:
            time.sleep(0.1)
        assert learner.run.metrics(), "the actor with the learner's policies never completed a phase"
    finally:
        accepted.kill()
        accepted.wait()
    # an env whose agents differ cannot even be laid out as one policy's slots: the actor says so itself
    alone = subprocess.run([*base[:-4], "--env", KINDS, "--retry-for", "0"], capture_output=True, text=True,
                           timeout=120)
    assert alone.returncode != 0 and "lockstep actor --policies" in alone.stderr, alone.stderr[-2000:]


def test_a_hand_started_actor_whose_agents_act_for_other_policies_of_the_same_spaces_is_refused_by_name(
        running_learner):
    split = {"a": {"agents": ["scout_0"]}, "b": {"agents": ["scout_1"]}, "p": {"agents": ["pilot_*"]}}
    learner = running_learner(config=_config("grpc", split, **{"actors.count": 1, "run.audit": False}))
    base = [*lockstep_cmd(), "actor", "--learner", learner.address, "--env", KINDS, "--retry-for", "0"]
    # a and b act for scouts, whose spaces are the same: only the mapping tells the swap apart
    swapped = subprocess.run([*base, "--policies", "{a: [scout_1], b: [scout_0], p: ['pilot_*']}"],
                             capture_output=True, text=True, timeout=120)
    assert swapped.returncode == 2, swapped.stderr[-3000:]
    assert "agent scout_0 acts for policy 'b' in this actor, for 'a' on the learner" in swapped.stderr, (
        swapped.stderr[-3000:])
    assert "agent scout_1 acts for policy 'a' in this actor, for 'b' on the learner" in swapped.stderr
    assert "lockstep actor --policies '{a: [scout_0], b: [scout_1], p: [pilot_0]}'" in swapped.stderr
    accepted = subprocess.Popen([*base, "--policies", "{a: [scout_0], b: [scout_1], p: ['pilot_*']}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while not learner.run.metrics() and time.monotonic() < deadline and accepted.poll() is None:
            time.sleep(0.1)
        assert learner.run.metrics(), "the actor with the learner's policies never completed a phase"
    finally:
        accepted.kill()
        accepted.wait()


DEPARTURES = "pettingzoo:lockstep.envs.departures"  # a0 leaves after 3 steps, a1 after 6; an episode is 10 steps


def test_a_policy_whose_agents_have_all_left_for_a_phase_skips_it_and_the_run_goes_on(tmp_path):
    # T = 5: a0 acts in steps 0-2 of every 10-step episode, so in every second phase policy early has no sample
    run_dir = tmp_path / "run"
    policies = {"early": {"agents": ["a0"]}, "rest": {"agents": ["a1", "a2"]}}
    summary = train(_config("inprocess", policies, **{"env.id": DEPARTURES, "actors.count": 1,
                                                      "ppo.steps_per_env": 5, "ppo.total_steps": 4 * 2 * 3 * 5}),
                    run_dir)
    assert summary["error"] is None and summary["iterations"] == 4
    rows = RunDir(run_dir).metrics()
    assert [int(row["policy/early/skipped"]) for row in rows] == [0, 1, 0, 1]
    assert [int(row["policy/rest/skipped"]) for row in rows] == [0, 0, 0, 0]
    # a policy that skips a phase keeps to the phase clock: its versions are the run's
    assert [int(row["policy/early/version"]) for row in rows] == [0, 1, 2, 3]
    assert summary["policies"]["early"]["version"] == summary["policies"]["rest"]["version"] == 4
    # a skipped phase is no update: the version it publishes holds the parameters of the one before
    trail = run_dir / "audit" / "policies" / "early"
    published = {v: checkpoint.load(trail / f"policy_v{v:06d}.pt")["model"] for v in (1, 2, 3)}
    assert all(torch.equal(published[2][key], value) for key, value in published[1].items())
    assert not all(torch.equal(published[3][key], value) for key, value in published[2].items())
    for policy in policies:  # strict per policy: every sample, of the phases skipped too, its own version's
        report = audit.check(run_dir, policy=policy)
        assert report.exit_code == 0 and report.differing == 0, audit.format_report(report)


def test_every_policy_anneals_its_learning_rate_over_the_runs_steps(tmp_path):
    # the scouts take 2 of every 3 samples, the pilot 1: a policy counting its own samples against
    # ppo.total_steps would end at 1/2 (scouts) or 3/4 (pilot) of its rate instead of the run's last step's
    run_dir = tmp_path / "run"
    iterations, lr = 4, 0.003
    train(_config("inprocess", **{"actors.count": 1, "actors.envs_per_actor": 1, "ppo.steps_per_env": 8,
                                  "ppo.total_steps": iterations * 3 * 8, "run.audit": False}), run_dir)
    rows = RunDir(run_dir).metrics()
    assert len(rows) == iterations
    # one schedule, the one-policy run's: lr x (1 - the run's steps before the update / ppo.total_steps)
    expected = [lr * (1 - i / iterations) for i in range(iterations)]
    assert [float(row["lr"]) for row in rows] == pytest.approx(expected)
    for policy in POLICIES:
        assert [float(row[f"policy/{policy}/lr"]) for row in rows] == pytest.approx(expected), policy
    assert float(rows[-1]["policy/pilots/lr"]) == pytest.approx(lr / iterations)  # the last step before 0


def test_a_loaded_policy_acts_with_its_sources_observation_statistics_in_a_run_without_normalization(tmp_path):
    source = tmp_path / "source"
    train(_config("inprocess", **{"ppo.total_steps": 8 * 2 * 2 * 3 * T, "env.normalize_obs": True,
                                  "run.audit": False}), source)
    stored = checkpoint.load(source / "checkpoints" / "final.pt")["trainer"]["policies"]["pilots"]["obs_rms"]
    assert stored is not None

    frozen = {**POLICIES, "pilots": {"agents": ["pilot_*"], "train": False, "load": str(source)}}
    run_dir = tmp_path / "frozen"
    train(_config("inprocess", frozen, **{"ppo.total_steps": 2 * 2 * 2 * 3 * T, "env.normalize_obs": False}), run_dir)
    final = checkpoint.load(run_dir / "checkpoints" / "final.pt")["trainer"]["policies"]
    assert final["scouts"]["obs_rms"] is None  # the run's own policy: no statistics, as the run says
    kept = final["pilots"]["obs_rms"]
    assert kept is not None and kept["leaves"].keys() == stored["leaves"].keys()
    for path, moments in stored["leaves"].items():
        assert np.array_equal(kept["leaves"][path]["mean"], moments["mean"]), path
        assert np.array_equal(kept["leaves"][path]["var"], moments["var"]), path
    # it acted with them: the snapshot it served is the source's, and the behaviour log-probs recompute with it
    served = checkpoint.load(run_dir / "audit" / "policies" / "pilots" / "policy_v000008.pt")
    for path, moments in stored["leaves"].items():
        assert np.array_equal(served["obs_mean"][path], moments["mean"]), path
    assert audit.check(run_dir, policy="pilots").exit_code == 0
    # and plays as it played in its source run
    returns = []
    for run in (source, run_dir):
        assert cli.main(["eval", str(run), "--episodes", "3", "--deterministic"]) == 0
        returns.append(json.loads((run / "eval.json").read_text())["policies"]["pilots"]["mean"])
    assert returns[1] == returns[0]
