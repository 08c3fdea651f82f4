"""The actor's vector env (``envs.vector.SameStepVectorEnv``) against Gymnasium's ``SyncVectorEnv`` in
same-step autoreset, and its envs in processes (``SameStepAsyncVectorEnv``, ``actors.vector: async``) against it:
the same observations, rewards, flags, final observations and episode statistics."""

from __future__ import annotations

import os
import signal

import gymnasium as gym
import numpy as np
import pytest

from lockstep import envs
from lockstep.envs.vector import EnvProcessDied, SameStepAsyncVectorEnv, SameStepVectorEnv


def _pair(env_id: str, n: int, **kwargs):
    make = [lambda: envs.make_env(env_id, **kwargs) for _ in range(n)]
    ours = envs.FinishedEpisodes(SameStepVectorEnv(make))
    theirs = envs.FinishedEpisodes(gym.vector.SyncVectorEnv(make, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP))
    return ours, theirs


@pytest.mark.parametrize("env_id, kwargs", [
    ("CartPole-v1", {"max_episode_steps": 30}),  # terminations and truncations
    ("Pendulum-v1", {"max_episode_steps": 25}),  # truncations only, a Box action
    ("Hopper-v5", {"max_episode_steps": 40}),  # a MuJoCo env, whose infos hold numbers at every step
])
def test_each_step_is_gymnasiums_same_step_autoreset(env_id, kwargs):
    _assert_same_steps(*_pair(env_id, 3, **kwargs))


def test_envs_in_processes_step_as_the_envs_in_the_actor():
    ours = envs.make_vector_env("CartPole-v1", 3, {"max_episode_steps": 30}, vector="async")
    assert isinstance(ours.env, SameStepAsyncVectorEnv)
    _assert_same_steps(ours, envs.make_vector_env("CartPole-v1", 3, {"max_episode_steps": 30}))


def _assert_same_steps(ours: envs.FinishedEpisodes, theirs: envs.FinishedEpisodes) -> None:
    """150 steps of random actions from the same seeds: every step's arrays and infos alike."""
    try:
        obs_a, _ = ours.reset(seed=[1, 2, 3])
        obs_b, _ = theirs.reset(seed=[1, 2, 3])
        np.testing.assert_array_equal(obs_a, obs_b)
        ours.action_space.seed(7)
        ended = truncated_seen = 0
        for _ in range(150):
            actions = ours.action_space.sample()
            a, b = ours.step(actions), theirs.step(actions)
            for x, y in zip(a[:4], b[:4]):
                np.testing.assert_array_equal(x, y)
                assert x.dtype == y.dtype
            info_a, info_b = a[4], b[4]
            assert ("final_obs" in info_a) == ("final_obs" in info_b)
            if "final_obs" in info_b:
                done = a[2] | a[3]
                for i in np.flatnonzero(done):
                    np.testing.assert_array_equal(info_a["final_obs"][i], info_b["final_obs"][i])
                assert all(info_a["final_obs"][i] is None for i in np.flatnonzero(~done))
            assert ("episode" in info_a) == ("episode" in info_b)
            if "episode" in info_b:
                np.testing.assert_array_equal(info_a["_episode"], info_b["_episode"])
                for key in ("r", "l"):
                    np.testing.assert_array_equal(info_a["episode"][key][info_a["_episode"]],
                                                  info_b["episode"][key][info_b["_episode"]])
                ended += int(info_a["_episode"].sum())
            truncated_seen += int((a[3] & ~a[2]).sum())
        assert ended > 3 and truncated_seen > 0  # the comparison covered episodes that ended, by the time limit too
        assert ours.episode_count == theirs.episode_count == ended
    finally:
        ours.close()
        theirs.close()


def test_the_actor_steps_this_vector_env():
    vec = envs.make_vector_env("CartPole-v1", 2)
    try:
        assert isinstance(vec.env, SameStepVectorEnv)
    finally:
        vec.close()


def test_an_env_process_that_dies_is_named_and_the_others_end():
    vec = envs.make_vector_env("CartPole-v1", 2, vector="async")
    processes = vec.env.processes
    try:
        vec.reset(seed=[1, 2])
        vec.step(np.zeros(2, np.int64))
        os.kill(processes[1].pid, signal.SIGKILL)
        with pytest.raises(EnvProcessDied, match=rf"env 1 of 2 \(CartPole-v1\) died: its process "
                                                 rf"{processes[1].pid} ended \(killed by SIGKILL\)"):
            vec.step(np.zeros(2, np.int64))
        assert not processes[0].is_alive()  # the actor is not left with half a vector env
    finally:
        vec.close()


@pytest.mark.parametrize("env_id", ["envpool:Pong-v5", "pettingzoo:lockstep.envs.departures"])
def test_async_is_for_gymnasium_envs(env_id):
    with pytest.raises(ValueError, match="leave actors.vector at sync"):
        envs.make_vector_env(env_id, 2, vector="async")
