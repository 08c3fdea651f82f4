"""V-trace (Espeholt et al. 2018) checked against hand arithmetic, the paper's sum, and GAE with λ = 1."""

from __future__ import annotations

import math

import pytest
import torch

from lockstep.algo.ppo import gae
from lockstep.algo.vtrace import vtrace

GAMMA = 0.9


def t64(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


# ---------------------------------------------------------------------------------------------
# T=3 steps, N=1 slot, one episode through all three steps; the last step bootstraps from V(x_3) = 2.0.
# ρ̄ = 1.5, c̄ = 1.0, γ = 0.9. Ratios π/μ = [2.0, 1.2, 0.5]:
#   ρ = [1.5, 1.2, 0.5]   (t=0 truncated by ρ̄)
#   c = [1.0, 1.0, 0.5]   (t=0 and t=1 truncated by c̄)
# ---------------------------------------------------------------------------------------------
RATIOS = [2.0, 1.2, 0.5]
BEHAVIOUR = [-1.0, -0.5, -2.0]  # log μ(a_t|x_t)
REWARDS = [1.0, 0.0, 2.0]
VALUES = [0.5, 1.0, 1.5]  # V(x_t)
NEXT_VALUES = [1.0, 1.5, 2.0]  # V(x_{t+1}); the last: the bootstrap observation's
CONTINUES = [1.0, 1.0, 0.0]  # the slot's last step ends the trace, as the trainer's bootstrap marks it

# t=2: δ_2 = ρ_2 (r_2 + γ V(x_3) − V(x_2)) = 0.5 * (2 + 1.8 − 1.5) = 1.15
D2 = 0.5 * (2.0 + 0.9 * 2.0 - 1.5)
V2 = 1.5 + D2  # v_2 = 2.65 (nothing after the unroll corrects it)
A2 = 0.5 * (2.0 + 0.9 * 2.0 - 1.5)  # A_2 = ρ_2 (r_2 + γ v_3 − V(x_2)), v_3 = the bootstrap 2.0: 1.15
# t=1: δ_1 = 1.2 * (0 + 1.35 − 1) = 0.42; v_1 − V(x_1) = δ_1 + γ c_1 (v_2 − V(x_2)) = 0.42 + 0.9 * 1.0 * 1.15
D1 = 1.2 * (0.0 + 0.9 * 1.5 - 1.0)
V1 = 1.0 + D1 + 0.9 * 1.0 * (V2 - 1.5)  # 1 + 1.455 = 2.455
A1 = 1.2 * (0.0 + 0.9 * V2 - 1.0)  # 1.2 * (2.385 − 1) = 1.662
# t=0: δ_0 = 1.5 * (1 + 0.9 − 0.5) = 2.1; v_0 − V(x_0) = 2.1 + 0.9 * 1.0 * 1.455 = 3.4095
D0 = 1.5 * (1.0 + 0.9 * 1.0 - 0.5)
V0 = 0.5 + D0 + 0.9 * 1.0 * (V1 - 1.0)  # 3.9095
A0 = 1.5 * (1.0 + 0.9 * V1 - 0.5)  # 1.5 * 2.7095 = 4.06425


def _column(x) -> torch.Tensor:
    return t64(x)[:, None]  # [T] -> [T, 1]


def _hand_example(**changes):
    args = dict(behaviour_logprobs=_column(BEHAVIOUR),
                target_logprobs=_column([b + math.log(r) for b, r in zip(BEHAVIOUR, RATIOS)]),
                rewards=_column(REWARDS), values=_column(VALUES), next_values=_column(NEXT_VALUES),
                continues=_column(CONTINUES), gamma=GAMMA, rho_bar=1.5, c_bar=1.0) | changes
    return vtrace(**args)


def test_hand_computed_constants_are_what_the_comments_say():
    """Guards the hand arithmetic above against typos."""
    assert [D0, D1, D2] == pytest.approx([2.1, 0.42, 1.15])
    assert [V0, V1, V2] == pytest.approx([3.9095, 2.455, 2.65])
    assert [A0, A1, A2] == pytest.approx([4.06425, 1.662, 1.15])


def test_vtrace_matches_hand_computed_targets_and_advantages():
    result = _hand_example()
    assert result.targets.shape == result.advantages.shape == (3, 1)
    torch.testing.assert_close(result.targets[:, 0], t64([V0, V1, V2]))
    torch.testing.assert_close(result.advantages[:, 0], t64([A0, A1, A2]))
    assert float(result.truncated_fraction) == pytest.approx(1 / 3)  # t=0 only: 1.2 > c̄ is no ρ̄ truncation


def test_vtrace_c_bar_cuts_the_trace_and_rho_bar_scales_the_step():
    """Without truncation (ρ̄ = c̄ = 10) the same example weighs each step by its full ratio."""
    result = _hand_example(rho_bar=10.0, c_bar=10.0)
    d2 = 0.5 * (2.0 + 0.9 * 2.0 - 1.5)
    d1 = 1.2 * (0.0 + 0.9 * 1.5 - 1.0)
    d0 = 2.0 * (1.0 + 0.9 * 1.0 - 0.5)
    v2 = 1.5 + d2
    v1 = 1.0 + d1 + 0.9 * 1.2 * d2  # c_1 = 1.2 now
    v0 = 0.5 + d0 + 0.9 * 2.0 * (v1 - 1.0)  # c_0 = 2.0 now
    torch.testing.assert_close(result.targets[:, 0], t64([v0, v1, v2]))
    torch.testing.assert_close(result.advantages[:, 0], t64([2.0 * (1.0 + 0.9 * v1 - 0.5), 1.2 * (0.9 * v2 - 1.0), d2]))
    assert float(result.truncated_fraction) == 0.0


def test_vtrace_recursion_equals_the_papers_sum():
    """Eq. (1): v_s = V(x_s) + Σ_{t=s}^{T−1} γ^{t−s} (Π_{i=s}^{t−1} c_i) δ_t V, over an unroll without ends."""
    g = torch.Generator().manual_seed(0)
    T, N = 5, 3
    behaviour, target, rewards, values = (torch.randn(T, N, generator=g, dtype=torch.float64) for _ in range(4))
    bootstrap = torch.randn(N, generator=g, dtype=torch.float64)
    next_values = torch.cat([values[1:], bootstrap[None]])
    continues = torch.ones(T, N, dtype=torch.float64)
    continues[-1] = 0.0
    result = vtrace(behaviour, target, rewards, values, next_values, continues, GAMMA, rho_bar=1.0, c_bar=0.8)
    ratios = (target - behaviour).exp()
    rho, c = ratios.clamp(max=1.0), ratios.clamp(max=0.8)
    delta = rho * (rewards + GAMMA * next_values - values)
    expected = values.clone()
    for s in range(T):
        for t in range(s, T):
            expected[s] += GAMMA ** (t - s) * c[s:t].prod(dim=0) * delta[t]
    torch.testing.assert_close(result.targets, expected)
    v_next = torch.cat([result.targets[1:], bootstrap[None]])  # v_{s+1}; at the end, the bootstrap value
    torch.testing.assert_close(result.advantages, rho * (rewards + GAMMA * v_next - values))


# ---------------------------------------------------------------------------------------------
# On-policy: every ratio 1. T=4 steps, N=3 slots, in the trainer's conventions (``trainer.bootstrap``):
# slot 0: one episode through the unroll, bootstrapping from V(x_4) at the last step;
# slot 1: terminated at t=1 (no future value), then a new episode;
# slot 2: truncated at t=2 (bootstraps from V(final observation) = 7.0), then a new episode.
# ---------------------------------------------------------------------------------------------
def _on_policy_batch():
    g = torch.Generator().manual_seed(1)
    T, N = 4, 3
    rewards = torch.randn(T, N, generator=g, dtype=torch.float64)
    values = torch.randn(T, N, generator=g, dtype=torch.float64)
    next_values = torch.zeros(T, N, dtype=torch.float64)
    next_values[:-1] = values[1:]
    next_values[-1] = t64([3.0, -1.0, 0.5])  # V(bootstrap observation)
    continues = torch.ones(T, N, dtype=torch.float64)
    continues[-1] = 0.0
    next_values[1, 1], continues[1, 1] = 0.0, 0.0  # terminated
    next_values[2, 2], continues[2, 2] = 7.0, 0.0  # truncated
    logprobs = torch.randn(T, N, generator=g, dtype=torch.float64) - 1.0
    return logprobs, rewards, values, next_values, continues


@pytest.mark.parametrize("rho_bar, c_bar", [(1.0, 1.0), (2.0, 5.0)])
def test_vtrace_on_policy_is_gae_with_lambda_one(rho_bar, c_bar):
    logprobs, rewards, values, next_values, continues = _on_policy_batch()
    result = vtrace(logprobs, logprobs, rewards, values, next_values, continues, GAMMA, rho_bar=rho_bar, c_bar=c_bar)
    advantages, returns = gae(rewards, values, next_values, continues, GAMMA, 1.0)
    torch.testing.assert_close(result.targets, returns)
    torch.testing.assert_close(result.advantages, advantages)
    assert float(result.truncated_fraction) == 0.0


def test_vtrace_truncation_bootstraps_from_the_final_observation_and_termination_from_nothing():
    logprobs, rewards, values, next_values, continues = _on_policy_batch()
    base = vtrace(logprobs, logprobs, rewards, values, next_values, continues, GAMMA)
    bumped = next_values.clone()
    bumped[2, 2] += 2.0  # V(final observation) of the truncated episode
    moved = vtrace(logprobs, logprobs, rewards, values, bumped, continues, GAMMA)
    # only the episode truncated at t=2 sees it, by γ^(3−t) * 2 at t <= 2; t=3 is a new episode
    torch.testing.assert_close(moved.targets[:, 2] - base.targets[:, 2], t64([0.729 * 2, 0.81 * 2, 0.9 * 2, 0.0]))
    changed = rewards.clone()
    changed[2:, 1] += 10.0  # after the termination at t=1
    moved = vtrace(logprobs, logprobs, changed, values, next_values, continues, GAMMA)
    torch.testing.assert_close(moved.targets[:2, 1], base.targets[:2, 1])


# ---------------------------------------------------------------------------------------------
# The truncated fraction and invalid samples
# ---------------------------------------------------------------------------------------------
def test_truncated_fraction_counts_exactly_the_valid_samples_with_ratio_above_rho_bar():
    log_ratios = t64([[math.log(3.0), 0.0, math.log(1.01)],  # above, equal (not above), above
                      [math.log(0.2), math.log(1.5), math.log(5.0)]])  # below, above, above but invalid
    behaviour = torch.zeros(2, 3, dtype=torch.float64)
    zeros = torch.zeros(2, 3, dtype=torch.float64)
    valid = torch.tensor([[True, True, True], [True, True, False]])
    result = vtrace(behaviour, log_ratios, zeros, zeros, zeros, zeros, GAMMA, rho_bar=1.0, valid=valid)
    assert float(result.truncated_fraction) == pytest.approx(3 / 5)
    every = vtrace(behaviour, log_ratios, zeros, zeros, zeros, zeros, GAMMA, rho_bar=1.0)
    assert float(every.truncated_fraction) == pytest.approx(4 / 6)
    none_valid = vtrace(behaviour, log_ratios, zeros, zeros, zeros, zeros, GAMMA, valid=torch.zeros(2, 3, dtype=bool))
    assert float(none_valid.truncated_fraction) == 0.0


def test_invalid_samples_touch_no_valid_target_as_in_gae():
    """A slot cut short after 2 of 4 steps: as ``trainer.bootstrap`` marks it (the last valid step bootstraps
    and ends the trace; past it ``next_values`` and ``continues`` are 0), whatever the invalid steps hold, even
    an extreme ratio, the valid steps' targets and advantages are those of the 2-step unroll alone."""
    g = torch.Generator().manual_seed(2)
    T = 4
    behaviour, target, rewards, values = (torch.randn(T, 1, generator=g, dtype=torch.float64) for _ in range(4))
    next_values = t64([[values[1, 0]], [4.0], [0.0], [0.0]])
    continues = t64([[1.0], [0.0], [0.0], [0.0]])
    base = vtrace(behaviour, target, rewards, values, next_values, continues, GAMMA)
    garbage = [x.clone() for x in (behaviour, target, rewards, values)]
    garbage[0][2:], garbage[1][2:], garbage[2][2:], garbage[3][2:] = -50.0, 0.0, 100.0, -30.0  # ratio e^50
    moved = vtrace(*garbage, next_values, continues, GAMMA)
    torch.testing.assert_close(moved.targets[:2], base.targets[:2])
    torch.testing.assert_close(moved.advantages[:2], base.advantages[:2])
    alone = vtrace(behaviour[:2], target[:2], rewards[:2], values[:2], next_values[:2], continues[:2], GAMMA)
    torch.testing.assert_close(base.targets[:2], alone.targets)
    on_policy = vtrace(behaviour, behaviour, rewards, values, next_values, continues, GAMMA)
    advantages, returns = gae(rewards, values, next_values, continues, GAMMA, 1.0)
    torch.testing.assert_close(on_policy.targets[:2], returns[:2])


def test_vtrace_refuses_a_weight_bound_that_is_not_positive():
    zeros = torch.zeros(1, 1)
    with pytest.raises(ValueError, match="rho_bar"):
        vtrace(zeros, zeros, zeros, zeros, zeros, zeros, GAMMA, rho_bar=0.0)


def test_a_ratio_above_rho_bar_by_rounding_alone_is_not_counted_as_truncated():
    """Inference and the trainer compute one log-prob in float32 at different shapes and round differently (by
    one unit in the last place, seen in strict runs): such a ratio is 1, not a truncation of ρ̄ = 1, and a
    strict run reports none. A ratio 1e-4 above ρ̄ is."""
    behaviour = torch.full((1, 3), -1.5, dtype=torch.float32)
    one_ulp = torch.nextafter(behaviour, torch.zeros_like(behaviour))  # log π a unit above log μ
    target = torch.cat([one_ulp[:, :1], behaviour[:, :1], behaviour[:, :1] + 1e-4], dim=1)
    assert bool((target[0, 0] - behaviour[0, 0]).exp() > 1.0)  # truncated by the clamp, which changes nothing
    zeros = torch.zeros(1, 3)
    result = vtrace(behaviour, target, zeros, zeros, zeros, zeros, GAMMA, rho_bar=1.0)
    assert float(result.truncated_fraction) == pytest.approx(1 / 3)  # the third only
