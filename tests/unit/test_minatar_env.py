"""``minatar:GAME`` envs: MinAtar's games as Gymnasium envs with channels-first uint8 observations,
seeded from ``reset(seed=...)``, cut by a time limit; alone, in a vector env and in the actor's loop."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from lockstep.actor import EnvLoop
from lockstep.envs import SpaceSpec, env_spec, make_vector_env
from lockstep.envs.minatar import GAMES, MinAtarEnv, make_minatar

minatar = pytest.importorskip("minatar")


def freeway_5_steps(**kwargs) -> gym.Env:
    """Entry point ``test_minatar_env:freeway_5_steps``: Freeway (never over before 2,500 frames) cut at 5 steps."""
    return make_minatar("freeway", max_episode_steps=5, **kwargs)


def test_every_game_observes_uint8_channels_first_and_acts_on_its_minimal_action_set():
    for game in GAMES:
        reference = minatar.Environment(game)
        rows, cols, channels = reference.state_shape()
        env = make_minatar(game)
        assert env.observation_space == gym.spaces.Box(0, 1, (channels, rows, cols), np.uint8)
        assert (rows, cols) == (10, 10)
        assert env.action_space == gym.spaces.Discrete(len(reference.minimal_action_set()))
        obs, _ = env.reset(seed=0)
        assert obs.dtype == np.uint8 and obs.flags.c_contiguous and env.observation_space.contains(obs)
    assert make_minatar("breakout", minimal_actions=False).action_space == gym.spaces.Discrete(6)


def test_observations_are_the_game_state_channels_first():
    env = MinAtarEnv("breakout", sticky_action_prob=0.0)
    reference = minatar.Environment("breakout", sticky_action_prob=0.0)
    reference.seed(4)
    reference.reset()
    obs, _ = env.reset(seed=4)
    np.testing.assert_array_equal(obs, reference.state().transpose(2, 0, 1))
    minimal = reference.minimal_action_set()  # breakout: no-op, left, right
    for action in (1, 1, 2, 0, 2):
        reward, done = reference.act(minimal[action])
        obs, env_reward, terminated, truncated, _ = env.step(action)
        np.testing.assert_array_equal(obs, reference.state().transpose(2, 0, 1))
        assert (env_reward, terminated, truncated) == (float(reward), done, False)


def test_sticky_actions_default_to_minatars_and_can_be_turned_off():
    assert MinAtarEnv("asterix").game.sticky_action_prob == 0.1
    assert make_minatar("asterix", sticky_action_prob=0.0).unwrapped.game.sticky_action_prob == 0.0


def test_a_seed_repeats_an_episode_sticky_actions_included():
    def rollout(env: gym.Env, seed: int) -> tuple[np.ndarray, np.ndarray]:
        observations = [env.reset(seed=seed)[0]]
        rewards = []
        for action in np.random.default_rng(0).integers(0, env.action_space.n, 150):
            obs, reward, terminated, _, _ = env.step(action)
            observations.append(obs)
            rewards.append(reward)
            if terminated:
                observations.append(env.reset()[0])
        return np.stack(observations), np.array(rewards)

    def same(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> bool:
        return all(x.shape == y.shape and np.array_equal(x, y) for x, y in zip(a, b))

    env = make_minatar("asterix")
    first = rollout(env, 5)
    assert same(first, rollout(make_minatar("asterix"), 5))
    assert same(first, rollout(env, 5))  # a seeded reset of a used env starts over too
    assert not same(first, rollout(env, 6))


def test_the_time_limit_truncates():
    env = freeway_5_steps()
    env.reset(seed=0)
    for _ in range(4):
        assert env.step(1)[2:4] == (False, False)
    assert env.step(1)[2:4] == (False, True)
    assert make_minatar("seaquest")._max_episode_steps == 10_000


def test_minatar_ids_through_the_vector_env_and_the_actor_loop():
    spec = env_spec("minatar:breakout")
    assert spec.observation == SpaceSpec.from_space(gym.spaces.Box(0, 1, (4, 10, 10), np.uint8))
    assert spec.action.n == 3
    vec = make_vector_env("test_minatar_env:freeway_5_steps", 2)
    try:
        loop = EnvLoop(vec, SpaceSpec.from_space(vec.single_action_space))
        loop.reset([1, 2])
        assert loop.obs.shape == (2, 7, 10, 10) and loop.obs.dtype == np.uint8
        for _ in range(5):
            loop.step(np.array([1, 1]))
        np.testing.assert_array_equal(loop.truncated, [True, True])
        np.testing.assert_array_equal(loop.final_index, [0, 1])  # to bootstrap the truncated episodes from
        assert loop.final_obs.shape == (2, 7, 10, 10) and loop.final_obs.dtype == np.uint8
        np.testing.assert_array_equal(loop.ep_length, [5, 5])
    finally:
        vec.close()
    vec = make_vector_env("minatar:breakout", 2)
    try:
        loop = EnvLoop(vec, SpaceSpec.from_space(vec.single_action_space))
        loop.reset([1, 2])
        rewards = np.zeros(2)
        for step in range(1, 500):
            loop.step(np.random.default_rng(step).integers(0, 3, 2))
            rewards += loop.reward
            if len(loop.ep_return):
                break
        assert loop.terminated.any() and len(loop.ep_return) == loop.terminated.sum()
        np.testing.assert_array_equal(loop.ep_return, rewards[loop.terminated])
    finally:
        vec.close()
