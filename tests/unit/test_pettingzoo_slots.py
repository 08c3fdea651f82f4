"""The PettingZoo parallel vector env: one slot per agent, agents that leave early, same-step resets."""

from __future__ import annotations

import numpy as np
import pytest

from lockstep import envs
from lockstep.envs import departures, pettingzoo
from lockstep.envs.spaces import ACTIVE_LEAF

DEPARTURES = "pettingzoo:lockstep.envs.departures"


def _run(steps: int, num_envs: int = 2):
    vec = envs.make_vector_env(DEPARTURES, num_envs)
    obs, _ = vec.reset(seed=list(range(vec.num_envs)))
    history = [(obs, None)]
    for _ in range(steps):
        actions = np.zeros(vec.num_envs, np.int64)
        history.append(vec.step(actions))
    return vec, history


def test_every_agent_of_every_env_is_a_slot_with_the_active_leaf():
    vec, history = _run(0)
    assert vec.num_envs == 2 * 3
    assert set(vec.single_observation_space.spaces) == {"observation", ACTIVE_LEAF}
    obs, _ = history[0]
    assert obs["observation"].shape == (6, 3) and obs[ACTIVE_LEAF].tolist() == [[1]] * 6


def test_an_agent_that_left_is_inactive_until_its_env_resets():
    _, history = _run(12)
    for t, (obs, reward, terminated, truncated, _infos) in enumerate(history[1:], start=1):
        active = obs[ACTIVE_LEAF][:, 0]
        step_in_episode = t % 10  # the observation after step t acts at this step of its episode
        for slot, agent in enumerate(["a0", "a1", "a2"] * 2):
            life = departures.LIFETIMES[agent]
            assert active[slot] == (step_in_episode < life), (t, agent)
            if not active[slot]:  # a placeholder: zeros
                assert not obs["observation"][slot].any()
            was_gone = (t - 1) % 10 >= life  # it acted at step t only if it had not left
            if was_gone:
                assert reward[slot] == 0 and terminated[slot] and not truncated[slot]
            elif t % 10 == life % 10:
                assert terminated[slot] == (agent != "a2") and truncated[slot] == (agent == "a2")


def test_a_truncated_agent_hands_over_its_last_observation_and_each_agent_episode_is_reported():
    _, history = _run(10)
    obs, reward, terminated, truncated, infos = history[10]
    assert truncated.tolist() == [False, False, True] * 2
    final = infos["final_obs"]
    assert final[2][ACTIVE_LEAF].tolist() == [1] and final[2]["observation"][1] == pytest.approx(1.0)
    assert obs[ACTIVE_LEAF][:, 0].tolist() == [1] * 6  # every env reset in the same step
    lengths = {}
    for _, _, _, _, info in history[1:]:
        if "episode" in info:
            for slot in np.flatnonzero(info["_episode"]):
                lengths.setdefault(slot, []).append(int(info["episode"]["l"][slot]))
    assert lengths == {0: [3], 1: [6], 2: [10], 3: [3], 4: [6], 5: [10]}


class _Mixed(departures.Departures):
    def observation_space(self, agent):
        import gymnasium as gym
        return gym.spaces.Box(0, 1, (4 if agent == "a1" else 3,), np.float32)


def test_agents_with_different_spaces_are_refused_by_name():
    with pytest.raises(ValueError, match="agents 'a0' and 'a1' have different spaces"):
        pettingzoo.ParallelSlots(_Mixed, 1)


def test_a_module_without_a_parallel_env_is_refused():
    with pytest.raises(ValueError, match="has no parallel_env"):
        envs.make_vector_env("pettingzoo:lockstep.envs.tasks", 1)


def test_the_learner_sees_one_agent_slot_spaces():
    spec = envs.env_spec(DEPARTURES)
    assert sorted(path for path, _ in spec.observation.leaves) == [ACTIVE_LEAF, "observation"]


def test_env_agent_id_adds_each_agents_one_hot_also_while_it_is_inactive():
    from lockstep.config import Config, ConfigError, set_value

    config = Config()
    set_value(config, "env.id", DEPARTURES)
    set_value(config, "env.agent_id", True)
    vec = envs.make_vector_env(DEPARTURES, 2, config.env.vector_kwargs())
    assert set(vec.single_observation_space.spaces) == {"observation", ACTIVE_LEAF, pettingzoo.AGENT_ID_LEAF}
    obs, _ = vec.reset(seed=0)
    one_hot = np.tile(np.eye(3, dtype=np.float32), (2, 1))  # [6 slots, 3 agents], each env's agents in order
    assert np.array_equal(obs[pettingzoo.AGENT_ID_LEAF], one_hot)
    for _ in range(7):  # a0 and a1 have left by now (at 3 and 6): their slots are inactive
        obs, *_ = vec.step(np.zeros(vec.num_envs, np.int64))
    assert obs[ACTIVE_LEAF][:, 0].tolist() == [0, 0, 1] * 2
    assert np.array_equal(obs[pettingzoo.AGENT_ID_LEAF], one_hot)
    spec = envs.env_spec(DEPARTURES, kwargs=config.env.vector_kwargs()).observation  # what the learner expects
    assert [path for path, _ in spec.leaves] == sorted(vec.single_observation_space.spaces)
    set_value(config, "env.id", "CartPole-v1")
    with pytest.raises(ConfigError, match="env.agent_id adds an agent index to a PettingZoo parallel env"):
        config.validate()
    with pytest.raises(ValueError, match="CartPole-v1 is none"):
        envs.make_vector_env("CartPole-v1", 1, {pettingzoo.AGENT_ID_KWARG: True})


def _masked_slots(mask_key: str, nested: bool = False, obs_keys: tuple[str, ...] = ()):
    """The departures env with an action mask under ``mask_key`` as a config of that key builds it: every actor's
    vector env, and the spaces the learner expects."""
    from lockstep.config import Config, set_value

    config = Config()
    set_value(config, "env.id", DEPARTURES)
    set_value(config, "env.kwargs", {"mask_key": mask_key, "nested": nested})
    set_value(config, "env.action_mask_key", mask_key)
    kwargs = config.env.vector_kwargs()
    return envs.make_vector_env(DEPARTURES, 2, kwargs), envs.env_spec(DEPARTURES, obs_keys, mask_key, kwargs)


def _legal_actions(mask: np.ndarray) -> np.ndarray:
    return mask.argmax(-1).astype(np.int64)  # the env raises for an illegal action of an agent still there


@pytest.mark.parametrize("mask_key", ["action_mask", "legal"])
def test_a_departed_agents_slot_allows_every_action_under_any_mask_key(mask_key):
    from lockstep.envs.spaces import allowed_nothing

    vec, spec = _masked_slots(mask_key)
    assert spec.observation.mask == mask_key
    obs, _ = vec.reset(seed=0)
    for _ in range(8):  # a0 leaves at 3, a1 at 6: their slots are placeholders for several steps
        obs, *_ = vec.step(_legal_actions(obs[mask_key]))
        assert allowed_nothing(obs[mask_key], spec.observation.mask_groups) is None
        inactive = obs[ACTIVE_LEAF][:, 0] == 0
        assert (obs[mask_key][inactive] == 1).all()
    assert inactive.sum() == 4  # a0 and a1 of both envs


def test_env_obs_keys_keeps_the_active_leaf_and_the_agent_index():
    vec, spec = _masked_slots("legal", obs_keys=("cue", "legal"))
    assert set(spec.observation.paths()) == {"cue", "legal", ACTIVE_LEAF}
    assert set(envs.env_spec(DEPARTURES, ["observation"], kwargs={pettingzoo.AGENT_ID_KWARG: True})
               .observation.paths()) == {"observation", ACTIVE_LEAF, pettingzoo.AGENT_ID_LEAF}
    with pytest.raises(ValueError, match=r"env.obs_keys names \['image'\]"):
        envs.env_spec(DEPARTURES, ["image"])


def test_agents_with_a_tuple_observation_holding_a_dict_leave_with_a_placeholder_of_every_leaf():
    vec, spec = _masked_slots("legal", nested=True)
    assert set(spec.observation.paths()) == {"cue[0]", "cue[1].bit", "legal", ACTIVE_LEAF}
    obs, _ = vec.reset(seed=0)
    for _ in range(8):
        obs, *_ = vec.step(_legal_actions(obs["legal"]))
    cue, bit = obs["cue"]
    inactive = obs[ACTIVE_LEAF][:, 0] == 0
    assert inactive.sum() == 4 and not cue[inactive].any() and not bit["bit"][inactive].any()
    assert cue.shape == (6, 3) and bit["bit"].shape == (6,)


@pytest.mark.parametrize("action", [{"dict": {"go": {"discrete": 3}, "dial": {"box": [2]}}},
                                    {"tuple": [{"multi_binary": 2}, {"discrete": 4}]}])
def test_each_agent_gets_its_own_row_of_every_part_of_a_dict_or_tuple_action(action):
    kwargs = {"observation": {"box": [2]}, "action": action, "agents": 3}
    vec = envs.make_vector_env("pettingzoo:lockstep.envs.generated", 2, kwargs)
    spec = envs.env_spec("pettingzoo:lockstep.envs.generated", kwargs=kwargs).action
    vec.reset(seed=0)
    handed = []
    for env in vec.envs:  # what each env's agents are handed
        step = env.step
        env.step = lambda actions, step=step: (handed.append(actions), step(actions))[1]
    flat = np.stack([(np.arange(spec.element_shape[0]) + slot) % 2 for slot in range(6)])  # [6 slots, entries]
    parts = envs.env_actions(flat.astype(spec.action_dtype), spec)
    vec.step(parts)
    assert len(handed) == 2
    keys = list(parts) if isinstance(parts, dict) else range(len(parts))
    for e, agents in enumerate(handed):
        for i, agent in enumerate(vec.agents):
            for key in keys:
                assert np.array_equal(agents[agent][key], parts[key][e * 3 + i]), (agent, key)
