"""``vizdoom:SCENARIO`` envs: ViZDoom's games as Gymnasium envs with channels-first RGB frames shrunk to 128 x 72,
one button per action, ViZDoom's own frame skip, seeded from ``reset(seed=...)``; a user's own ``.cfg`` file."""

from __future__ import annotations

import os
import shutil
import sys

import gymnasium as gym
import numpy as np
import pytest

from lockstep.envs import env_spec, make_env, make_vector_env
from lockstep.envs.vizdoom import make_vizdoom

vizdoom = pytest.importorskip("vizdoom")


def own_config(tmp_path, body: str) -> str:
    """A scenario file of the user's on a copy of basic's map beside it, ``body`` its buttons and so on."""
    shutil.copy(os.path.join(vizdoom.scenarios_path, "basic.wad"), tmp_path / "mine.wad")
    path = tmp_path / "mine.cfg"
    path.write_text(f"doom_scenario_path = mine.wad\ndoom_map = map01\nliving_reward = -1\n{body}\n")
    return str(path)


def rollout(env: gym.Env, seed: int, steps: int) -> tuple[list[np.ndarray], list[float]]:
    frames, rewards = [env.reset(seed=seed)[0]], []
    for action in np.random.default_rng(0).integers(0, env.action_space.n, steps):
        obs, reward, terminated, truncated, _ = env.step(action)
        frames.append(obs)
        rewards.append(reward)
        if terminated or truncated:
            frames.append(env.reset()[0])
    return frames, rewards


def test_basic_sends_rgb_frames_channels_first_at_128_by_72_and_presses_one_button_at_a_time():
    env = make_env("vizdoom:basic")
    try:
        assert env.observation_space == gym.spaces.Box(0, 255, (3, 72, 128), np.uint8)
        assert env.action_space == gym.spaces.Discrete(4)
        assert env.unwrapped.action_names == ("NOOP", "MOVE_LEFT", "MOVE_RIGHT", "ATTACK")
        assert env.unwrapped.buttons == [[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]]
        obs, _ = env.reset(seed=1)
        assert obs.shape == (3, 72, 128) and obs.dtype == np.uint8 and obs.flags.c_contiguous
        assert env.observation_space.contains(obs) and obs.std() > 0  # a picture, not a blank
    finally:
        env.close()
    spec = env_spec("vizdoom:basic")  # the spaces without starting the engine
    assert spec.observation.shape == (3, 72, 128) and spec.action.describe() == "Discrete(4)"


def test_frames_are_shrunk_by_the_nearest_pixel_or_by_area_averaging():
    full, nearest, area = (make_vizdoom("basic", width=160, height=120), make_vizdoom("basic"),
                           make_vizdoom("basic", resize="area"))
    try:
        frame, small, averaged = (env.reset(seed=5)[0] for env in (full, nearest, area))
        assert frame.shape == (3, 120, 160) and small.flags.c_contiguous and averaged.flags.c_contiguous
        rows, cols = np.arange(72) * 120 // 72, np.arange(128) * 160 // 128  # OpenCV's INTER_NEAREST
        np.testing.assert_array_equal(small, frame[:, rows][:, :, cols])
        assert averaged.shape == (3, 72, 128) and not np.array_equal(averaged, small)
        assert abs(float(averaged.mean()) - float(frame.mean())) < 1.0  # an average keeps the brightness
    finally:
        for env in (full, nearest, area):
            env.close()


def test_the_health_scenarios_observe_their_game_variables_beside_the_screen():
    env = make_vizdoom("health_gathering_supreme")
    try:
        assert env.observation_space["vars"] == gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
        assert env.variable_names == ("HEALTH",)
        obs, _ = env.reset(seed=0)
        assert obs["screen"].shape == (3, 72, 128) and obs["vars"].dtype == np.float32 and 0 < obs["vars"][0] <= 100
    finally:
        env.close()
    plain = make_vizdoom("defend_the_center", variables=False)
    assert isinstance(plain.observation_space, gym.spaces.Box)
    assert isinstance(make_vizdoom("defend_the_center", variables=True).observation_space, gym.spaces.Dict)


def test_a_frame_skip_holds_the_action_and_sums_the_rewards_of_its_tics():
    skipping, single = make_vizdoom("basic", frame_skip=4), make_vizdoom("basic", frame_skip=1)
    try:
        skipping.reset(seed=3)
        single.reset(seed=3)
        for action in (1, 1, 2, 0):
            obs, reward, _, _, _ = skipping.step(action)
            tics = [single.step(action) for _ in range(4)]
            assert reward == sum(tic[1] for tic in tics) == -4.0  # basic: -1 a tic, nothing shot
            np.testing.assert_array_equal(obs, tics[-1][0])
    finally:
        skipping.close()
        single.close()


def test_a_seed_repeats_the_episodes_and_another_seed_starts_elsewhere():
    first, second = make_vizdoom("basic"), make_vizdoom("basic")
    try:
        frames, rewards = rollout(first, 11, 120)  # basic ends at 300 tics: past one episode's end
        again, again_rewards = rollout(second, 11, 120)
        assert rewards == again_rewards and len(frames) == len(again)
        for frame, repeat in zip(frames, again):
            np.testing.assert_array_equal(frame, repeat)
        starts = [second.reset(seed=seed)[0] for seed in (11, 12, 13)]
        assert not all(np.array_equal(starts[0], other) for other in starts[1:])  # the monster stands elsewhere
    finally:
        first.close()
        second.close()


def test_a_scenario_file_of_the_users_own_and_its_timeout_truncates(tmp_path):
    path = own_config(tmp_path, "episode_timeout = 40\navailable_buttons = { TURN_LEFT ATTACK }\n"
                                "available_game_variables = { HEALTH AMMO2 }")
    env = make_env(f"vizdoom:{path}", variables=True, width=64, height=48)
    try:
        assert env.action_space == gym.spaces.Discrete(3)
        assert env.unwrapped.action_names == ("NOOP", "TURN_LEFT", "ATTACK")
        assert env.observation_space["screen"].shape == (3, 48, 64)
        obs, _ = env.reset(seed=0)
        np.testing.assert_array_equal(obs["vars"], [100.0, 50.0])
        for step in range(1, 11):  # 40 tics, 4 a step
            before = obs
            obs, reward, terminated, truncated, info = env.step(0)
            assert (terminated, truncated) == (False, step == 10)
        np.testing.assert_array_equal(obs["screen"], before["screen"])  # no screen after the end: the frame before
        assert info["episode"]["l"] == 10 and info["episode"]["r"] == -40.0
    finally:
        env.close()


@pytest.mark.parametrize(("env_id", "kwargs", "named"), [
    ("vizdoom:basik", {}, r"unknown VizDoom scenario 'basik'.*did you mean basic\?.*health_gathering_supreme"),
    ("vizdoom:VizdoomBasic-v0", {}, "vizdoom.gymnasium_wrapper:VizdoomBasic-v0"),
    ("vizdoom:/no/such/scenario.cfg", {}, "'/no/such/scenario.cfg'.*does not exist"),
    ("vizdoom:basic", {"frameskip": 2}, "takes no frameskip.*frame_skip"),
    ("vizdoom:basic", {"width": 320}, "at most the screen_resolution, 160 x 120"),
    ("vizdoom:basic", {"screen_resolution": "RES_1X1"}, "not one of ViZDoom's ScreenResolution"),
    ("vizdoom:basic", {"resize": "bilinear"}, "resize must be one of nearest, area"),
    ("vizdoom:basic", {"variables": True, "frame_skip": 0}, "frame_skip must be at least 1"),
    ("vizdoom:my_way_home", {"variables": True}, "has no available_game_variables"),
])
def test_bad_scenarios_and_settings_name_the_problem(env_id, kwargs, named):
    for build in (lambda: env_spec(env_id, kwargs=kwargs), lambda: make_vector_env(env_id, 1, kwargs)):
        with pytest.raises(ValueError, match=named):
            build()


def test_delta_buttons_and_a_missing_map_file_are_refused_before_the_engine_starts(tmp_path):
    path = own_config(tmp_path, "available_buttons = { TURN_LEFT_RIGHT_DELTA ATTACK }")
    with pytest.raises(ValueError, match="delta buttons TURN_LEFT_RIGHT_DELTA take a number"):
        make_env(f"vizdoom:{path}")
    (tmp_path / "mine.wad").unlink()
    with pytest.raises(ValueError, match=r"doom_scenario_path .*mine\.wad does not exist"):
        env_spec(f"vizdoom:{path}")


def test_a_vector_env_steps_its_games_and_resets_them_in_the_same_step():
    vec = make_vector_env("vizdoom:basic", 2, {"frame_skip": 10})  # basic's timeout, 300 tics: 30 steps
    try:
        obs, _ = vec.reset(seed=[1, 2])
        assert obs.shape == (2, 3, 72, 128) and obs.dtype == np.uint8
        for step in range(1, 31):
            obs, reward, terminated, truncated, infos = vec.step(np.zeros(2, np.int64))
            assert not terminated.any() and truncated.all() == (step == 30)
        assert vec.episode_count == 2 and list(infos["episode"]["r"]) == [-300.0, -300.0]
        assert obs.shape == (2, 3, 72, 128) and "final_obs" in infos  # the next episodes' first frames
    finally:
        vec.close()


def test_without_vizdoom_installed_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "vizdoom", None)  # import vizdoom raises ImportError
    with pytest.raises(ValueError, match=r"VizDoom env ids need ViZDoom: pip install 'lockstep\[vizdoom\]'"):
        env_spec("vizdoom:basic")
