"""The behaviour log-prob stored at sampling time is the one training and the audit recompute.

``Policy.step`` returns an action and its log-prob; the trainer (the PPO ratio) and
``lockstep audit`` later call ``Policy.evaluate`` on the stored action. For a narrow
Gaussian far from zero the float32 action has lost most of the noise's precision, so a
log-prob computed from the noise instead of the stored action disagrees with the recomputed
one by far more than the audit's tolerance.
"""

from __future__ import annotations

import numpy as np
import torch

from lockstep.algo import noise
from lockstep.algo.normalize import ObsNormalizer
from lockstep.envs import SpaceSpec
from lockstep.learner.inference import act
from lockstep.models import ActorCritic

AUDIT_TOLERANCE = 1e-5  # lockstep audit's default --tolerance
OBS = SpaceSpec("box", (3,), "float32", low=np.full(3, -5.0, np.float32), high=np.full(3, 5.0, np.float32))
BOX = SpaceSpec("box", (2,), "float32", low=np.full(2, -1e3, np.float32), high=np.full(2, 1e3, np.float32))
DISCRETE = SpaceSpec("discrete", (), "int64", n=4)


def _sample(model, obs: torch.Tensor, uniform: torch.Tensor):
    """``Policy.step`` of a feedforward policy (its state [B, 0]): action, log-prob, value."""
    return model.step(obs, uniform, torch.zeros(len(obs), 0))[:3]


def _evaluate(model, obs: torch.Tensor, actions: torch.Tensor):
    """``Policy.evaluate`` of B independent samples, as one step of B slots: log-prob, entropy, value [B]."""
    B = len(obs)
    out = model.evaluate(obs[None], actions[None], torch.zeros(1, B, dtype=torch.bool), torch.zeros(B, 0))
    return tuple(x[0] for x in out)


def _narrow_gaussian(mean: float, log_std: float) -> ActorCritic:
    torch.manual_seed(0)
    model = ActorCritic(OBS, BOX, [16, 16])
    with torch.no_grad():
        model.actor[-1].bias.fill_(mean)  # the output layer's weights are tiny (gain 0.01): mean ~ bias
        model.log_std.fill_(log_std)
    return model.eval().requires_grad_(False)


def _batch(size: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    obs = np.random.default_rng(0).normal(size=(size, 3)).astype(np.float32)
    uniform = noise.uniform(noise.slot_keys(1, 0, size), np.arange(size), width)
    return obs, uniform


def test_narrow_gaussian_stored_logprob_is_the_recomputed_one():
    model = _narrow_gaussian(mean=100.0, log_std=-8.0)
    obs, uniform = _batch(256, model.noise_width)
    normalize = ObsNormalizer(None, None, 10.0, torch.device("cpu"))
    actions, stored, _, _ = act(model, normalize, obs, uniform, np.zeros((len(obs), 0)), torch.device("cpu"))
    assert actions.dtype == np.float32 and np.abs(actions - 100.0).max() < 0.1  # the regime of the problem
    with torch.inference_mode():
        recomputed = _evaluate(model, torch.as_tensor(obs), torch.as_tensor(actions))[0].numpy()
    assert np.abs(recomputed.astype(np.float64) - stored).max() <= AUDIT_TOLERANCE
    # on the same rows the two are the same computation, so on-policy the first PPO ratio is exactly 1
    np.testing.assert_array_equal(recomputed, stored)
    np.testing.assert_array_equal(np.exp(recomputed - stored), np.ones_like(stored))


def test_wide_gaussian_actions_still_follow_the_noise():
    """The action itself is unchanged: mean + std * z, with z from the Box-Muller transform of the noise."""
    model = _narrow_gaussian(mean=0.5, log_std=-0.5)
    obs, uniform = _batch(64, model.noise_width)
    with torch.inference_mode():
        x, u = torch.as_tensor(obs), torch.as_tensor(uniform, dtype=torch.float32)
        action, logprob, _ = _sample(model, x, u)
        mean = model.actor(x)
        u1, u2 = u[:, :2], u[:, 2:]
        z = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * np.pi * u2)
        expected = mean + model.log_std.exp() * z
        torch.testing.assert_close(action, expected, rtol=0, atol=0)
        # far from the float32 precision limit the noise's log-density and the action's agree
        from_noise = (-0.5 * z.pow(2) - model.log_std - 0.5 * np.log(2 * np.pi)).sum(-1)
        torch.testing.assert_close(logprob, from_noise, rtol=0, atol=1e-5)


def test_discrete_sampling_is_the_gumbel_max_of_the_logits():
    torch.manual_seed(0)
    model = ActorCritic(OBS, DISCRETE, [16, 16]).eval().requires_grad_(False)
    obs, uniform = _batch(128, model.noise_width)
    with torch.inference_mode():
        x, u = torch.as_tensor(obs), torch.as_tensor(uniform, dtype=torch.float32)
        action, logprob, value = _sample(model, x, u)
        logits = model.actor(x).log_softmax(-1)
        expected = (logits + -torch.log(-torch.log(u))).argmax(-1)
        assert torch.equal(action, expected)
        assert torch.equal(logprob, logits.gather(-1, expected[:, None]).squeeze(-1))
        assert torch.equal(logprob, _evaluate(model, x, action)[0])
        assert torch.equal(value, model.value_after(x, torch.zeros(len(x), 0)))
