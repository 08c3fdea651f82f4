"""``learner.update_precision: bfloat16``: the convolutional torso computes in bfloat16 in the update's passes,
which record gradients, and in float32 in every other (inference, the recomputed values, the audit, export).

Checked here: the torso's features and its parameters' gradients are float32 and near float32's, computed another
way (so the bfloat16 path ran); without gradients the numbers are float32's bit for bit; the trainer gives the
setting to every CNN of its policy (a Dict observation's image leaf's too), serves policy versions whose inference
is float32's, and trains; ``auto`` is bfloat16 where the device computes it natively; a policy without a CNN, or
a CPU without native bfloat16, is said in the log.
"""

from __future__ import annotations

import logging

import gymnasium as gym
import numpy as np
import pytest
import torch
from lockstep_bench.profile_update import synthetic_batch

from lockstep.config import Config, ConfigError, apply_sets
from lockstep.envs import EnvSpec, SpaceSpec
from lockstep.envs.spaces import action_spec
from lockstep.learner import trainer as trainer_lib
from lockstep.learner.trainer import Trainer
from lockstep.models.networks import CNN, nature_cnn

FRAMES = SpaceSpec.from_space(gym.spaces.Box(0, 255, (3, 36, 40), np.uint8))
ACTION = action_spec(gym.spaces.Discrete(3))


def _trainer(precision: str, observation: SpaceSpec = FRAMES, kind: str = "nature-cnn") -> Trainer:
    config = Config()
    config.model.kind = kind
    config.ppo.steps_per_env, config.ppo.minibatches = 8, 2
    config.learner.update_precision = precision
    return Trainer(config, EnvSpec("frames", observation, ACTION), torch.device("cpu"))


def test_the_torso_computes_in_bfloat16_only_where_gradients_are_recorded():
    torch.manual_seed(0)
    torso, _ = nature_cnn(3, (36, 40))
    frames = torch.randint(0, 256, (16, 3, 36, 40), dtype=torch.uint8)
    with torch.no_grad():
        full = torso(frames)
    full_grads = torch.autograd.grad(torso(frames).square().sum(), list(torso.parameters()))
    torso.update_dtype = torch.bfloat16
    with torch.no_grad():
        assert torch.equal(torso(frames), full)  # without gradients: float32, bit for bit
    lower = torso(frames)
    assert lower.dtype == torch.float32 and lower.requires_grad
    assert not torch.equal(lower.detach(), full)  # computed another way ...
    torch.testing.assert_close(lower.detach(), full, rtol=0.05, atol=0.05)  # ... to about bfloat16's precision
    grads = torch.autograd.grad(lower.square().sum(), list(torso.parameters()))
    for grad, want in zip(grads, full_grads, strict=True):
        assert grad.dtype == torch.float32
        assert torch.nn.functional.cosine_similarity(grad.flatten(), want.flatten(), dim=0) > 0.99


def test_the_trainer_lowers_every_cnn_serves_float32_inference_and_trains():
    lower, full = _trainer("bfloat16"), _trainer("float32")  # the same seed: the same initial parameters
    torsos = [m for m in lower.model.modules() if isinstance(m, CNN)]
    assert torsos and all(m.update_dtype is torch.bfloat16 for m in torsos)
    assert all(m.update_dtype is None for m in full.model.modules() if isinstance(m, CNN))
    rng = np.random.default_rng(1)
    obs = rng.integers(0, 256, (4, *FRAMES.shape), dtype=np.uint8)
    uniform = rng.uniform(0.01, 0.99, (4, lower.model.noise_width)).astype(np.float32)
    state = np.zeros((4, 0), np.float32)
    served = [t.snapshot().step(obs, uniform, state) for t in (lower, full)]
    for a, b in zip(served[0], served[1], strict=True):  # what actors are given: float32's, bit for bit
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    batch = synthetic_batch(FRAMES.shape, 3, 8, 4, 0, episode=5)
    before = [p.detach().clone() for p in lower.model.parameters()]
    stats = lower.train(batch)
    assert lower.version == 1 and np.isfinite(stats.update.policy_loss)
    moved = [not torch.equal(b, p) for b, p in zip(before, lower.model.parameters(), strict=True)]
    assert all(moved)
    assert all(p.dtype == torch.float32 for p in lower.model.parameters())


def test_an_image_leaf_of_a_dict_observation_is_lowered_too():
    tree = SpaceSpec.from_space(gym.spaces.Dict({"frame": gym.spaces.Box(0, 255, (3, 36, 40), np.uint8),
                                                 "v": gym.spaces.Box(-1, 1, (2,), np.float32)}))
    trainer = _trainer("bfloat16", tree, kind="auto")
    assert [m.update_dtype for m in trainer.model.modules() if isinstance(m, CNN)] == [torch.bfloat16]


def test_a_policy_without_a_cnn_or_a_cpu_without_bfloat16_is_said_in_the_log(caplog, monkeypatch):
    vector = SpaceSpec.from_space(gym.spaces.Box(-1, 1, (4,), np.float32))
    with caplog.at_level(logging.WARNING, logger=trainer_lib.__name__):
        assert _trainer("bfloat16", vector, kind="auto").update_precision == "float32"
    assert "the policy has no convolutional torso; its update is float32" in caplog.text
    caplog.clear()
    monkeypatch.setattr(trainer_lib, "_native_bfloat16", lambda device: False)  # what this CPU may not show
    with caplog.at_level(logging.WARNING, logger=trainer_lib.__name__):
        assert _trainer("bfloat16").update_precision == "bfloat16"
    assert "this CPU has no native bfloat16" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=trainer_lib.__name__):
        _trainer("float32")
    assert caplog.text == ""


@pytest.mark.parametrize("native", [True, False])
def test_auto_is_bfloat16_where_the_device_computes_it_natively(native, monkeypatch, caplog):
    monkeypatch.setattr(trainer_lib, "_native_bfloat16", lambda device: native)
    with caplog.at_level(logging.INFO, logger=trainer_lib.__name__):
        trainer = _trainer("auto")
    want = "bfloat16" if native else "float32"
    assert trainer.update_precision == want
    dtypes = {m.update_dtype for m in trainer.model.modules() if isinstance(m, CNN)}
    assert dtypes == ({torch.bfloat16} if native else {None})
    assert f"learner.update_precision auto: the CNN's update in {want}" in caplog.text
    vector = SpaceSpec.from_space(gym.spaces.Box(-1, 1, (4,), np.float32))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=trainer_lib.__name__):  # no CNN: float32, and nothing to say
        assert _trainer("auto", vector, kind="auto").update_precision == "float32"
    assert caplog.text == ""


def test_a_precision_other_than_its_two_is_refused_by_name():
    config = Config()
    apply_sets(config, ["learner.update_precision=bfloat16"])
    assert config.learner.update_precision == "bfloat16"
    with pytest.raises(ConfigError, match="update_precision must be one of float32, bfloat16, auto, got 'float16'"):
        apply_sets(config, ["learner.update_precision=float16"])
