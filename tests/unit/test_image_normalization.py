"""``env.normalize_images``: a flat uint8 image observation normalized per pixel by running moments (Sample
Factory's ``normalize_input``), the CNN then taking the normalized values instead of the bytes / 255.

Checked here: the setting needs ``env.normalize_obs`` and a flat image (a Dict's image leaves are refused by
name); the trainer keeps per-pixel moments of the frames it trains on and hands them to every policy version; the
network built for the run (the trainer's, and ``load_policy``'s for eval, export and the audit) does not scale the
normalized pixels again; the moments of a batch of frames are those of its evenly spaced sample.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from lockstep.algo.normalize import FRAME_SAMPLE, RunningMeanStd
from lockstep.config import Config, ConfigError
from lockstep.envs import EnvSpec, SpaceSpec
from lockstep.envs.spaces import action_spec
from lockstep.learner.trainer import Trainer
from lockstep.models.load import load_policy

FRAMES = SpaceSpec.from_space(gym.spaces.Box(0, 255, (3, 36, 40), np.uint8))
ACTION = action_spec(gym.spaces.Discrete(3))


def _config(images: bool) -> Config:
    config = Config()
    config.model.kind = "nature-cnn"
    config.env.normalize_obs = images
    config.env.normalize_images = images
    return config


def _frames(n: int, seed: int = 0) -> np.ndarray:
    """Frames whose background is fixed and one patch changes: what a Doom room with a monster looks like."""
    rng = np.random.default_rng(seed)
    frames = np.full((n, *FRAMES.shape), 90, np.uint8)
    frames[:, :, 10:16, 12:20] = rng.integers(0, 256, (n, 3, 6, 8), dtype=np.uint8)
    return frames


def test_frames_reach_the_cnn_standardized_per_pixel_with_no_second_scaling():
    trainer = Trainer(_config(True), EnvSpec("frames", FRAMES, ACTION), torch.device("cpu"))
    assert trainer.model.torso[0].factor == 1.0  # the Scale before the first convolution: none
    frames = _frames(64)
    trainer._update_obs_rms(frames)
    assert trainer.obs_rms.mean.shape == FRAMES.shape
    normalized = trainer.snapshot().normalize(torch.as_tensor(frames))  # what inference hands the CNN
    want = np.clip((frames - trainer.obs_rms.mean) / np.sqrt(trainer.obs_rms.var + 1e-8), -10, 10)
    np.testing.assert_allclose(normalized.numpy(), want, rtol=1e-5, atol=1e-4)
    # the fixed background is ~0 whatever its brightness; the changing patch carries the signal
    assert np.abs(normalized.numpy()[:, :, :5]).max() < 1e-2
    assert normalized.numpy()[:, :, 10:16, 12:20].std() == pytest.approx(1.0, abs=0.05)
    # without it: no moments, and the CNN scales the bytes into [0, 1]
    plain = Trainer(_config(False), EnvSpec("frames", FRAMES, ACTION), torch.device("cpu"))
    assert plain.obs_rms is None and plain.model.torso[0].factor == pytest.approx(1 / 255)


def test_a_stored_policy_is_rebuilt_with_its_run_s_normalized_input():
    """eval, export and the audit rebuild the network from the run's config: the same layers, no scaling."""
    config = _config(True)
    trainer = Trainer(config, EnvSpec("frames", FRAMES, ACTION), torch.device("cpu"))
    trainer._update_obs_rms(_frames(16))
    model, normalize = load_policy(config, FRAMES, ACTION, trainer.model.state_dict(), trainer.obs_rms.mean,
                                   trainer.obs_rms.var, torch.device("cpu"), "test")
    assert model.torso[0].factor == 1.0
    frames = torch.as_tensor(_frames(4, seed=1))
    with torch.no_grad():
        ours = trainer.model.features(trainer.normalizer()(frames))[0]
        theirs = model.features(normalize(frames))[0]
    torch.testing.assert_close(ours, theirs)


def test_the_moments_of_a_batch_of_frames_are_those_of_its_evenly_spaced_sample():
    frames = _frames(4 * FRAME_SAMPLE, seed=2)
    sampled, exact = RunningMeanStd(FRAMES.shape), RunningMeanStd(FRAMES.shape)
    sampled.update(frames)
    exact.update(frames[::4].astype(np.float64))
    np.testing.assert_allclose(sampled.mean, exact.mean, rtol=1e-6)
    np.testing.assert_allclose(sampled.var, exact.var, rtol=1e-5, atol=1e-6)
    assert sampled.count == exact.count


def test_it_needs_normalize_obs_and_a_flat_image():
    config = _config(True)
    config.env.normalize_obs = False
    with pytest.raises(ConfigError, match="env.normalize_images .* set env.normalize_obs true"):
        config.validate()
    tree = SpaceSpec.from_space(gym.spaces.Dict({"screen": gym.spaces.Box(0, 255, (3, 36, 40), np.uint8),
                                                 "health": gym.spaces.Box(0, 100, (1,), np.float32)}))
    config = _config(True)
    config.model.kind = "auto"
    with pytest.raises(ConfigError, match="env.normalize_images normalizes a flat image observation"):
        Trainer(config, EnvSpec("tree", tree, ACTION), torch.device("cpu"))
