"""PPO: generalized advantage estimation, the clipped objective, and one update.

Pure tensor math (Schulman et al. 2017, "Proximal Policy Optimization
Algorithms"; GAE: Schulman et al. 2016). Knows nothing of processes, gRPC or
policy versions. Shapes: T steps, N env slots, B = T * N samples.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from lockstep.algo.optim import GradientStep


@dataclass(frozen=True)
class Settings:
    """What one update reads of PPO's hyperparameters, frozen for the update (``config.PPOConfig`` holds their
    defaults and help; ``of`` copies them from it by name)."""

    epochs: int  # passes over the batch
    minibatches: int  # per pass
    clip_coef: float  # epsilon of the clipped objective (and of the clipped value loss)
    clip_vloss: bool
    vf_coef: float
    ent_coef: float
    max_grad_norm: float
    norm_adv: bool  # normalize advantages per minibatch
    target_kl: float | None  # stop the epochs once the approximate KL exceeds it; None: never

    @classmethod
    def of(cls, source: object) -> Settings:
        """The settings of any object that has them as attributes (``config.PPOConfig``)."""
        return cls(**{name: getattr(source, name) for name in cls.__dataclass_fields__})


def gae(rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor,
        continues: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and returns, all [T, N].

    ``next_values[t]`` is V of the state after step t in the same episode: the
    next observation's value, the value of the final observation when the episode
    was truncated at t (truncation is not termination), or 0 when it terminated.
    ``continues[t]`` is 0 where an episode ended at t (terminated or truncated),
    cutting the advantage trace there.

    On the CPU the recursion runs in numpy over the tensors' memory (``_gae_host``): the same operations
    in the same order and precision, so the same bits, without the overhead of T rounds of small torch
    calls (docs/benchmarks/2026-12-02-peers-cleanrl.md measures it).
    """
    if rewards.device.type == "cpu":
        return _gae_host(rewards, values, next_values, continues, gamma, lam)
    return _gae_device(rewards, values, next_values, continues, gamma, lam)


def _gae_device(rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor,
                continues: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``gae`` in torch, on the tensors' device."""
    T = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(rewards[0])  # [N]
    for t in reversed(range(T)):
        delta = rewards[t] + gamma * next_values[t] - values[t]  # δ_t = r_t + γ V(s_{t+1}) − V(s_t)
        last = delta + gamma * lam * continues[t] * last  # A_t = δ_t + γλ A_{t+1}
        advantages[t] = last
    return advantages, advantages + values


def _gae_host(rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor,
              continues: torch.Tensor, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``gae`` for CPU tensors, in numpy: line for line ``_gae_device``."""
    r, v, v_next, c = (x.detach().numpy() for x in (rewards, values, next_values, continues))  # [T, N] views
    advantages = np.zeros_like(r)
    last = np.zeros_like(r[0])  # [N]
    with np.errstate(over="ignore", invalid="ignore"):  # inf and nan as torch makes them: the trainer skips the step
        for t in reversed(range(r.shape[0])):
            delta = r[t] + gamma * v_next[t] - v[t]
            last = delta + gamma * lam * c[t] * last
            advantages[t] = last
    advantages = torch.from_numpy(advantages)
    return advantages, advantages + values


@dataclass
class LossParts:
    loss: torch.Tensor
    policy_loss: torch.Tensor
    value_loss: torch.Tensor
    entropy: torch.Tensor
    approx_kl: torch.Tensor
    clip_fraction: torch.Tensor


def ppo_loss(new_logprob: torch.Tensor, old_logprob: torch.Tensor, advantages: torch.Tensor,
             new_value: torch.Tensor, old_value: torch.Tensor, returns: torch.Tensor,
             entropy: torch.Tensor, settings: Settings) -> LossParts:
    """The clipped surrogate objective with value loss and entropy bonus, all inputs [B]."""
    clip_coef = settings.clip_coef
    log_ratio = new_logprob - old_logprob
    ratio = log_ratio.exp()  # r_t(θ) = π_θ(a|s) / π_behaviour(a|s)
    if settings.norm_adv:
        advantages = (advantages - advantages.mean()) / (advantages.std(unbiased=False) + 1e-8)
    # L^CLIP = E[min(r A, clip(r, 1−ε, 1+ε) A)], minimized as its negative
    policy_loss = torch.max(-advantages * ratio,
                            -advantages * ratio.clamp(1 - clip_coef, 1 + clip_coef)).mean()
    if settings.clip_vloss:
        clipped = old_value + (new_value - old_value).clamp(-clip_coef, clip_coef)
        value_loss = 0.5 * torch.max((new_value - returns) ** 2, (clipped - returns) ** 2).mean()
    else:
        value_loss = 0.5 * ((new_value - returns) ** 2).mean()
    entropy_mean = entropy.mean()
    loss = policy_loss - settings.ent_coef * entropy_mean + settings.vf_coef * value_loss
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()  # k3 estimator of KL(behaviour || new)
        clip_fraction = ((ratio - 1).abs() > clip_coef).float().mean()
    return LossParts(loss, policy_loss, value_loss, entropy_mean, approx_kl, clip_fraction)


@dataclass
class UpdateStats:
    policy_loss: float
    value_loss: float
    entropy: float
    approx_kl: float
    clip_fraction: float
    gradient_steps: int
    skipped_steps: int = 0  # minibatches whose loss or gradient was not finite: no optimizer step (``optimize``)


Minibatch = tuple[torch.Tensor, ...]  # (new log-prob, old log-prob, advantages, new value, old value, returns,
#                                       entropy), each [b]: the samples of one minibatch, new_* with gradients


def optimize(model: nn.Module, optimizer: torch.optim.Optimizer,
             minibatch: Callable[[torch.Tensor, np.ndarray], Minibatch], units: int, settings: Settings, *,
             generator: torch.Generator | None = None, device: torch.device | str = "cpu",
             reduce_gradients: Callable[[int], None] | None = None,
             agree: Callable[[float], float] | None = None) -> UpdateStats:
    """Epochs x minibatches gradient steps (``settings``). Each epoch shuffles ``units`` (samples, or whole slots for a
    recurrent policy) and splits them into ``minibatches`` groups; ``minibatch(indices, host_indices)``
    evaluates one group (the indices [b] on ``device``, and the same on the host).

    Data-parallel training (several learners) passes ``reduce_gradients(samples)``, called after each
    backward pass to average the gradients over the learners, and ``agree(x)``, the learners' mean of x
    (for the early stop on the KL). Every learner then takes exactly ``minibatches`` steps per epoch,
    a minibatch without samples contributing zero gradients. Alone, an update of no ``units`` (every sample
    invalid: a policy whose agents were all gone for the phase) is no update: no step, zero statistics.

    A minibatch whose loss or gradient is not finite (NaN or inf, e.g. from a reward so large that its
    square overflows) takes no optimizer step: neither the parameters nor the optimizer's moments see
    it, and it is counted in ``skipped_steps``. A non-finite loss makes its gradients NaN before they
    are averaged, so with several learners every learner sees the same non-finite norm and skips alike.

    Nothing is read back from the device per minibatch (each read waits for the GPU to finish): the
    statistics and the skip decisions stay on the device, the step is skipped there (``optim.GradientStep.step``;
    another optimizer reads the decision back per minibatch), and the host reads them once per update, and
    the KL once per epoch when ``target_kl`` is set. The early stop compares the epoch's last minibatch's KL.
    """
    sums = torch.zeros(5, device=device)  # policy loss, value loss, entropy, KL, clip fraction
    taken = torch.zeros((), device=device)  # minibatches in ``sums``: a finite loss and KL
    skipped = torch.zeros((), device=device)  # minibatches without an optimizer step
    no_samples = torch.ones((), dtype=torch.bool, device=device)  # a minibatch without samples: a finite loss
    attempted = 0
    gradients = GradientStep(model, optimizer, settings.max_grad_norm)
    minibatches, target_kl = settings.minibatches, settings.target_kl
    sections = minibatches if reduce_gradients is not None else min(minibatches, units)
    if sections == 0:
        return UpdateStats(0.0, 0.0, 0.0, 0.0, 0.0, gradient_steps=0)
    approx_kl: torch.Tensor | float = 0.0  # the last minibatch's
    for _ in range(settings.epochs):
        host_order = torch.randperm(units, generator=generator, device="cpu")
        order = host_order.to(device, non_blocking=True)
        for idx, host_idx in zip(torch.tensor_split(order, sections), torch.tensor_split(host_order, sections)):
            gradients.zero()
            samples, finite = 0, no_samples  # zero gradients
            if len(idx):
                new_logprob, old_logprob, advantages, new_value, old_value, returns, entropy = minibatch(
                    idx, host_idx.numpy())
                samples = len(new_logprob)
            if samples:
                parts = ppo_loss(new_logprob, old_logprob, advantages, new_value, old_value, returns, entropy,
                                 settings)
                parts.loss.backward()
                finite = torch.isfinite(parts.loss.detach())
                if reduce_gradients is not None:  # a loss of inf can have finite gradients: poison them for
                    # every learner to skip alike (x 1.0 leaves finite ones as they are; one kernel for all)
                    grads = [p.grad for p in model.parameters() if p.grad is not None]
                    torch._foreach_mul_(grads, torch.where(finite, 1.0, math.nan))
                good = finite & torch.isfinite(parts.approx_kl)
                sums += torch.where(good, torch.stack([parts.policy_loss.detach(), parts.value_loss.detach(),
                                                       parts.entropy.detach(), parts.approx_kl,
                                                       parts.clip_fraction]), 0.0)
                taken += good
                approx_kl = parts.approx_kl
            if reduce_gradients is not None:
                reduce_gradients(samples)
            elif not samples:
                continue
            attempted += 1
            bad = ~(torch.isfinite(gradients.clip()) & finite)
            skipped += bad
            gradients.step(skip=bad)
        if target_kl is not None and (agree(float(approx_kl)) if agree else float(approx_kl)) > target_kl:
            break
    read = torch.cat([sums, taken[None], skipped[None]]).tolist()  # the update's one read of the device
    means = (np.array(read[:5], np.float32) / np.float32(max(int(read[5]), 1))).tolist()
    return UpdateStats(*means, gradient_steps=attempted - int(read[6]), skipped_steps=int(read[6]))


def _each_leaf(fn: Callable[[torch.Tensor], torch.Tensor], obs: torch.Tensor | dict) -> torch.Tensor | dict:
    """``fn`` of the observation tensor, or of each leaf of a Dict or Tuple observation's dict of tensors
    (``common.tree.leaf_map``, restated: this module imports nothing of lockstep but the optimizer step)."""
    return {path: fn(x) for path, x in obs.items()} if isinstance(obs, dict) else fn(obs)


def update(model: nn.Module, optimizer: torch.optim.Optimizer, obs: torch.Tensor | dict[str, torch.Tensor],
           actions: torch.Tensor, starts: np.ndarray, initial_state: torch.Tensor, valid: np.ndarray,
           old_logprob: torch.Tensor, advantages: torch.Tensor, returns: torch.Tensor, old_value: torch.Tensor,
           settings: Settings, **runtime) -> UpdateStats:
    """PPO on [T, N] sequences with ``settings``; ``runtime`` (the generator, several learners' hooks): see
    ``optimize``.

    obs [T, N, *obs] (a Dict or Tuple observation: a dict of [T, N, *leaf]), actions [T, N, *act],
    initial_state [N, S], the rest [T, N]; on the host (numpy, so that the minibatches' shapes and the
    LSTM's segments are known without reading the device): starts [T, N] (episode starts, where the
    state resets) and valid [T, N] (False past a slot cut short).
    ``model.evaluate(obs, actions, starts, state)`` returns (log-prob, entropy, value), each [T, n].

    Minibatches are of whole slots, each replayed over its T steps (backpropagation through time).
    A policy whose state holds nothing (``state_size`` 0) has independent samples: its valid samples
    become one step of B slots, so that its minibatches are of samples, each sample once per epoch.
    """
    dev = actions.device

    def select(x: torch.Tensor, keep: np.ndarray) -> torch.Tensor:
        """x [T, n, ...] -> [b, ...], the samples where ``keep`` [T, n] is True, in (t, n) order."""
        rows = torch.from_numpy(np.flatnonzero(keep)).to(dev, non_blocking=True)  # [b]
        return x.reshape(-1, *x.shape[2:]).index_select(0, rows)

    if model.state_size == 0:
        B = int(valid.sum())
        obs = _each_leaf(lambda x: select(x, valid)[None], obs)  # [1, B, ...]
        actions, old_logprob, advantages, returns, old_value = (
            select(x, valid)[None] for x in (actions, old_logprob, advantages, returns, old_value))  # [1, B, ...]
        starts, valid = np.zeros((1, B), bool), np.ones((1, B), bool)
        initial_state = initial_state.new_zeros((B, 0))

    every_sample_valid = bool(valid.all())  # then selecting the valid samples is a reshape

    def minibatch(slots: torch.Tensor, host_slots: np.ndarray) -> Minibatch:
        new_logprob, entropy, new_value = model.evaluate(
            _each_leaf(lambda x: x[:, slots], obs), actions[:, slots], starts[:, host_slots],
            initial_state[slots])  # [T, n] each
        columns = (new_logprob, old_logprob[:, slots], advantages[:, slots], new_value, old_value[:, slots],
                   returns[:, slots], entropy)
        if every_sample_valid:
            return tuple(x.reshape(-1) for x in columns)  # [T * n], in the (t, n) order of ``select``
        keep = valid[:, host_slots]  # [T, n] -> the minibatch's samples
        return tuple(select(x, keep) for x in columns)

    return optimize(model, optimizer, minibatch, actions.shape[1], settings, device=dev, **runtime)
