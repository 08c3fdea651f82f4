"""V-trace: value targets and policy-gradient advantages for samples that a lagging policy acted on.

Pure tensor math (Espeholt et al. 2018, "IMPALA: Scalable Distributed Deep-RL with Importance Weighted
Actor-Learner Architectures", eq. (1) and section 4.2). Knows nothing of processes, gRPC or policy
versions. Shapes: T steps, N env slots, as ``ppo.gae``, whose conventions it follows: the same
``next_values`` and ``continues`` describe where episodes and unrolls end.

The behaviour policy μ acted (the version a sample carries); the target policy π is the one being
trained. With the per-step importance weights truncated at ρ̄ and c̄::

    ρ_t = min(ρ̄, π(a_t|x_t) / μ(a_t|x_t))        c_t = min(c̄, π(a_t|x_t) / μ(a_t|x_t))
    δ_t V = ρ_t (r_t + γ V(x_{t+1}) − V(x_t))

the value target of step s is (eq. (1), and its recursive form, which the loop computes backwards)::

    v_s = V(x_s) + Σ_{t=s}^{s+n−1} γ^{t−s} (Π_{i=s}^{t−1} c_i) δ_t V
    v_s − V(x_s) = δ_s V + γ c_s (v_{s+1} − V(x_{s+1}))

and the advantage of the policy gradient (section 4.2), which takes the place of GAE's in PPO's clipped
objective while v_s takes the place of its returns in the value loss (as Sample Factory's APPO uses them)::

    A_s = ρ_s (r_s + γ v_{s+1} − V(x_s))

Episode and unroll ends follow ``ppo.gae``: V(x_{t+1}) is ``next_values[t]`` (0 where the episode
terminated at t, V of its final observation where it was truncated, V of the bootstrap observation at a
slot's last step), and where ``continues[t]`` is 0 the trace stops: nothing after t corrects v_t, and
v_{t+1} in A_t is that same ``next_values[t]``. Samples past a slot's end or of an agent gone (``valid``
False) have ``continues`` 0, and so does the valid step before them (the slot's last step, or the agent's
episode end): as in GAE, they touch no valid sample's target or advantage, and the update leaves their own
numbers out.

When π = μ and ρ̄, c̄ >= 1 every weight is 1: v_s is the λ = 1 return of GAE and A_s its advantage.
ρ̄ decides the fixed point the value function converges to (ρ̄ = ∞: V^π; smaller: towards V^μ), c̄ how far
the trace reaches; the paper's defaults are ρ̄ = c̄ = 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

# How far two float32 computations of one log-prob may differ: inference's (at its batch shape, perhaps in numpy)
# and the trainer's (over [T, N]) round differently, as ``lockstep audit``'s tolerance allows for: an absolute
# part and 32 units of float32's epsilon of the log-probs' magnitude. A ratio above ρ̄ by no more than that is
# counted as ρ̄'s own, not as truncated, so that a strict run, whose every ratio is 1, reports none.
ROUNDING = 1e-5
ROUNDING_RELATIVE = 32 * torch.finfo(torch.float32).eps


@dataclass
class VTrace:
    targets: torch.Tensor  # [T, N] v_s: the value loss's targets
    advantages: torch.Tensor  # [T, N] ρ_s (r_s + γ v_{s+1} − V(x_s)): the clipped objective's advantages
    truncated_fraction: torch.Tensor  # [] the valid samples' fraction with π/μ > ρ̄ beyond ROUNDING (on the device)


def vtrace(behaviour_logprobs: torch.Tensor, target_logprobs: torch.Tensor, rewards: torch.Tensor,
           values: torch.Tensor, next_values: torch.Tensor, continues: torch.Tensor, gamma: float, *,
           rho_bar: float = 1.0, c_bar: float = 1.0, valid: torch.Tensor | None = None) -> VTrace:
    """V-trace targets and advantages, all inputs [T, N] (``valid``, bool, only counts the truncated fraction:
    None, every sample).

    ``behaviour_logprobs`` are log μ(a_t|x_t), recorded when the action was taken; ``target_logprobs``
    log π(a_t|x_t) of the policy being trained; ``values`` V(x_t); ``next_values`` and ``continues`` as
    ``ppo.gae`` takes them. The result carries no gradient: targets are constants of the loss.
    """
    if rho_bar <= 0 or c_bar <= 0:
        raise ValueError(f"rho_bar and c_bar must be > 0 (got rho_bar={rho_bar}, c_bar={c_bar}); "
                         "the paper's defaults are 1.0")
    with torch.no_grad():
        log_ratios = target_logprobs - behaviour_logprobs  # [T, N] log π/μ
        ratios = log_ratios.exp()  # [T, N] π/μ
        rho = ratios.clamp(max=rho_bar)  # [T, N] ρ_t
        c = ratios.clamp(max=c_bar)  # [T, N] c_t
        T = rewards.shape[0]
        targets = torch.zeros_like(rewards)
        advantages = torch.zeros_like(rewards)
        last = torch.zeros_like(rewards[0])  # [N] v_{t+1} − V(x_{t+1}), 0 past the unroll
        for t in reversed(range(T)):
            next_target = next_values[t] + continues[t] * last  # v_{t+1}, or the bootstrap where the trace ends
            advantages[t] = rho[t] * (rewards[t] + gamma * next_target - values[t])  # A_t
            delta = rho[t] * (rewards[t] + gamma * next_values[t] - values[t])  # δ_t V
            last = delta + gamma * c[t] * continues[t] * last  # v_t − V(x_t) = δ_t V + γ c_t (v_{t+1} − V(x_{t+1}))
            targets[t] = values[t] + last
        rounding = ROUNDING + ROUNDING_RELATIVE * (target_logprobs.abs() + behaviour_logprobs.abs())  # [T, N]
        over = log_ratios > math.log(rho_bar) + rounding  # [T, N] truncated by ρ̄, beyond rounding
        if valid is not None:
            over = over & valid
        count = valid.sum() if valid is not None else torch.tensor(over.numel(), device=over.device)
        fraction = over.sum() / count.clamp(min=1)
    return VTrace(targets, advantages, fraction)
