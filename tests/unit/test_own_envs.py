"""Users' own envs as they come: channels-last images transposed on the actor (``lockstep.envs.images``), a
factory that returns no ``gymnasium.Env`` refused with what to do, and ``module:EnvId`` named where a user looks."""

from __future__ import annotations

import logging

import gymnasium as gym
import numpy as np
import pytest

from lockstep import cli
from lockstep import config as config_lib
from lockstep.envs import env_spec, make_env, make_vector_env
from lockstep.envs.images import IMAGE_LAYOUT_KWARG, IMAGE_LAYOUTS

HERE = "test_own_envs"


class Frames(gym.Env):
    """Images of ``shape`` (uint8 unless ``dtype``) whose every pixel says where it is and when: pixel [i, j, k] of
    step t is (100 i + 10 j + k + t) mod 256, so that a transposition shows in the values; with ``extra``, a Dict
    of the image under ``frame`` and a float32 ``pos``. Episodes are truncated after ``length`` steps."""

    def __init__(self, shape=(8, 6, 3), dtype="uint8", extra: bool = False, length: int = 3) -> None:
        self.shape, self.dtype, self.extra, self.length = tuple(shape), np.dtype(dtype), extra, length
        image = gym.spaces.Box(0, 255, self.shape, self.dtype)
        self.observation_space = gym.spaces.Dict({"frame": image, "pos": gym.spaces.Box(-1, 1, (2,))}) if extra \
            else image
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def image(self, t: int) -> np.ndarray:
        i, j, k = np.indices(self.shape)
        return ((100 * i + 10 * j + k + t) % 256).astype(self.dtype)

    def _obs(self):
        if self.extra:
            return {"frame": self.image(self.t), "pos": np.full(2, 0.5, np.float32)}
        return self.image(self.t)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), 1.0, False, self.t >= self.length, {}


def frames(**kwargs) -> gym.Env:
    """Entry point ``test_own_envs:frames``."""
    return Frames(**kwargs)


def _cf(image: np.ndarray) -> np.ndarray:
    return np.transpose(image, (2, 0, 1))


def test_a_channels_last_image_reaches_the_learner_as_channels_first():
    spec = env_spec(f"{HERE}:frames")
    assert spec.observation.shape == (3, 8, 6) and spec.observation.image
    env = make_env(f"{HERE}:frames")
    assert env.observation_space.shape == (3, 8, 6)
    obs, _ = env.reset(seed=0)
    np.testing.assert_array_equal(obs, _cf(Frames().image(0)))
    assert obs.flags.c_contiguous and obs.dtype == np.uint8
    np.testing.assert_array_equal(env.step(0)[0], _cf(Frames().image(1)))


def test_the_actors_vector_env_transposes_every_observation_and_the_last_of_an_episode():
    vec = make_vector_env(f"{HERE}:frames", 2, {"length": 2})
    try:
        assert vec.single_observation_space.shape == (3, 8, 6)
        obs, _ = vec.reset(seed=[0, 1])
        np.testing.assert_array_equal(obs, np.stack([_cf(Frames().image(0))] * 2))
        vec.step(np.array([0, 1]))
        obs, _, _, truncated, infos = vec.step(np.array([0, 1]))
        assert truncated.all()
        np.testing.assert_array_equal(infos["final_obs"][1], _cf(Frames().image(2)))  # bootstraps the truncation
        np.testing.assert_array_equal(obs[0], _cf(Frames().image(0)))  # the next episode's first
    finally:
        vec.close()


def test_an_image_leaf_of_a_dict_is_transposed_and_the_other_leaves_kept():
    spec = env_spec(f"{HERE}:frames", kwargs={"extra": True, "shape": [9, 7, 4]})
    leaves = dict(spec.observation.leaves)
    assert leaves["frame"].shape == (4, 9, 7) and leaves["frame"].image and leaves["pos"].shape == (2,)
    obs, _ = make_env(f"{HERE}:frames", extra=True, shape=[9, 7, 4]).reset(seed=0)
    np.testing.assert_array_equal(obs["frame"], _cf(Frames((9, 7, 4)).image(0)))
    np.testing.assert_array_equal(obs["pos"], [0.5, 0.5])


@pytest.mark.parametrize("shape, dtype", [
    ((4, 8, 8), "uint8"),  # channels first already (a frame stack)
    ((3, 3, 3), "uint8"),  # no axis smaller than the others
    ((8, 8, 5), "uint8"),  # 5 channels is no image format
    ((8, 2, 1), "uint8"),  # 8 x 2 is too small to be an image
    ((8, 6, 3), "float32"),  # images are uint8
])
def test_shapes_that_are_not_clearly_channels_last_stay_as_they_are(shape, dtype):
    spec = env_spec(f"{HERE}:frames", kwargs={"shape": list(shape), "dtype": dtype})
    assert spec.observation.shape == shape
    obs, _ = make_env(f"{HERE}:frames", shape=list(shape), dtype=dtype).reset(seed=0)
    np.testing.assert_array_equal(obs, Frames(shape, dtype).image(0))


def test_each_agent_of_a_pettingzoo_parallel_env_sends_its_channels_last_images_channels_first():
    pytest.importorskip("pettingzoo")
    from lockstep.envs.generated import GeneratedParallel

    described = {"observation": {"box": [6, 5, 3], "dtype": "uint8"}, "action": {"discrete": 2}, "agents": 2}
    spec = env_spec("pettingzoo:lockstep.envs.generated", kwargs=described)
    assert dict(spec.observation.leaves)["observation"].shape == (3, 6, 5)
    slots = make_vector_env("pettingzoo:lockstep.envs.generated", 1, described)
    try:
        obs, _ = slots.reset(seed=[4, 4])
        raw, _ = GeneratedParallel(**described).reset(seed=4)
        for i, agent in enumerate(("agent_0", "agent_1")):
            np.testing.assert_array_equal(obs["observation"][i], _cf(raw[agent]))
    finally:
        slots.close()
    kept = {**described, IMAGE_LAYOUT_KWARG: "channels_first"}
    as_given = env_spec("pettingzoo:lockstep.envs.generated", kwargs=kept)
    assert dict(as_given.observation.leaves)["observation"].shape == (6, 5, 3)


def test_env_image_layout_overrides_the_guess():
    as_given = {IMAGE_LAYOUT_KWARG: "channels_first"}
    assert env_spec(f"{HERE}:frames", kwargs=as_given).observation.shape == (8, 6, 3)
    np.testing.assert_array_equal(make_env(f"{HERE}:frames", **as_given).reset(seed=0)[0], Frames().image(0))
    forced = {IMAGE_LAYOUT_KWARG: "channels_last", "shape": [8, 8, 5]}  # which auto leaves alone
    assert env_spec(f"{HERE}:frames", kwargs=forced).observation.shape == (5, 8, 8)
    obs, _ = make_env(f"{HERE}:frames", **forced).reset(seed=0)
    np.testing.assert_array_equal(obs, _cf(Frames((8, 8, 5)).image(0)))
    with pytest.raises(ValueError, match="env.image_layout channels_last is for the images of Gymnasium ids"):
        env_spec("masked:CartPole-v1", kwargs={IMAGE_LAYOUT_KWARG: "channels_last"})


def test_the_decision_is_logged_once_for_all_the_envs_of_a_process(caplog):
    with caplog.at_level(logging.INFO, logger="lockstep.envs"):
        env_spec(f"{HERE}:frames", kwargs={"shape": [11, 10, 1]})
        make_vector_env(f"{HERE}:frames", 3, {"shape": [11, 10, 1]}).close()
    told = [r.getMessage() for r in caplog.records if "(11, 10, 1)" in r.getMessage()]
    assert told == ["observation (11, 10, 1) uint8 is channels-last (H, W, C): the actors send it as [1, 11, 10] "
                    "(env.image_layout auto; channels_first keeps it as it is)"]


def test_the_setting_reaches_the_actors_and_lockstep_actor():
    assert config_lib.setting_of("env.image_layout").choices == IMAGE_LAYOUTS
    config = config_lib.Config()
    assert IMAGE_LAYOUT_KWARG not in config.vector_kwargs()  # auto: the envs decide
    config_lib.set_value(config, "env.image_layout", "channels_first")
    assert config.vector_kwargs()[IMAGE_LAYOUT_KWARG] == "channels_first"
    args = cli.build_parser().parse_args(["actor", "--learner", "127.0.0.1:1", "--env", f"{HERE}:frames",
                                          "--image-layout", "channels_last"])
    assert cli.actor_options(args).env_kwargs == {IMAGE_LAYOUT_KWARG: "channels_last"}


class OldSpace:
    """A space of the old gym package: no gymnasium.spaces.Space."""

    n = 2


class OldGymEnv:
    """An env of the old gym API (gym 0.21): reset() gives the observation alone, step four values."""

    observation_space = OldSpace()
    action_space = OldSpace()

    def reset(self):
        return 0

    def step(self, action):
        return 0, 0.0, False, {}


def old_gym_env(**kwargs) -> OldGymEnv:
    """Entry point ``test_own_envs:old_gym_env``."""
    return OldGymEnv()


def test_a_factory_of_an_old_gym_env_is_refused_with_what_to_do(capsys):
    assert cli.main(["train", "--no-progress", "--env", f"{HERE}:old_gym_env"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{HERE}:old_gym_env made a OldGymEnv (module {HERE}), which is not a gymnasium.Env" in err
    assert "shimmy.GymV26CompatibilityV0(env=env)" in err and "shimmy.GymV21CompatibilityV0(env=env)" in err
    assert "returns (obs, reward, terminated, truncated, info)" in err
    for build in (make_env, lambda env_id: make_vector_env(env_id, 2)):
        with pytest.raises(ValueError, match="which is not a gymnasium.Env"):
            build(f"{HERE}:old_gym_env")


def test_an_unknown_id_names_the_form_of_a_package_that_registers_its_ids(capsys, tmp_path, monkeypatch):
    assert "module:EnvId" in config_lib.setting_of("env.id").help
    assert cli.main(["train", "--no-progress", "--env", "Nonesuch-v0"]) == 2
    assert "module:EnvId (the module registers EnvId when imported" in capsys.readouterr().err
    assert cli.main(["train", "--no-progress", "--env", "no_such_package_here:Nonesuch-v0"]) == 2
    err = capsys.readouterr().err
    assert "cannot import module 'no_such_package_here'" in err and "Traceback" not in err
    (tmp_path / "own_registry.py").write_text(
        "import gymnasium as gym\n"
        "gym.register('LockstepOwnRegistry-v0', entry_point='gymnasium.envs.classic_control:CartPoleEnv')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert env_spec("own_registry:LockstepOwnRegistry-v0").observation.shape == (4,)
