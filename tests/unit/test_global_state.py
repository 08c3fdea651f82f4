"""``model.critic_input: global``: the env's global state as one more leaf of a PettingZoo slot's observation
(``envs.pettingzoo``), read by the critic alone (``models.feedforward.LeafActorCritic``), and refused by name
where it cannot apply."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lockstep import config as config_lib
from lockstep import envs
from lockstep.algo.normalize import ObsNormalizer
from lockstep.config import ModelConfig
from lockstep.envs import departures, pettingzoo
from lockstep.envs.spaces import ACTIVE_LEAF, AGENT_ID_LEAF, GLOBAL_LEAF
from lockstep.learner.inference import PolicySnapshot
from lockstep.models import build_policy
from lockstep.models.host import HostStep

DEPARTURES = "pettingzoo:lockstep.envs.departures"  # no state(): a0 leaves after 3 steps, a1 after 6, a2 after 10
PARTNERS = "pettingzoo:lockstep.envs.partners"
GLOBAL = {pettingzoo.GLOBAL_STATE_KWARG: True}


def test_the_slots_of_mpe2_simple_spread_carry_its_state_and_their_agent_id():
    pytest.importorskip("mpe2")
    vec = envs.make_vector_env("pettingzoo:mpe2.simple_spread_v3", 2, {"max_cycles": 4, **GLOBAL})
    assert vec.single_observation_space[GLOBAL_LEAF].shape == (54,)  # 3 agents x 18
    obs, _ = vec.reset(seed=[5, 5, 5, 6, 6, 6])
    for t in range(4):
        for e, env in enumerate(vec.envs):
            state = env.state()  # [54]
            assert (obs[GLOBAL_LEAF][3 * e:3 * e + 3] == state).all(), t
            assert (obs[AGENT_ID_LEAF][3 * e:3 * e + 3] == np.eye(3)).all()
        obs, _, _, truncated, infos = vec.step(np.zeros(6, np.int64))
    assert truncated.all()  # max_cycles: the final observations carry the state the values bootstrap from
    final = [f[GLOBAL_LEAF] for f in infos["final_obs"]]
    assert all(f.shape == (54,) and f.any() for f in final) and (final[0] == final[2]).all()
    assert not (final[0] == obs[GLOBAL_LEAF][0]).all()  # the slots' own moved on to the next episode


def test_an_env_without_state_gives_every_agents_observation_side_by_side_zeros_for_those_that_left():
    vec = envs.make_vector_env(DEPARTURES, 1, GLOBAL)
    assert vec.single_observation_space[GLOBAL_LEAF].shape == (9,)  # 3 agents x Box(3)
    obs, _ = vec.reset(seed=0)
    lives = list(departures.LIFETIMES.values())
    for t in range(10):
        active = obs[ACTIVE_LEAF][:, 0].astype(bool)
        assert active.tolist() == [t < life for life in lives], t
        parts = obs[GLOBAL_LEAF].reshape(3, 3, 3)  # [slot, agent, 3]
        for i, life in enumerate(lives):
            if t < life:  # its observation, in every active slot's copy
                assert (parts[active, i] == obs["observation"][i]).all(), (t, i)
            elif t > life:  # left at an earlier step (at its last step the env still returned its observation)
                assert not parts[active, i].any(), (t, i)
        assert not obs[GLOBAL_LEAF][~active].any()  # a placeholder is zeros, the global state too
        obs, *_ = vec.step(np.zeros(3, np.int64))


def test_a_dict_observation_is_flattened_into_the_global_state_and_an_env_state_is_used_where_declared():
    vec = envs.make_vector_env(DEPARTURES, 1, {"mask_key": "legal", **GLOBAL})
    obs, _ = vec.reset(seed=1)
    assert vec.single_observation_space[GLOBAL_LEAF].shape == (3 * (3 + 2),)  # cue Box(3) and the mask's 2 bits
    state = obs[GLOBAL_LEAF][0]
    for i in range(3):  # gymnasium flattens a Dict by its sorted keys: cue, then legal
        assert (state[5 * i:5 * i + 3] == obs["cue"][i]).all() and (state[5 * i + 3:5 * i + 5] == obs["legal"][i]).all()
    declared = envs.make_vector_env(PARTNERS, 1, {"state": True, **GLOBAL})
    obs, _ = declared.reset(seed=2)
    assert (obs[GLOBAL_LEAF] == declared.envs[0].state()).all() and obs[GLOBAL_LEAF].shape == (2, 3)


def test_the_global_state_comes_only_with_critic_input_global_and_is_kept_by_env_obs_keys():
    config = config_lib.Config()
    config.env.id = DEPARTURES
    assert GLOBAL_LEAF not in envs.env_spec(DEPARTURES, kwargs=config.vector_kwargs()).observation.paths()
    config.model.critic_input = "global"
    spec = envs.env_spec(DEPARTURES, ["observation"], kwargs=config.vector_kwargs()).observation
    assert set(spec.paths()) == {"observation", ACTIVE_LEAF, AGENT_ID_LEAF, GLOBAL_LEAF}


def test_critic_input_global_is_refused_by_name_where_it_cannot_apply():
    config = config_lib.Config()
    config.model.critic_input = "global"
    with pytest.raises(config_lib.ConfigError, match="model.critic_input global .* CartPole-v1 is none"):
        config.validate()
    config.env.id = DEPARTURES
    config.validate()
    config.model.lstm_size = 16
    with pytest.raises(config_lib.ConfigError, match="model.critic_input global .* model.lstm_size"):
        config.validate()
    with pytest.raises(ValueError, match="model.critic_input global .* CartPole-v1 is none"):
        envs.env_spec("CartPole-v1", kwargs=GLOBAL)
    with pytest.raises(ValueError, match="model.critic_input global needs a feedforward network"):
        spec = envs.env_spec(DEPARTURES, kwargs=GLOBAL)
        build_policy(spec.observation, spec.action, ModelConfig(critic_input="global", lstm_size=8))
    own = envs.env_spec(DEPARTURES)
    with pytest.raises(ValueError, match="reads the observation's 'global_state' leaf"):
        build_policy(own.observation, own.action, ModelConfig(critic_input="global"))


def _obs(spec, rows: int, seed: int) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(seed)
    return {path: torch.as_tensor(rng.uniform(0, 1, (rows, *leaf.shape)).astype(np.float32))
            for path, leaf in spec.observation.leaves}


@pytest.mark.parametrize("critic_input", ["own", "global"])
def test_the_actor_never_reads_the_global_state_and_the_critic_reads_it_with_critic_input_global(critic_input):
    spec = envs.env_spec(PARTNERS, kwargs=GLOBAL)
    policy = build_policy(spec.observation, spec.action, ModelConfig(hidden=[16], critic_input=critic_input))
    torch.manual_seed(0)
    with torch.no_grad():
        for p in policy.parameters():  # away from the init, whose output layers are ~0
            p.add_(torch.randn_like(p) * 0.3)
    obs = _obs(spec, 8, 0)
    other = {**obs, GLOBAL_LEAF: _obs(spec, 8, 1)[GLOBAL_LEAF]}  # the same slots in another global state
    (head, value), (head2, value2) = policy.features(obs), policy.features(other)
    assert torch.equal(head, head2)
    assert torch.equal(value, value2) == (critic_input == "own")
    assert torch.equal(policy.value_after(other, torch.zeros(8, 0)), value2)
    # the actor's input: the agent's observation, active flag and id; the critic's adds the state's 2 values
    assert policy.actor[0].in_features == 1 + 1 + 2
    assert policy.critic[0].in_features == 1 + 1 + 2 + (2 if critic_input == "global" else 0)


def test_the_numpy_step_declines_the_policy_so_torch_serves_it():
    spec = envs.env_spec(PARTNERS, kwargs=GLOBAL)
    policy = build_policy(spec.observation, spec.action, ModelConfig(hidden=[16], critic_input="global"))
    assert HostStep.of(policy, ObsNormalizer(None, None, 10.0, torch.device("cpu")), torch.device("cpu")) is None
    assert PolicySnapshot(1, policy, None, None, 10.0, torch.device("cpu"), "auto").host is None
