"""``tools.export.ExportedPolicy`` in process: the module that ``lockstep export`` traces computes, from the env's
observation, the action ``lockstep eval`` hands the env (``episodes.slots_act``), with normalization statistics
that clip and a mask that forbids; the files themselves are tested in tests/integration/test_export.py."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from lockstep.algo.normalize import ObsNormalizer
from lockstep.config import ModelConfig
from lockstep.envs import SpaceSpec, action_spec, with_action_mask
from lockstep.learner.episodes import slots_act
from lockstep.models import build_policy
from lockstep.tools.export import ExportedPolicy

OBSERVATION = gym.spaces.Dict({
    "v": gym.spaces.Box(-5, 5, (3,), np.float32), "cell": gym.spaces.Discrete(3),
    "mask": gym.spaces.MultiBinary(4 + 2 * 2)})
ACTION = gym.spaces.Dict({"go": gym.spaces.Discrete(4), "bits": gym.spaces.MultiBinary(2),
                          "dial": gym.spaces.Box(-0.01, 0.01, (2,), np.float32)})


def _policy(seed: int = 0):
    torch.manual_seed(seed)
    act = action_spec(ACTION)
    obs = with_action_mask(SpaceSpec.from_space(OBSERVATION), act, "mask")
    model = build_policy(obs, act, ModelConfig(hidden=[16])).eval().requires_grad_(False)
    # statistics that move every value and clip some: |(v - 1) * 4| > 0.5 for most draws
    normalize = ObsNormalizer({"v": np.ones(3)}, {"v": np.full(3, 1 / 16)}, 0.5, torch.device("cpu"))
    return model, normalize, obs, act


def _observations(n: int, seed: int) -> np.ndarray:
    OBSERVATION.seed(seed)
    records = np.empty(n, SpaceSpec.from_space(OBSERVATION).array_dtype)
    for i in range(n):
        drawn = OBSERVATION.sample()
        # the action's order (a Dict's keys sorted): 2 choices per bit of bits, then go's 4; one of each allowed
        drawn["mask"][[0, 2, 4]] = 1
        for key in ("v", "cell", "mask"):
            records[i][key] = drawn[key]
    return records


@pytest.mark.parametrize("sample", [False, True])
def test_the_exported_module_acts_as_eval_on_dict_observations_with_a_mask(sample):
    model, normalize, obs, act = _policy()
    records = _observations(32, seed=4)
    expected = slots_act(model, normalize, (obs, act), not sample, 7, torch.device("cpu"), len(records))(records)
    module = ExportedPolicy(model, normalize, obs, act, sample=sample)
    inputs = [torch.as_tensor(records[path].copy()) for path in obs.paths()]
    if sample:  # the noise ``slots_act`` drew at its first step, as float32
        from lockstep.algo import noise

        keys = noise.slot_keys(7, 0, len(records))
        inputs.append(torch.as_tensor(noise.uniform(keys, np.zeros(len(records), np.uint64),
                                                    model.noise_width).astype(np.float32)))
    got = dict(zip([name for name, _, _ in module.outputs()], module(*inputs)))
    assert np.array_equal(got["action.go"].numpy(), expected["go"])
    assert np.array_equal(got["action.bits"].numpy(), expected["bits"]) and got["action.bits"].dtype == torch.int8
    assert np.array_equal(got["action.dial"].numpy(), expected["dial"])  # clipped to +-0.01, as the actor clips
    assert np.abs(expected["dial"]).max() <= np.float32(0.01)
    forbidden = records["mask"][:, 4:] == 0  # go's choices
    assert forbidden.any()
    assert not forbidden[np.arange(len(records)), got["action.go"].numpy()].any()
