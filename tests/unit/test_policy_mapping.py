"""Several policies, piece by piece: the policies config, which agent each policy acts for, a slot's observation
and action with each policy's part, and one policy's part of a phase's batch."""

from __future__ import annotations

import numpy as np
import pytest

from lockstep import config as config_lib
from lockstep.envs import env_spec, make_vector_env, policy_spaces, to_records
from lockstep.envs.pettingzoo import POLICIES_KWARG, assign_policies
from lockstep.learner.rollout import Batch
from lockstep.learner.team import PolicyView

KINDS = "pettingzoo:lockstep.envs.kinds"  # scout_0, scout_1: Box(3) -> Discrete(3); pilot_0: Box(5) -> Discrete(2)
PATTERNS = {"scouts": ["scout_*"], "pilots": ["pilot_*"]}


def _config(policies: dict, env: str = KINDS) -> config_lib.Config:
    return config_lib.from_dict({"env": {"id": env}, "policies": policies})


def test_the_policies_section_loads_and_validates():
    config = _config({"scouts": {"agents": "scout_*", "model": {"hidden": "[8, 8]"}},
                      "pilots": {"agents": ["pilot_*"], "train": "false", "load": "runs/old"}})
    config.validate()
    assert config.policies["scouts"].agents == ["scout_*"]
    assert config.model_of("scouts").hidden == [8, 8] and config.model_of("pilots").hidden == [64, 64]
    assert config.policies["pilots"].train is False and config.policies["pilots"].load == "runs/old"
    assert config.vector_kwargs()[POLICIES_KWARG] == PATTERNS
    again = config_lib.from_dict(config_lib.to_dict(config))  # config.yaml of a run holds it, and loads again
    assert again.policies == config.policies


@pytest.mark.parametrize("policies, env, message", [
    ({"scouts": {"agents": ["scout_*"]}}, "CartPole-v1", "PettingZoo parallel env"),
    ({"scouts": {"agents": []}}, KINDS, "agents must list"),
    ({"scouts": {"agents": ["scout_*"], "colour": 1}}, KINDS, "unknown key"),
    ({"scouts": {"agents": ["scout_*"], "model": {"width": 3}}}, KINDS, "unknown config key 'model.width'"),
    ({"scouts": {"agents": ["scout_*"], "model": {"activation": "gelu"}}}, KINDS, "model.activation must be"),
    ({"scouts": {"agents": ["*"], "train": False}}, KINDS, "nothing would train"),
    ({"bad name": {"agents": ["*"]}}, KINDS, "not a valid policy name"),
    ({"scouts": {"agents": ["scout_*"], "model": {"critic_input": "global"}},
      "pilots": {"agents": ["pilot_*"], "model": {"lstm_size": 8}}}, KINDS, "reads all of it under its LSTM"),
])
def test_a_policies_section_that_cannot_work_is_refused_by_name(policies, env, message):
    with pytest.raises(config_lib.ConfigError, match=message):
        _config(policies, env).validate()


@pytest.mark.parametrize("rank_by, policies, env, message", [
    ("pilot", PATTERNS, KINDS, r"trained, team or a policy of the run \(scouts, pilots\), got 'pilot'"),
    ("scouts", {}, "CartPole-v1", r"it has none: policies is empty\), got 'scouts'"),
    ("team", {}, "CartPole-v1", "team return; CartPole-v1 is none: use trained"),
    ("team", {"team": ["scout_*"], "pilots": ["pilot_*"]}, KINDS, "rename policies.team"),
])
def test_the_returns_that_rank_evaluations_are_trained_team_or_a_policy_of_the_run(rank_by, policies, env, message):
    for accepted in ("trained", "team", "scouts", "pilots"):
        config = _config({name: {"agents": agents} for name, agents in PATTERNS.items()})
        config.run.eval_rank_by = accepted
        config.validate()
    config = _config({name: {"agents": agents} for name, agents in policies.items()}, env)
    config.run.eval_rank_by = rank_by
    with pytest.raises(config_lib.ConfigError, match=message):
        config.validate()


def test_each_agent_goes_to_the_first_policy_that_matches_and_every_policy_must_get_one():
    agents = ["adversary_0", "adversary_1", "agent_0"]
    assert assign_policies(agents, {"hunters": ["adversary_*"], "rest": ["*"]}) == ("hunters", "hunters", "rest")
    with pytest.raises(ValueError, match="^policies: agent 'agent_0' matches no policy"):  # names the setting
        assign_policies(agents, {"hunters": ["adversary_*"]})
    with pytest.raises(ValueError, match=r"policies \['late'\] act for no agent"):
        assign_policies(agents, {"all": ["*"], "late": ["agent_*"]})


def test_a_slot_holds_its_own_policys_observation_and_acts_with_its_part_of_the_action():
    vec = make_vector_env(KINDS, 2, {POLICIES_KWARG: PATTERNS})
    obs, _ = vec.reset(seed=3)
    assert obs["scouts"]["observation"].shape == (6, 3) and obs["pilots"]["observation"].shape == (6, 5)
    scout, pilot = np.array([0, 1, 3, 4]), np.array([2, 5])  # slots in env order, agents in possible_agents order
    assert (obs["scouts"]["observation"][scout].sum(1) == 1).all() and not obs["scouts"]["observation"][pilot].any()
    assert not obs["pilots"]["observation"][scout].any()
    # the actions of different spaces travel side by side: each agent steps with its own policy's part
    cue_scout = obs["scouts"]["observation"].argmax(1)
    cue_pilot = obs["pilots"]["observation"][:, 0].astype(np.int64)
    _, reward, *_ = vec.step({"scouts": cue_scout, "pilots": cue_pilot})
    assert (reward == 1).all()
    _, reward, *_ = vec.step({"scouts": np.full(6, 5), "pilots": np.full(6, 7)})  # out of range: no reward
    assert (reward == 0).all()


def test_each_policy_has_its_own_spaces_read_out_of_the_slots():
    spec = env_spec(KINDS, kwargs={POLICIES_KWARG: PATTERNS})
    assert spec.policies == ("scouts", "pilots") and spec.policy_of == ("scouts", "scouts", "pilots")
    scouts_obs, scouts_act = policy_spaces(spec.observation, spec.action, spec.policies, "scouts", "action_mask")
    pilots_obs, pilots_act = policy_spaces(spec.observation, spec.action, spec.policies, "pilots", "action_mask")
    assert dict(scouts_obs.leaves)["observation"].shape == (3,) and scouts_act.n == 3
    assert dict(pilots_obs.leaves)["observation"].shape == (5,) and pilots_act.n == 2
    assert "agent_active" in pilots_obs.paths()


def test_one_policys_part_of_a_batch_is_its_columns_with_its_observations_actions_and_truncations():
    spec = env_spec(KINDS, kwargs={POLICIES_KWARG: PATTERNS})
    vec = make_vector_env(KINDS, 2, {POLICIES_KWARG: PATTERNS})
    obs, _ = vec.reset(seed=0)
    records = to_records(obs, spec.observation)  # [6]
    T, N = 2, 12  # two members of 6 slots
    observations = np.stack([np.concatenate([records, records])] * T)  # [T, N]
    actions = np.arange(T * N * 2).reshape(T, N, 2)  # [T, N, 2]: (pilots, scouts) side by side
    batch = Batch(version=4, members=(0, 1), slots_per_member=(6, 6), obs=observations, actions=actions,
                  logprobs=np.arange(T * N, dtype=np.float32).reshape(T, N), values=np.zeros((T, N), np.float32),
                  rewards=np.zeros((T, N), np.float32), terminated=np.zeros((T, N), bool),
                  truncated=np.zeros((T, N), bool), versions=np.full((T, N), 4), bootstrap_obs=observations[0],
                  lengths=np.full(N, T), final_t=np.array([1, 1]), final_n=np.array([2, 7]),
                  final_obs=observations[0][[2, 7]])
    pilots = PolicyView(spec, "pilots", "action_mask")
    part = pilots.batch(batch, np.array([2, 5, 8, 11]), (2, 2))
    assert part.obs["observation"].shape == (T, 4, 5) and (part.logprobs == batch.logprobs[:, [2, 5, 8, 11]]).all()
    assert (part.actions == actions[:, [2, 5, 8, 11], 0]).all()  # the pilots' part: the first of the Dict's entries
    assert part.final_n.tolist() == [0] and part.final_t.tolist() == [1]  # slot 2's truncation; slot 7 is a scout's
    scouts = PolicyView(spec, "scouts", "action_mask")
    assert scouts.columns(6).tolist() == [0, 1, 3, 4]
    merged = np.zeros((6, 2), np.int64)
    scouts.put_actions(merged, scouts.columns(6), np.array([2, 1, 0, 2]))
    assert merged[[0, 1, 3, 4], 1].tolist() == [2, 1, 0, 2]  # the scouts' entries of their own slots only
    assert not merged[:, 0].any() and not merged[[2, 5]].any()


def test_an_actor_started_by_hand_lays_out_its_slots_by_the_policies_it_is_given():
    from lockstep import cli

    def actor(*argv: str):
        return cli.actor_options(cli.build_parser().parse_args(["actor", "--learner", "127.0.0.1:1", *argv]))

    options = actor("--env", KINDS, "--policies", "{scouts: [scout_*], pilots: [pilot_*]}")
    assert options.env_kwargs[POLICIES_KWARG] == PATTERNS
    vec = make_vector_env(options.env, 1, options.env_kwargs)  # the layout the learner of such a run expects
    spec = env_spec(KINDS, kwargs={POLICIES_KWARG: PATTERNS})
    assert to_records(vec.reset(seed=0)[0], spec.observation).dtype == spec.observation.array_dtype
    assert POLICIES_KWARG not in actor("--env", KINDS).env_kwargs
    with pytest.raises(config_lib.ConfigError, match="--policies maps policy names"):
        actor("--env", KINDS, "--policies", "[scout_*]")
