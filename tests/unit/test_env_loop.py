"""The actor's ``EnvLoop`` on real CartPole vector envs: same-step autoreset, final observations, episode stats.

Every step is checked against twin single envs stepped by hand with the same seeds and actions.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from lockstep.actor import EnvLoop
from lockstep.envs import SpaceSpec, make_vector_env

# With action 1 at every step, CartPole-v1 reset with seed 0 terminates after 8 steps, seed 1 after 9, seed 2 after 10.
PUSH_RIGHT_STEPS = {0: 8, 1: 9, 2: 10}


def cartpole_3_steps(**kwargs) -> gym.Env:
    """Entry point ``test_env_loop:cartpole_3_steps``: episodes truncated after 3 steps."""
    return gym.make("CartPole-v1", max_episode_steps=3, **kwargs)


def cartpole_9_steps(**kwargs) -> gym.Env:
    """Entry point ``test_env_loop:cartpole_9_steps``: episodes truncated after 9 steps."""
    return gym.make("CartPole-v1", max_episode_steps=9, **kwargs)


class RecordAction(gym.Wrapper):
    def step(self, action):
        self.last_action = np.array(action)
        return self.env.step(action)


def recording_pendulum(**kwargs) -> gym.Env:
    """Entry point ``test_env_loop:recording_pendulum``: Pendulum (actions in [-2, 2]) that keeps its last action."""
    return RecordAction(gym.make("Pendulum-v1", **kwargs))


class Twins:
    """Single envs stepped by hand with same-step autoreset, to compare the vector env against."""

    def __init__(self, factory, seeds: list[int]) -> None:
        self.envs = [factory() for _ in seeds]
        self.obs = [env.reset(seed=s)[0] for env, s in zip(self.envs, seeds)]

    def step(self, actions) -> tuple[list[bool], list[bool], dict[int, np.ndarray]]:
        """Step every env; returns terminated, truncated and {slot: last observation} of every ended episode."""
        terminated, truncated, last = [], [], {}
        for i, (env, action) in enumerate(zip(self.envs, actions)):
            obs, _, term, trunc, _ = env.step(action)
            terminated.append(term)
            truncated.append(trunc)
            if term or trunc:
                last[i] = obs
                obs, _ = env.reset()
            self.obs[i] = obs
        return terminated, truncated, last


def env_loop(env_id: str, seeds: list[int]) -> EnvLoop:
    vec = make_vector_env(env_id, len(seeds))
    loop = EnvLoop(vec, SpaceSpec.from_space(vec.single_action_space))
    loop.reset(seeds)
    return loop


def test_terminated_step_gives_the_reset_observation_and_no_final_observation():
    loop = env_loop("CartPole-v1", [0, 1])
    twins = Twins(lambda: gym.make("CartPole-v1"), [0, 1])
    np.testing.assert_array_equal(loop.obs, np.stack(twins.obs))
    push = np.array([1, 1])
    for _ in range(PUSH_RIGHT_STEPS[0] - 1):
        loop.step(push)
        twins.step(push)
        assert not loop.terminated.any() and len(loop.final_index) == 0 and len(loop.ep_return) == 0
        np.testing.assert_array_equal(loop.obs, np.stack(twins.obs))
    loop.step(push)  # step 8: slot 0's episode terminates
    _, _, last = twins.step(push)
    np.testing.assert_array_equal(loop.terminated, [True, False])
    np.testing.assert_array_equal(loop.truncated, [False, False])
    np.testing.assert_array_equal(loop.obs, np.stack(twins.obs))  # slot 0 already holds its reset observation
    assert not np.array_equal(loop.obs[0], last[0])
    assert loop.final_index.shape == (0,) and loop.final_obs.shape == (0, 4)  # termination needs no bootstrap
    np.testing.assert_array_equal(loop.ep_return, [8.0])
    np.testing.assert_array_equal(loop.ep_length, [8])
    np.testing.assert_array_equal(loop.reward, [1.0, 1.0])
    loop.step(push)
    twins.step(push)
    np.testing.assert_array_equal(loop.terminated, [False, True])
    np.testing.assert_array_equal(loop.obs, np.stack(twins.obs))
    np.testing.assert_array_equal(loop.ep_return, [9.0])
    np.testing.assert_array_equal(loop.ep_length, [9])
    loop.step(push)
    twins.step(push)
    assert not loop.terminated.any() and len(loop.ep_return) == 0 and len(loop.ep_length) == 0


def test_truncated_episode_reports_its_last_observation():
    loop = env_loop("test_env_loop:cartpole_3_steps", [5, 6])
    twins = Twins(cartpole_3_steps, [5, 6])
    for actions in ([0, 1], [1, 0]):
        loop.step(np.array(actions))
        twins.step(actions)
        assert len(loop.final_index) == 0
    loop.step(np.array([0, 1]))
    terminated, truncated, last = twins.step([0, 1])
    assert terminated == [False, False] and truncated == [True, True]
    np.testing.assert_array_equal(loop.terminated, [False, False])
    np.testing.assert_array_equal(loop.truncated, [True, True])
    np.testing.assert_array_equal(loop.final_index, [0, 1])
    assert loop.final_index.dtype == np.int64
    np.testing.assert_array_equal(loop.final_obs, np.stack([last[0], last[1]]))  # the episodes' last observations
    assert loop.final_obs.dtype == loop.obs.dtype
    np.testing.assert_array_equal(loop.obs, np.stack(twins.obs))  # and the reset observations to act on
    np.testing.assert_array_equal(loop.ep_return, [3.0, 3.0])
    np.testing.assert_array_equal(loop.ep_length, [3, 3])
    loop.step(np.array([1, 1]))
    assert loop.final_index.shape == (0,) and loop.final_obs.shape == (0, 4)
    assert len(loop.ep_return) == 0


def test_one_step_ending_episodes_by_termination_by_truncation_and_by_both():
    """Action 1 throughout, episodes cut at 9 steps. Slot 0 (seed 0) terminated after 8 steps and is 1 step into
    its next episode at step 9; slot 1 (seed 1) terminates at step 9, exactly when its time runs out: termination
    wins, no final observation; slot 2 (seed 2) would terminate at step 10 and is truncated at step 9."""
    loop = env_loop("test_env_loop:cartpole_9_steps", [0, 1, 2])
    twins = Twins(cartpole_9_steps, [0, 1, 2])
    push = np.array([1, 1, 1])
    for _ in range(8):
        loop.step(push)
        twins.step(push)
    np.testing.assert_array_equal(loop.terminated, [True, False, False])
    loop.step(push)
    terminated, truncated, last = twins.step(push)
    assert terminated == [False, True, False] and truncated == [False, True, True]
    np.testing.assert_array_equal(loop.terminated, terminated)
    np.testing.assert_array_equal(loop.truncated, truncated)
    np.testing.assert_array_equal(loop.final_index, [2])
    np.testing.assert_array_equal(loop.final_obs, last[2][None])
    np.testing.assert_array_equal(loop.obs, np.stack(twins.obs))
    np.testing.assert_array_equal(loop.ep_return, [9.0, 9.0])
    np.testing.assert_array_equal(loop.ep_length, [9, 9])


def test_forgotten_outcome_is_a_first_message():
    """After a reconnect the learner dropped the unroll: the next message carries no outcome."""
    loop = env_loop("test_env_loop:cartpole_3_steps", [5, 6])
    for _ in range(3):
        loop.step(np.array([0, 1]))
    assert loop.truncated.all() and len(loop.final_index) == 2
    obs = loop.obs.copy()
    loop.forget_outcome()
    np.testing.assert_array_equal(loop.reward, [0.0, 0.0])
    assert not loop.terminated.any() and not loop.truncated.any()
    assert loop.final_index.shape == (0,) and loop.final_obs.shape == (0, 4)
    np.testing.assert_array_equal(loop.obs, obs)  # still the observation to act on


def test_box_actions_are_clipped_to_the_action_space_before_stepping():
    loop = env_loop("test_env_loop:recording_pendulum", [0, 1])
    actions = np.array([[5.0], [-0.5]], np.float32)
    loop.step(actions)
    stepped = [env.last_action for env in loop.vec.env.envs]
    np.testing.assert_array_equal(np.stack(stepped), [[2.0], [-0.5]])
    np.testing.assert_array_equal(actions, [[5.0], [-0.5]])  # the caller's actions are left as they were
