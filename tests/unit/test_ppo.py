"""PPO math (GAE, clipped loss, update) and the actor-critic's sampling, checked against hand arithmetic."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lockstep.algo import noise, ppo
from lockstep.algo.ppo import Settings, gae, ppo_loss, update
from lockstep.envs import SpaceSpec
from lockstep.models import ActorCritic

GAMMA, LAM = 0.9, 0.8

OBS_SPACE = SpaceSpec("box", (4,), "float32", low=np.full(4, -np.inf, np.float32), high=np.full(4, np.inf, np.float32))
DISCRETE2 = SpaceSpec("discrete", (), "int64", n=2)
BOX2 = SpaceSpec("box", (2,), "float32", low=np.full(2, -1.0, np.float32), high=np.full(2, 1.0, np.float32))


def t64(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


# ---------------------------------------------------------------------------------------------
# GAE
# ---------------------------------------------------------------------------------------------
# T=3 steps, N=2 slots.
# slot 0: one episode running through all three steps; the last step bootstraps from V(next obs)=4.0.
# slot 1: terminated at t=0 (next value 0), truncated at t=1 (next value = V(final obs) = 5.0),
#         then a fresh episode whose last step bootstraps from V(next obs) = 2.5.
REWARDS = [[1.0, 2.0], [0.5, -1.0], [2.0, 1.0]]
VALUES = [[0.5, 1.0], [1.5, 2.0], [1.0, 3.0]]
NEXT_VALUES = [[1.5, 0.0], [1.0, 5.0], [4.0, 2.5]]
CONTINUES = [[1.0, 0.0], [1.0, 0.0], [1.0, 1.0]]

# slot 0, by hand (gamma*lam = 0.72)
A0_2 = 2.0 + 0.9 * 4.0 - 1.0  # 4.6
A0_1 = (0.5 + 0.9 * 1.0 - 1.5) + 0.72 * A0_2  # -0.1 + 3.312 = 3.212
A0_0 = (1.0 + 0.9 * 1.5 - 0.5) + 0.72 * A0_1  # 1.85 + 2.31264 = 4.16264
# slot 1, by hand: the trace is cut after t=0 and after t=1
A1_2 = 1.0 + 0.9 * 2.5 - 3.0  # 0.25
A1_1 = -1.0 + 0.9 * 5.0 - 2.0  # 1.5: truncation bootstraps from the final observation's value
A1_0 = 2.0 + 0.9 * 0.0 - 1.0  # 1.0: termination has no future value
EXPECTED_ADV = [[A0_0, A1_0], [A0_1, A1_1], [A0_2, A1_2]]


def _gae(rewards=REWARDS, values=VALUES, next_values=NEXT_VALUES, continues=CONTINUES):
    return gae(t64(rewards), t64(values), t64(next_values), t64(continues), GAMMA, LAM)


def test_gae_hand_computed_constants_are_what_the_comments_say():
    """Guards the hand arithmetic above against typos."""
    assert [A0_0, A0_1, A0_2] == pytest.approx([4.16264, 3.212, 4.6])
    assert [A1_0, A1_1, A1_2] == pytest.approx([1.0, 1.5, 0.25])


def test_gae_matches_hand_computed_advantages():
    advantages, _ = _gae()
    assert advantages.shape == (3, 2)
    torch.testing.assert_close(advantages, t64(EXPECTED_ADV))


def test_gae_returns_are_advantages_plus_values():
    _, returns = _gae()
    expected = [[4.16264 + 0.5, 1.0 + 1.0], [3.212 + 1.5, 1.5 + 2.0], [4.6 + 1.0, 0.25 + 3.0]]
    torch.testing.assert_close(returns, t64(expected))


def test_gae_last_step_bootstraps_from_next_observation_value():
    """Raising V(next obs) of the last step by 1 raises A_T-1 by gamma and earlier steps by their trace weight."""
    bumped = [row[:] for row in NEXT_VALUES]
    bumped[2][0] += 1.0
    base, _ = _gae()
    moved, _ = _gae(next_values=bumped)
    torch.testing.assert_close(moved[:, 0] - base[:, 0], t64([0.9 * 0.72**2, 0.9 * 0.72, 0.9]))
    torch.testing.assert_close(moved[:, 1], base[:, 1])


def test_gae_truncated_episode_bootstraps_from_final_observation_value():
    bumped = [row[:] for row in NEXT_VALUES]
    bumped[1][1] += 2.0  # V(final obs) of the truncated episode
    base, _ = _gae()
    moved, _ = _gae(next_values=bumped)
    # only the truncated step moves (by gamma * 2); t=0 belongs to an earlier, terminated episode
    torch.testing.assert_close(moved[:, 1] - base[:, 1], t64([0.0, 0.9 * 2.0, 0.0]))


def test_gae_trace_is_cut_where_an_episode_ends():
    """Rewards after an episode end do not leak into the ended episode's advantages."""
    changed = [row[:] for row in REWARDS]
    changed[2][1] += 10.0
    changed[1][1] += 10.0
    base, _ = _gae()
    moved, _ = _gae(rewards=changed)
    assert moved[0, 1] == base[0, 1]
    assert moved[1, 1] - base[1, 1] == pytest.approx(10.0)
    assert moved[2, 1] - base[2, 1] == pytest.approx(10.0)


def test_gae_with_lambda_one_and_no_ends_is_discounted_return_minus_value():
    rewards = t64([[1.0], [2.0], [3.0]])
    values = t64([[0.5], [0.25], [2.0]])
    next_values = t64([[0.25], [2.0], [10.0]])
    advantages, returns = gae(rewards, values, next_values, torch.ones(3, 1, dtype=torch.float64), 0.5, 1.0)
    # G_0 = 1 + .5*2 + .25*3 + .125*10 = 4.0
    torch.testing.assert_close(returns[:, 0], t64([4.0, 2.0 + 0.5 * 3.0 + 0.25 * 10.0, 3.0 + 0.5 * 10.0]))
    torch.testing.assert_close(advantages[:, 0], t64([4.0 - 0.5, 6.0 - 0.25, 8.0 - 2.0]))


# ---------------------------------------------------------------------------------------------
# ppo_loss
# ---------------------------------------------------------------------------------------------
# B=4, clip 0.2.
#   s0: ratio 1.5, A=+2 -> max(-3.0, -2.4)  = -2.4 (clip active)
#   s1: ratio 0.9, A=+1 -> max(-0.9, -0.9)  = -0.9 (inside the clip range)
#   s2: ratio 1.5, A=-1 -> max( 1.5,  1.2)  =  1.5 (outside, but the unclipped term is pessimistic)
#   s3: ratio 0.5, A=-1 -> max( 0.5,  0.8)  =  0.8 (clip active)
RATIOS = [1.5, 0.9, 1.5, 0.5]
OLD_LOGPROB = [-1.0, -0.5, -2.0, -0.7]
ADVANTAGES = [2.0, 1.0, -1.0, -1.0]
PG_LOSS = (-2.4 - 0.9 + 1.5 + 0.8) / 4  # -0.25
# values: old, new, returns
#   s0: 1.0 -> 1.5, R=2.0: unclipped 0.25, clipped value 1.2 -> 0.64 ; max 0.64
#   s1: 0.0 -> 1.0, R=0.5: unclipped 0.25, clipped value 0.2 -> 0.09 ; max 0.25
#   s2: 2.0 -> 1.0, R=0.0: unclipped 1.00, clipped value 1.8 -> 3.24 ; max 3.24
#   s3: -1.0 -> -1.1, R=0.0: unclipped 1.21, clipped value -1.1 -> 1.21 ; max 1.21
OLD_VALUE = [1.0, 0.0, 2.0, -1.0]
NEW_VALUE = [1.5, 1.0, 1.0, -1.1]
RETURNS = [2.0, 0.5, 0.0, 0.0]
V_LOSS_CLIPPED = 0.5 * (0.64 + 0.25 + 3.24 + 1.21) / 4  # 0.6675
V_LOSS_PLAIN = 0.5 * (0.25 + 0.25 + 1.00 + 1.21) / 4  # 0.33875
ENTROPY = [0.6, 0.7, 0.5, 0.2]  # mean 0.5


def _settings(**changes) -> Settings:
    """CleanRL's settings (``config.PPOConfig``'s defaults), with ``changes``."""
    fields = dict(epochs=4, minibatches=4, clip_coef=0.2, clip_vloss=True, vf_coef=0.5, ent_coef=0.01,
                  max_grad_norm=0.5, norm_adv=True, target_kl=None)
    return Settings(**{**fields, **changes})


def _loss(clip_vloss=True, norm_adv=False, ent_coef=0.01, vf_coef=0.5, advantages=ADVANTAGES, ratios=RATIOS):
    old = t64(OLD_LOGPROB)
    new = old + t64([math.log(r) for r in ratios])
    return ppo_loss(new, old, t64(advantages), t64(NEW_VALUE), t64(OLD_VALUE), t64(RETURNS), t64(ENTROPY),
                    _settings(clip_vloss=clip_vloss, vf_coef=vf_coef, ent_coef=ent_coef, norm_adv=norm_adv))


def test_ppo_policy_loss_clips_only_where_it_is_pessimistic():
    assert PG_LOSS == pytest.approx(-0.25)
    assert _loss().policy_loss.item() == pytest.approx(-0.25)


@pytest.mark.parametrize("index, expected", [(0, -2.4), (1, -0.9), (2, 1.5), (3, 0.8)])
def test_ppo_policy_loss_per_sample(index, expected):
    """Each sample alone gives the hand-computed min(r A, clip(r) A), negated."""
    old = t64([OLD_LOGPROB[index]])
    new = old + math.log(RATIOS[index])
    parts = ppo_loss(new, old, t64([ADVANTAGES[index]]), t64([0.0]), t64([0.0]), t64([0.0]), t64([0.0]),
                     _settings(clip_vloss=False, ent_coef=0.0, norm_adv=False))
    assert parts.policy_loss.item() == pytest.approx(expected)


def test_ppo_clipped_value_loss_takes_the_larger_error():
    assert V_LOSS_CLIPPED == pytest.approx(0.6675)
    assert _loss(clip_vloss=True).value_loss.item() == pytest.approx(0.6675)


def test_ppo_unclipped_value_loss_is_half_mean_squared_error():
    assert V_LOSS_PLAIN == pytest.approx(0.33875)
    assert _loss(clip_vloss=False).value_loss.item() == pytest.approx(0.33875)


def test_ppo_entropy_is_the_mean_entropy():
    assert _loss().entropy.item() == pytest.approx(0.5)


def test_ppo_total_loss_combines_policy_entropy_and_value_terms():
    # pg - ent_coef * entropy + vf_coef * v_loss
    assert _loss(ent_coef=0.01, vf_coef=0.5).loss.item() == pytest.approx(-0.25 - 0.01 * 0.5 + 0.5 * 0.6675)
    assert _loss(ent_coef=0.1, vf_coef=2.0, clip_vloss=False).loss.item() == pytest.approx(
        -0.25 - 0.1 * 0.5 + 2.0 * 0.33875)


def test_ppo_diagnostics_approx_kl_and_clip_fraction():
    parts = _loss()
    # k3 estimator: mean((r - 1) - log r)
    kl = ((0.5 - math.log(1.5)) + (-0.1 - math.log(0.9)) + (0.5 - math.log(1.5)) + (-0.5 - math.log(0.5))) / 4
    assert parts.approx_kl.item() == pytest.approx(kl)
    assert parts.clip_fraction.item() == pytest.approx(3 / 4)  # |r - 1| > 0.2 for s0, s2, s3
    assert not parts.approx_kl.requires_grad


def test_ppo_loss_gradient_flows_to_new_logprob_and_new_value_only_where_unclipped():
    old = t64(OLD_LOGPROB)
    new = (old + t64([math.log(r) for r in RATIOS])).requires_grad_()
    new_value = t64(NEW_VALUE).requires_grad_()
    parts = ppo_loss(new, old, t64(ADVANTAGES), new_value, t64(OLD_VALUE), t64(RETURNS), t64(ENTROPY),
                     _settings(norm_adv=False))
    parts.loss.backward()
    # d/dnew of mean(-A r) is -A r / B where the unclipped term is chosen, 0 where the clipped one is
    torch.testing.assert_close(new.grad, t64([0.0, -1.0 * 0.9 / 4, 1.0 * 1.5 / 4, 0.0]))
    # value: s0 and s2 take the clipped (constant in new_value) error -> zero gradient;
    # s1 and s3: vf_coef * 0.5 * 2 (v - R) / B
    torch.testing.assert_close(new_value.grad, t64([0.0, 0.5 * (1.0 - 0.5) / 4, 0.0, 0.5 * (-1.1 - 0.0) / 4]))


def _normalized_advantages(advantages: list[float]) -> torch.Tensor:
    """Read back the advantages ppo_loss used: at ratio 1 (inside the clip range), d pg / d new_logprob = -A_i / B."""
    old = torch.zeros(len(advantages), dtype=torch.float64)
    new = old.clone().requires_grad_()
    zeros = torch.zeros_like(old)
    parts = ppo_loss(new, old, t64(advantages), zeros, zeros, zeros, zeros,
                     _settings(clip_vloss=False, vf_coef=0.0, ent_coef=0.0))
    parts.policy_loss.backward()
    return -new.grad * len(advantages)


def test_ppo_norm_adv_uses_population_std():
    used = _normalized_advantages([10.0, 20.0, 30.0, 60.0])
    # mean 30, deviations -20, -10, 0, 30, population variance (400 + 100 + 0 + 900) / 4 = 350
    expected = t64([-20.0, -10.0, 0.0, 30.0]) / (math.sqrt(350.0) + 1e-8)
    torch.testing.assert_close(used, expected)
    assert used.mean().item() == pytest.approx(0.0, abs=1e-12)
    assert used.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-8)


def test_ppo_norm_adv_of_constant_advantages_is_zero_not_nan():
    used = _normalized_advantages([3.0, 3.0, 3.0])
    torch.testing.assert_close(used, torch.zeros(3, dtype=torch.float64))


def test_ppo_norm_adv_false_leaves_advantages_unscaled():
    assert _loss(norm_adv=False).policy_loss.item() != pytest.approx(_loss(norm_adv=True).policy_loss.item())
    doubled = [2 * a for a in ADVANTAGES]
    assert _loss(advantages=doubled).policy_loss.item() == pytest.approx(2 * -0.25)
    # with normalization, scaling all advantages changes nothing
    assert _loss(advantages=doubled, norm_adv=True).policy_loss.item() == pytest.approx(
        _loss(norm_adv=True).policy_loss.item())


# ---------------------------------------------------------------------------------------------
# update
# ---------------------------------------------------------------------------------------------
def _sample(model, obs: torch.Tensor, uniform: torch.Tensor):
    """``Policy.step`` of a feedforward policy (its state [B, 0]): action, log-prob, value."""
    return model.step(obs, uniform, torch.zeros(len(obs), 0))[:3]


def _evaluate(model, obs: torch.Tensor, actions: torch.Tensor):
    """``Policy.evaluate`` of B independent samples, as one step of B slots: log-prob, entropy, value [B]."""
    B = len(obs)
    out = model.evaluate(obs[None], actions[None], torch.zeros(1, B, dtype=torch.bool), torch.zeros(B, 0))
    return tuple(x[0] for x in out)


def _discrete_batch(B: int = 64, seed: int = 0):
    torch.manual_seed(seed)
    model = ActorCritic(OBS_SPACE, DISCRETE2, [16, 16])
    obs = torch.randn(B, 4)
    actions = torch.arange(B) % 2
    with torch.no_grad():
        old_logprob, _, old_value = _evaluate(model, obs, actions)
    advantages = torch.where(actions == 1, 1.0, -1.0)  # action 1 is good, action 0 is bad
    returns = old_value.clone()
    return model, obs, actions, old_logprob, advantages, returns, old_value


def _run_update(model, batch, *, epochs=4, minibatches=4, target_kl=None, lr=1e-2, norm_adv=True):
    obs, actions, old_logprob, advantages, returns, old_value = batch
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, eps=1e-5)
    B = len(obs)  # B samples: one step of B slots, each its own sequence
    return update(model, optimizer, obs[None], actions[None], np.zeros((1, B), bool), torch.zeros(B, 0),
                  np.ones((1, B), bool), old_logprob[None], advantages[None], returns[None],
                  old_value[None],
                  _settings(epochs=epochs, minibatches=minibatches, norm_adv=norm_adv, target_kl=target_kl),
                  generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("norm_adv", [True, False])
def test_update_raises_logprob_of_action_with_positive_advantage(norm_adv):
    model, *batch = _discrete_batch()
    obs = batch[0]
    ones = torch.ones(obs.shape[0], dtype=torch.long)
    with torch.no_grad():
        before = _evaluate(model, obs, ones)[0].mean().item()
    _run_update(model, batch, norm_adv=norm_adv)
    with torch.no_grad():
        after = _evaluate(model, obs, ones)[0].mean().item()
    assert after > before + 0.01
    assert after < math.log(1.0)  # still a probability


def test_update_takes_epochs_times_minibatches_gradient_steps():
    model, *batch = _discrete_batch(B=64)
    stats = _run_update(model, batch, epochs=3, minibatches=4, target_kl=None)
    assert stats.gradient_steps == 3 * 4


def test_update_with_generous_target_kl_runs_all_epochs():
    model, *batch = _discrete_batch(B=64)
    stats = _run_update(model, batch, epochs=3, minibatches=4, target_kl=1e9)
    assert stats.gradient_steps == 3 * 4


def test_update_with_tiny_target_kl_stops_after_first_epoch():
    model, *batch = _discrete_batch(B=64)
    stats = _run_update(model, batch, epochs=5, minibatches=4, target_kl=1e-9)
    assert stats.gradient_steps == 4
    assert stats.approx_kl > 0.0


def test_update_reports_finite_mean_statistics():
    model, *batch = _discrete_batch(B=32)
    stats = _run_update(model, batch, epochs=2, minibatches=2)
    for name in ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction"):
        value = getattr(stats, name)
        assert isinstance(value, float) and math.isfinite(value), name
    assert 0.0 <= stats.clip_fraction <= 1.0
    assert 0.0 < stats.entropy <= math.log(2) + 1e-6


# ---------------------------------------------------------------------------------------------
# ActorCritic.step vs evaluate
# ---------------------------------------------------------------------------------------------
def _noise(batch: int, width: int, seed: int = 7) -> torch.Tensor:
    keys = noise.slot_keys(seed, 0, batch)
    return torch.as_tensor(noise.uniform(keys, np.zeros(batch, np.uint64), width), dtype=torch.float32)


def test_discrete_sample_logprob_equals_evaluate_logprob():
    torch.manual_seed(0)
    model = ActorCritic(OBS_SPACE, DISCRETE2, [16])
    with torch.no_grad():  # make the policy clearly obs-dependent
        model.actor[-1].weight.mul_(300.0)
    obs = torch.randn(256, 4)
    with torch.no_grad():
        action, logprob, value = _sample(model, obs, _noise(256, model.noise_width))
        eval_logprob, entropy, eval_value = _evaluate(model, obs, action)
    assert action.shape == (256,) and action.dtype == torch.int64
    assert set(action.tolist()) == {0, 1}
    torch.testing.assert_close(logprob, eval_logprob)
    torch.testing.assert_close(value, eval_value)
    assert not torch.allclose(logprob, logprob[:1].expand(256))  # the check above is not trivial


def test_continuous_sample_logprob_equals_evaluate_logprob():
    torch.manual_seed(0)
    model = ActorCritic(OBS_SPACE, BOX2, [16], init_log_std=-0.5)
    with torch.no_grad():
        model.log_std.copy_(torch.tensor([-0.5, 0.3]))
    obs = torch.randn(128, 4)
    with torch.no_grad():
        action, logprob, value = _sample(model, obs, _noise(128, model.noise_width))
        eval_logprob, entropy, eval_value = _evaluate(model, obs, action)
    assert model.noise_width == 4
    assert action.shape == (128, 2)
    torch.testing.assert_close(logprob, eval_logprob, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(value, eval_value)
    # Gaussian entropy per dimension: 0.5 + 0.5 log(2 pi) + log std
    expected_entropy = (0.5 + 0.5 * math.log(2 * math.pi) - 0.5) + (0.5 + 0.5 * math.log(2 * math.pi) + 0.3)
    torch.testing.assert_close(entropy, torch.full((128,), expected_entropy))


def test_discrete_sample_frequencies_match_softmax_probabilities():
    model = ActorCritic(OBS_SPACE, SpaceSpec("discrete", (), "int64", n=3), [8])
    logits = torch.tensor([0.0, 1.0, -1.0])
    with torch.no_grad():
        model.actor[-1].weight.zero_()
        model.actor[-1].bias.copy_(logits)
    n = 30_000
    with torch.no_grad():
        action, logprob, _ = _sample(model, torch.zeros(n, 4), _noise(n, model.noise_width))
    probs = torch.softmax(logits, 0).double()  # [0.2447, 0.6652, 0.0900]
    counts = torch.bincount(action, minlength=3).double()
    expected = probs * n
    chi2 = (((counts - expected) ** 2) / expected).sum().item()
    assert chi2 < 30.0  # df=2: p(chi2 > 30) ~ 3e-7
    torch.testing.assert_close(logprob.double(), probs.log()[action], rtol=1e-5, atol=1e-6)


def test_continuous_sample_is_gaussian_with_policy_mean_and_std():
    model = ActorCritic(OBS_SPACE, BOX2, [8])
    mean = torch.tensor([0.5, -1.0])
    log_std = torch.tensor([-0.5, 0.3])
    with torch.no_grad():
        model.actor[-1].weight.zero_()
        model.actor[-1].bias.copy_(mean)
        model.log_std.copy_(log_std)
    n = 40_000
    with torch.no_grad():
        action, _, _ = _sample(model, torch.zeros(n, 4), _noise(n, model.noise_width))
    std = log_std.exp()
    got_mean = action.double().mean(0)
    got_std = action.double().std(0)
    assert torch.all((got_mean - mean).abs() < 5 * std / math.sqrt(n)), got_mean
    assert torch.all((got_std / std - 1).abs() < 0.03), got_std
    # the two action dimensions are drawn from independent noise
    corr = torch.corrcoef(action.double().T)[0, 1].item()
    assert abs(corr) < 0.03


def test_sample_is_deterministic_given_the_noise():
    torch.manual_seed(0)
    model = ActorCritic(OBS_SPACE, BOX2, [8])
    obs = torch.randn(16, 4)
    u = _noise(16, model.noise_width)
    with torch.no_grad():
        a1, lp1, _ = _sample(model, obs, u)
        a2, lp2, _ = _sample(model, obs, u.clone())
        a3, _, _ = _sample(model, obs, _noise(16, model.noise_width, seed=8))
    assert torch.equal(a1, a2) and torch.equal(lp1, lp2)
    assert not torch.equal(a1, a3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gae_on_the_host_gives_the_same_bits_as_the_torch_recursion(dtype):
    """The CPU path (numpy) must not change a single advantage: same operations, same order, same precision."""
    g = torch.Generator().manual_seed(3)
    T, N = 257, 5
    rewards, values, next_values = (torch.randn(T, N, generator=g, dtype=dtype) for _ in range(3))
    continues = (torch.rand(T, N, generator=g) > 0.05).to(dtype)
    host = ppo._gae_host(rewards, values, next_values, continues, 0.99, 0.95)
    device = ppo._gae_device(rewards, values, next_values, continues, 0.99, 0.95)
    for a, b in zip(host, device):
        assert a.dtype == dtype
        assert torch.equal(a, b)


def test_the_update_reads_one_frozen_settings_object_of_the_configs_names():
    """``ppo.Settings`` holds what an update reads under ``config.PPOConfig``'s names; the defaults are CleanRL's."""
    import dataclasses

    from lockstep.config import PPOConfig

    settings = Settings.of(PPOConfig())
    assert settings == _settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.clip_coef = 0.3


def test_an_update_without_a_valid_sample_takes_no_step_and_changes_nothing():
    # a policy whose agents were all gone for the whole phase: every sample past its agent's leaving
    model, obs, actions, old_logprob, advantages, returns, old_value = _discrete_batch(B=8)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, eps=1e-5)
    before = {key: value.clone() for key, value in model.state_dict().items()}
    stats = update(model, optimizer, obs[None], actions[None], np.zeros((1, 8), bool), torch.zeros(8, 0),
                   np.zeros((1, 8), bool), old_logprob[None], advantages[None], returns[None], old_value[None],
                   _settings(epochs=2, minibatches=4), generator=torch.Generator().manual_seed(1))
    assert stats == ppo.UpdateStats(0.0, 0.0, 0.0, 0.0, 0.0, gradient_steps=0, skipped_steps=0)
    assert all(torch.equal(model.state_dict()[key], value) for key, value in before.items())
    assert not optimizer.state  # not even Adam's moments saw a step
