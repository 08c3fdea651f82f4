"""The audit's tolerance is float32's rounding of a log-prob's terms, relative to their magnitude.

A Gaussian policy late in training (a small std beside large means, as Hopper's after ~1M steps) samples at
batch 1 through the numpy step, as the one-env MuJoCo presets do; the audit recomputes in torch at the
batch's width. The two round differently by more than any fixed 1e-5, and the run must still PASS; a stored
log-prob changed by 1e-3 must still FAIL.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lockstep import config as config_lib
from lockstep import sync
from lockstep.algo import noise
from lockstep.envs import SpaceSpec
from lockstep.learner.audit_trail import AuditWriter
from lockstep.learner.inference import PolicySnapshot
from lockstep.learner.rollout import Batch
from lockstep.models import ActorCritic
from lockstep.models.policy import MASKED, _categorical_magnitude
from lockstep.tools import audit

T, N = 64, 8
OBS = SpaceSpec("box", (11,), "float32", low=np.full(11, -np.inf, np.float32), high=np.full(11, np.inf, np.float32))
ACT = SpaceSpec("box", (3,), "float32", low=-np.ones(3, np.float32), high=np.ones(3, np.float32))


def _late_in_training() -> ActorCritic:
    torch.manual_seed(0)
    model = ActorCritic(OBS, ACT, [64, 64])
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
        model.log_std.copy_(torch.tensor([-2.0, -1.6, -1.3]))  # std 0.14-0.27
        model.actor[-1].bias.add_(torch.tensor([2.0, -3.0, 4.0]))  # means far from 0
    return model


def _run(tmp_path) -> tuple:
    """A run directory whose trail holds one strict batch sampled one row at a time by the numpy step."""
    config = config_lib.Config()
    config_lib.set_value(config, "env.id", "Hopper-v5")
    config_lib.set_value(config, "model.hidden", [64, 64])
    model = _late_in_training()
    snapshot = PolicySnapshot(0, model, None, None, 10.0, torch.device("cpu"), "auto")
    assert snapshot.host is not None  # the numpy step, as at inference
    obs = (np.random.default_rng(0).normal(size=(T, N, 11)) * 3).astype(np.float32)
    actions, logprobs = np.zeros((T, N, 3), np.float32), np.zeros((T, N), np.float32)
    for t in range(T):
        for n in range(N):  # one env per request: batch 1
            uniform = noise.uniform(noise.slot_keys(1, 0, N)[n:n + 1], np.array([t], np.uint64), snapshot.noise_width)
            action, logprob, _, _ = snapshot.step(obs[t, n:n + 1], uniform, np.zeros((1, 0), np.float32))
            actions[t, n], logprobs[t, n] = action[0], logprob[0]
    zeros = np.zeros((T, N), np.float32)
    batch = Batch(0, (0,), (N,), obs, actions, logprobs, zeros, zeros, zeros.astype(bool), zeros.astype(bool),
                  np.zeros((T, N), np.int64), obs[-1], np.full(N, T))
    writer = AuditWriter(tmp_path / "audit", config)
    writer.policy(0, model.state_dict(), None, None)
    writer.batch(1, 0, sync.strategy("strict"), batch)
    return tmp_path, model, obs, actions, logprobs


def test_a_gaussian_policy_late_in_training_passes_and_a_planted_change_fails(tmp_path):
    run, model, obs, actions, logprobs = _run(tmp_path)
    report = audit.check(run)
    it = report.iteration(1)
    assert it.samples == T * N and it.max_abs_diff > 1e-5  # the float32 difference a fixed 1e-5 refused
    assert report.exit_code == 0 and it.differing == 0, audit.format_report(report)

    with np.load(run / "audit" / "batch_000001.npz") as data:
        arrays = {k: data[k] for k in data.files}
    arrays["logprobs"][5, 3] += 1e-3
    np.savez_compressed(run / "audit" / "batch_000001.npz", **arrays)
    report = audit.check(run)
    assert report.exit_code == 1 and report.iteration(1).differing == 1


def test_the_magnitude_is_of_the_terms_float32_rounding_enters():
    """For one Gaussian dimension: (|a| + |mu|) |u| / sigma + u^2 / 2 + |log sigma| + 1, u = (a - mu) / sigma; for
    a Categorical twice its largest logit the mask allows."""
    model = _late_in_training()
    obs = torch.zeros(2, 11)
    with torch.no_grad():
        mean, _ = model.features(obs)
        actions = mean + model.log_std.exp() * torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0]])
        _, magnitude, _ = model.audit_step(obs, actions, torch.zeros(2, 0))
    magnitude = magnitude.detach()
    masked = torch.tensor([[3.0, MASKED, -5.0], [0.5, 0.25, MASKED]])  # a forbidden choice adds no error
    assert _categorical_magnitude(masked).tolist() == [10.0, 1.0]
    log_sigma = model.log_std.detach()
    sigma = log_sigma.exp()
    u = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0]])
    by_hand = ((actions.abs() + mean.abs()) * u.abs() / sigma + 0.5 * u * u + log_sigma.abs() + 1).sum(-1)
    assert torch.allclose(magnitude, by_hand, rtol=1e-4)
    assert float(magnitude[1]) == pytest.approx(float((log_sigma.abs() + 1).sum()), rel=1e-4)
