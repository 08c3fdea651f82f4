"""On a GPU ``act`` moves its inputs in one copy from pinned memory and its outputs in one copy back. The
packing is the same code on the CPU (without pinning): it must give the bytes of a copy per array."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lockstep.algo.normalize import ObsNormalizer
from lockstep.config import ModelConfig
from lockstep.envs import SpaceSpec
from lockstep.learner import inference
from lockstep.models import build_policy

CPU = torch.device("cpu")
DISCRETE = SpaceSpec("discrete", (), "int64", n=4)
BOX = SpaceSpec("box", (3,), "float32", low=-np.ones(3, np.float32), high=np.ones(3, np.float32))
CASES = {  # name -> (observation shape, dtype, action, LSTM size)
    "mlp-float64-box": ((11,), np.float64, BOX, 0),
    "cnn-uint8": ((4, 36, 36), np.uint8, DISCRETE, 0),
    "lstm": ((5,), np.float32, DISCRETE, 8),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_copy_each_way_gives_the_bytes_of_a_copy_per_array(name):
    shape, dtype, action, lstm = CASES[name]
    low, high = (0, 255) if dtype == np.uint8 else (-np.inf, np.inf)
    space = SpaceSpec("box", shape, np.dtype(dtype).name, low=np.full(shape, low, dtype),
                      high=np.full(shape, high, dtype))
    torch.manual_seed(0)
    model = build_policy(space, action, ModelConfig(hidden=[8], lstm_size=lstm)).eval()
    normalize = ObsNormalizer(None, None, 5.0, CPU)
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256, (3, *shape)).astype(dtype) if dtype == np.uint8 else rng.standard_normal((3, *shape))
    obs = obs.astype(dtype)
    uniform = rng.uniform(size=(3, model.noise_width))  # float64, as the noise streams make it
    state = rng.standard_normal((3, model.state_size)).astype(np.float32)
    with torch.inference_mode():
        x, u, h = inference._to_device((obs, uniform.astype(np.float32), state), CPU, pin=False)
        assert x.dtype == torch.from_numpy(obs).dtype and np.array_equal(x.numpy(), obs)
        staged = inference._to_host(model.step(normalize(x), inference._noise(u), h), pin=False)
    plain = inference.act(model, normalize, obs, uniform, state, CPU)
    assert len(staged) == len(plain) == 4
    for a, b in zip(staged, plain):
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
