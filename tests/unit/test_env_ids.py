"""The env-id schemes of ``lockstep.envs`` (``atari:``, ``minatar:``, ``masked:``) and where the actor's
episode statistics come from: a recorder in each env, below Atari's episodic life and reward clipping."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from lockstep.actor import EnvLoop
from lockstep.envs import (
    RecordEpisodes,
    SpaceSpec,
    env_spec,
    make_env,
    make_vector_env,
    reward_threshold,
    wrapper_types,
)
from lockstep.envs.atari import ClipReward, EpisodicLife, register_atari, wrap_atari

ASTERIX = "AsterixNoFrameskip-v4"


class GameScore(gym.Wrapper):
    """On the emulator itself: the total reward of every finished game, frame by frame, unclipped."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.score, self.games = 0.0, []

    def reset(self, **kwargs):
        self.score = 0.0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.score += float(reward)
        if terminated or truncated:
            self.games.append(self.score)
        return obs, reward, terminated, truncated, info


def scored_asterix(**kwargs) -> gym.Env:
    """Entry point ``test_env_ids:scored_asterix``: the ``atari:`` training stack around a ``GameScore``.
    Asterix scores 50 points and more at a time, and a random player's game lasts about 200 steps."""
    register_atari()
    return wrap_atari(GameScore(gym.make(ASTERIX, obs_type="grayscale", frameskip=1, **kwargs)))


def recording_cartpole(**kwargs) -> gym.Env:
    """Entry point ``test_env_ids:recording_cartpole``: an env that records its own episodes."""
    return gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1", **kwargs))


def test_masked_cartpole_keeps_position_and_angle_only():
    spec = env_spec("masked:CartPole-v1")
    inner = gym.make("CartPole-v1")
    assert spec.observation.shape == (2,) and spec.observation.dtype == "float32"
    np.testing.assert_array_equal(spec.observation.low, inner.observation_space.low[[0, 2]])
    np.testing.assert_array_equal(spec.observation.high, inner.observation_space.high[[0, 2]])
    assert spec.action.describe() == "Discrete(2)"
    env = make_env("masked:CartPole-v1")
    obs, _ = env.reset(seed=7)
    inner_obs, _ = inner.reset(seed=7)
    np.testing.assert_array_equal(obs, inner_obs[[0, 2]])  # cart position, pole angle
    for action in (0, 1, 1, 0, 1):
        obs = env.step(action)[0]
        inner_obs = inner.step(action)[0]
        assert obs.dtype == np.float32
        np.testing.assert_array_equal(obs, inner_obs[[0, 2]])
    assert env_spec("masked:Pendulum-v1").observation.shape == (2,)  # cos and sin of the angle


def test_masked_cartpole_in_the_actor_loop():
    vec = make_vector_env("masked:CartPole-v1", 2)
    try:
        loop = EnvLoop(vec, SpaceSpec.from_space(vec.single_action_space))
        loop.reset([0, 1])
        assert loop.obs.shape == (2, 2) and loop.obs.dtype == np.float32
        for _ in range(8):  # pushing right, seed 0 falls after 8 steps, seed 1 after 9 (tests/test_env_loop.py)
            loop.step(np.array([1, 1]))
        np.testing.assert_array_equal(loop.terminated, [True, False])
        np.testing.assert_array_equal(loop.ep_return, [8.0])
    finally:
        vec.close()


def test_reward_thresholds_of_the_schemes():
    assert reward_threshold("masked:CartPole-v1") == 475.0
    assert reward_threshold("atari:PongNoFrameskip-v4") is None
    assert reward_threshold("minatar:breakout") is None


@pytest.mark.parametrize(("env_id", "named"), [
    ("minatar:pong", "the games are asterix, breakout, freeway, seaquest, space_invaders"),
    ("minatar:space-invaders", "did you mean space_invaders"),
    ("masked:Acrobot-v1", "masked envs are CartPole-v1, Pendulum-v1"),
    ("masked:CartPole-v0", "did you mean CartPole-v1"),
])
def test_unknown_games_name_the_valid_ones(env_id, named):
    for build in (env_spec, make_env, lambda env_id: make_vector_env(env_id, 2)):
        with pytest.raises(ValueError, match=named):
            build(env_id)


def test_unknown_atari_games_name_the_closest():
    pytest.importorskip("ale_py")
    with pytest.raises(ValueError, match=r"unknown Atari game 'Pongg'.*closest: PongNoFrameskip-v4"):
        env_spec("atari:Pongg")
    with pytest.raises(ValueError, match="closest: BreakoutNoFrameskip-v4"):
        make_vector_env("atari:breakout", 1)


def test_atari_ids_build_the_stack_for_training_or_evaluation():
    pytest.importorskip("ale_py")
    spec = env_spec("atari:PongNoFrameskip-v4")
    assert spec.observation == SpaceSpec.from_space(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8))
    assert spec.action.describe() == "Discrete(6)"
    assert env_spec("atari:ALE/Pong-v5").observation == spec.observation  # the stack skips frames, not the ALE

    training, evaluation = wrapper_types(make_env("atari:PongNoFrameskip-v4")), wrapper_types(make_env(
        "atari:PongNoFrameskip-v4", training=False))
    assert EpisodicLife in training and ClipReward in training
    assert EpisodicLife not in evaluation and ClipReward not in evaluation
    for found in (training, evaluation):  # one recorder, inside the stack
        assert found.count(gym.wrappers.RecordEpisodeStatistics) == 1 and RecordEpisodes not in found


def test_plain_envs_record_their_episodes_outermost_and_only_once():
    env = make_env("CartPole-v1")
    assert isinstance(env, RecordEpisodes)
    env.reset(seed=0)
    for _ in range(7):  # pushing right, seed 0 falls after 8 steps (tests/test_env_loop.py)
        assert "episode" not in env.step(1)[4]
    info = env.step(1)[4]
    assert info["episode"]["r"] == 8.0 and info["episode"]["l"] == 8
    assert not isinstance(make_env("test_env_ids:recording_cartpole").env, gym.wrappers.RecordEpisodeStatistics)
    vec = make_vector_env("test_env_ids:recording_cartpole", 2)
    try:
        loop = EnvLoop(vec, SpaceSpec.from_space(vec.single_action_space))
        loop.reset([0, 0])
        for _ in range(8):
            loop.step(np.array([1, 1]))
        np.testing.assert_array_equal(loop.ep_return, [8.0, 8.0])
        assert vec.episode_count == 2
    finally:
        vec.close()


def test_the_actor_reports_the_raw_score_of_whole_atari_games():
    """Training ends an episode at every lost life and clips rewards; the reported episodes are games,
    scored as the emulator scored them."""
    pytest.importorskip("ale_py")
    vec = make_vector_env("test_env_ids:scored_asterix", 2)
    try:
        scores = [_find(env, GameScore) for env in vec.env.envs]
        loop = EnvLoop(vec, SpaceSpec.from_space(vec.single_action_space))
        loop.reset([3, 4])
        rng = np.random.default_rng(0)
        clipped = np.zeros(2)  # what the learner was given in each env's current game
        episodes = np.zeros(2, np.int64)  # training episodes in each env's current game
        raw_total = clipped_total = 0.0
        games = 0
        for _ in range(3000):
            finished_before = [len(score.games) for score in scores]
            loop.step(rng.integers(0, vec.single_action_space.n, 2))
            assert set(np.unique(loop.reward)) <= {0.0, 1.0}
            clipped += loop.reward
            episodes += loop.terminated
            over = [i for i, score in enumerate(scores) if len(score.games) > finished_before[i]]
            assert len(loop.ep_return) == len(over)
            for i, reported, length in zip(over, loop.ep_return, loop.ep_length):
                assert reported == scores[i].games[-1] >= clipped[i]
                assert episodes[i] > 1 and length > 100  # several lives, one game
                raw_total, clipped_total = raw_total + reported, clipped_total + clipped[i]
                clipped[i], episodes[i] = 0.0, 0
                games += 1
            if games >= 2:
                break
        assert games >= 2 and raw_total > clipped_total
    finally:
        vec.close()


def _find(env: gym.Env, kind: type) -> gym.Wrapper:
    while not isinstance(env, kind):
        env = env.env
    return env
