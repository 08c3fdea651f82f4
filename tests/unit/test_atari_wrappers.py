"""The Atari preprocessing of ``lockstep.envs.atari``, wrapper by wrapper, on real ALE games: each
wrapped env is compared with an unwrapped twin stepped by hand from the same seed, or with values
worked out by hand."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from lockstep.envs import wrapper_types
from lockstep.envs.atari import (
    ClipReward,
    EpisodicLife,
    FireReset,
    FrameStack,
    MaxAndSkip,
    NoopReset,
    ResizeFrame,
    area_weights,
    make_atari,
    register_atari,
)

pytest.importorskip("ale_py")

NOOP, FIRE = 0, 1  # Breakout's actions: NOOP, FIRE, RIGHT, LEFT
BREAKOUT = "BreakoutNoFrameskip-v4"


def raw(game: str = BREAKOUT) -> gym.Env:
    """The emulator as the stack receives it: every frame, greyscale, (210, 160) uint8."""
    register_atari()
    return gym.make(game, obs_type="grayscale", frameskip=1)


class RecordActions(gym.Wrapper):
    """Keeps every action that passes through it."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.actions: list[int] = []

    def step(self, action):
        self.actions.append(int(action))
        return self.env.step(action)


def test_area_weights_average_the_input_pixels_each_output_pixel_covers():
    np.testing.assert_allclose(area_weights(4, 2), [[0.5, 0.5, 0, 0], [0, 0, 0.5, 0.5]])
    # 3 -> 2: each output pixel covers 1.5 input pixels, sharing the middle one
    np.testing.assert_allclose(area_weights(3, 2), [[2 / 3, 1 / 3, 0], [0, 1 / 3, 2 / 3]], rtol=1e-6)
    rows = area_weights(210, 84)  # 2.5 input rows to an output row
    np.testing.assert_allclose(rows[0, :4], [0.4, 0.4, 0.2, 0.0], rtol=1e-6)
    np.testing.assert_allclose(rows[1, 2:5], [0.2, 0.4, 0.4], rtol=1e-6)
    np.testing.assert_allclose(rows.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(area_weights(160, 84).sum(axis=1), 1.0, rtol=1e-6)
    with pytest.raises(ValueError, match="shrinks"):
        area_weights(84, 168)


def test_resize_gives_the_block_averages_of_a_synthetic_frame():
    env = ResizeFrame(raw(), 84, 84)
    assert env.observation_space == gym.spaces.Box(0, 255, (84, 84), np.uint8)
    r, c = np.mgrid[:210, :160]
    # quadrants split at row 105 and column 80, which fall on output pixel boundaries (42 * 2.5, 42 * 160 / 84)
    quadrants = (100 * (r >= 105) + 50 * (c >= 80)).astype(np.uint8)
    out = env.observation(quadrants)
    assert out.dtype == np.uint8 and out.shape == (84, 84)
    for rows, cols, value in ((slice(0, 42), slice(0, 42), 0), (slice(0, 42), slice(42, 84), 50),
                              (slice(42, 84), slice(0, 42), 100), (slice(42, 84), slice(42, 84), 150)):
        assert (out[rows, cols] == value).all()
    np.testing.assert_array_equal(env.observation(np.full((210, 160), 77, np.uint8)), 77)
    # one bright pixel: 255 * (1 / 2.5) * (84 / 160) = 53.55 in the corner, nothing elsewhere
    dot = np.zeros((210, 160), np.uint8)
    dot[0, 0] = 255
    out = env.observation(dot)
    assert out[0, 0] == 54 and out.sum() == 54


def test_max_and_skip_holds_the_action_for_four_frames_and_max_pools_the_last_two():
    twin = raw()
    env = MaxAndSkip(raw(), 4)
    twin.reset(seed=3)
    env.reset(seed=3)
    for action in (FIRE, NOOP, NOOP, NOOP):  # the ball is in flight: consecutive frames differ
        frames, rewards = [], []
        for _ in range(4):
            obs, reward, *_ = twin.step(action)
            frames.append(obs)
            rewards.append(reward)
        obs, reward, terminated, truncated, _ = env.step(action)
        np.testing.assert_array_equal(obs, np.maximum(frames[2], frames[3]))
        assert reward == sum(rewards) and not terminated and not truncated
    assert (obs != frames[3]).any() and (obs != frames[2]).any()  # the pool differs from either frame alone


def test_frame_stack_is_oldest_first_and_a_reset_fills_it():
    twin = raw()
    env = FrameStack(raw(), 4)
    assert env.observation_space.shape == (4, 210, 160) and env.observation_space.dtype == np.uint8
    first, _ = twin.reset(seed=1)
    obs, _ = env.reset(seed=1)
    np.testing.assert_array_equal(obs, np.stack([first] * 4))
    frames = [first] * 3
    for action in (FIRE, NOOP, NOOP, NOOP, NOOP):
        frames.append(twin.step(action)[0])
        obs = env.step(action)[0]
        np.testing.assert_array_equal(obs, np.stack(frames[-4:]))
    assert not np.array_equal(obs[0], obs[3])
    kept = obs.copy()
    env.step(NOOP)
    np.testing.assert_array_equal(obs, kept)  # a returned stack is the caller's: later steps leave it alone


def test_episodic_life_ends_an_episode_per_life_and_resets_the_game_only_when_it_is_over():
    env = EpisodicLife(MaxAndSkip(raw(), 4))
    ale = env.unwrapped.ale
    env.reset(seed=0)
    assert ale.lives() == 5
    lives_lost = 0
    for _ in range(2000):
        _, _, terminated, truncated, info = env.step(FIRE)  # FIRE relaunches the ball; the paddle stays put
        assert not truncated
        if not terminated:
            continue
        if not ale.game_over():
            lives_lost += 1
            assert ale.lives() == 5 - lives_lost
            frame = info["episode_frame_number"]
            _, info = env.reset()
            assert ale.lives() == 5 - lives_lost and info["episode_frame_number"] > frame  # the same game
            continue
        assert lives_lost == 4 and ale.lives() == 0
        _, info = env.reset()
        assert ale.lives() == 5 and info["episode_frame_number"] == 0  # a new game
        return
    raise AssertionError("Breakout did not end within 2000 agent steps")


def test_fire_reset_presses_fire_after_every_reset_in_games_that_have_it():
    recorded = RecordActions(raw())
    env = FireReset(recorded)
    env.reset(seed=0)
    assert recorded.actions == [FIRE]
    env.step(NOOP)
    env.reset()
    assert recorded.actions == [FIRE, NOOP, FIRE]
    assert FireReset not in wrapper_types(make_atari("FreewayNoFrameskip-v4"))  # NOOP, UP, DOWN: nothing to fire
    assert FireReset in wrapper_types(make_atari("PongNoFrameskip-v4"))


def test_noop_reset_plays_a_seeded_random_number_of_noops():
    env = NoopReset(raw(), noop_max=30)
    counts = [env.reset(seed=seed)[1]["episode_frame_number"] for seed in range(5)]  # frames since the reset
    assert all(1 <= n <= 30 for n in counts) and len(set(counts)) > 1
    assert [env.reset(seed=seed)[1]["episode_frame_number"] for seed in (3, 1)] == [counts[3], counts[1]]


def test_reward_clipping_keeps_the_sign():
    env = ClipReward(raw())
    assert [env.reward(r) for r in (7.0, 1.0, 0.0, -3.0)] == [1.0, 1.0, 0.0, -1.0]


def test_the_training_stack_observes_stacked_84x84_uint8_frames_and_repeats_from_a_seed():
    a, b = make_atari(BREAKOUT), make_atari(BREAKOUT)
    assert a.observation_space == gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    assert a.action_space == gym.spaces.Discrete(4)
    obs_a, _ = a.reset(seed=11)
    obs_b, _ = b.reset(seed=11)
    assert obs_a.dtype == np.uint8 and obs_a.shape == (4, 84, 84) and a.observation_space.contains(obs_a)
    np.testing.assert_array_equal(obs_a, obs_b)
    actions = np.random.default_rng(0).integers(0, 4, 60)
    for action in actions:
        step_a, step_b = a.step(action), b.step(action)
        np.testing.assert_array_equal(step_a[0], step_b[0])
        assert step_a[1:4] == step_b[1:4]
    assert (step_a[0] > 0).any()


def test_the_evaluation_stack_plays_whole_games_with_raw_rewards():
    env = make_atari(BREAKOUT, training=False)
    assert EpisodicLife not in wrapper_types(env) and ClipReward not in wrapper_types(env)
    env.reset(seed=2)
    steps, terminated, truncated = 0, False, False
    while not (terminated or truncated) and steps < 3000:
        _, _, terminated, truncated, info = env.step(NOOP)  # FIRE after each lost life is the wrapper's
        steps += 1
    assert terminated and env.unwrapped.ale.lives() == 0
    assert info["episode"]["l"] == steps + 5  # and the FIRE steps: after the reset and after 4 lost lives
