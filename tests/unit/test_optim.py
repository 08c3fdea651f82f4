"""The update's direct optimizer step (``algo.optim``) against torch's own functions: the same bits."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from lockstep.algo import optim, ppo

pytestmark = pytest.mark.skipif(not hasattr(torch, "_fused_adam_"), reason="this torch has no fused Adam")


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.actor = nn.Sequential(nn.Linear(11, 64), nn.Tanh(), nn.Linear(64, 3))
        self.critic = nn.Sequential(nn.Linear(11, 64), nn.Tanh(), nn.Linear(64, 1))
        self.log_std = nn.Parameter(torch.zeros(3))


def _steps(model: TwoHeads, direct: bool, losses: list[float]) -> torch.optim.Adam:
    """A few clipped Adam steps on fixed data; ``direct``: through ``GradientStep``, else torch's functions.
    Each of ``losses`` scales the loss (inf: a step that must be skipped, on the device)."""
    opt = torch.optim.Adam(model.parameters(), lr=3e-4, eps=1e-5, fused=True)
    step = optim.GradientStep(model, opt, max_grad_norm=0.5)
    data = torch.Generator().manual_seed(0)
    x, target = torch.randn(64, 11, generator=data), torch.randn(64, 3, generator=data)
    for scale in losses:
        if direct:
            step.zero()
        else:
            opt.zero_grad(set_to_none=False)
        loss = scale * ((model.actor(x) - target) ** 2).mean() + model.critic(x).pow(2).mean() + model.log_std.sum()
        loss.backward()
        norm = step.clip() if direct else nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        bad = ~(torch.isfinite(norm) & torch.isfinite(loss))
        if direct:
            step.step(skip=bad)
        else:
            opt.found_inf = bad.float()
            opt.step()
            del opt.found_inf
    return opt


def _bits(tensors) -> list[bytes]:
    return [t.detach().numpy().tobytes() for t in tensors]


def _steps_of_every_parameter(model: TwoHeads, step: optim.GradientStep, n: int) -> None:
    """``n`` steps through ``step`` of a loss that gives every parameter of ``model`` a gradient."""
    x = torch.ones(2, 11)
    for _ in range(n):
        step.zero()
        (model.actor(x).sum() + model.critic(x).sum() + model.log_std.sum()).backward()
        step.clip()
        step.step(skip=torch.tensor(False))


def test_the_direct_step_takes_the_same_steps_as_torch_optim_and_clip_grad_norm():
    reference = TwoHeads()
    direct = copy.deepcopy(reference)
    losses = [1.0, 30.0, 1.0, float("inf"), 200.0, 1.0]  # clipped and unclipped steps, one skipped
    opt_ref, opt_direct = _steps(reference, False, losses), _steps(direct, True, losses)
    assert _bits(direct.parameters()) == _bits(reference.parameters())
    for p_ref, p_direct in zip(reference.parameters(), direct.parameters()):
        ref, mine = opt_ref.state[p_ref], opt_direct.state[p_direct]
        assert _bits([mine["exp_avg"], mine["exp_avg_sq"]]) == _bits([ref["exp_avg"], ref["exp_avg_sq"]])
        assert float(mine["step"]) == float(ref["step"]) == 5.0  # the skipped step not counted
    assert not hasattr(opt_direct, "found_inf")


def test_the_direct_step_calls_no_optimizer_step_once_bound(monkeypatch):
    model = TwoHeads()
    opt = torch.optim.Adam(model.parameters(), lr=3e-4, eps=1e-5, fused=True)
    calls = []
    original = torch.optim.Adam.step
    monkeypatch.setattr(torch.optim.Adam, "step", lambda self, *a, **k: calls.append(1) or original(self, *a, **k))
    step = optim.GradientStep(model, opt, 0.5)
    for _ in range(4):
        step.zero()
        model.critic(torch.ones(2, 11)).sum().backward()
        step.clip()
        step.step(skip=torch.tensor(False))
    # the actor's parameters have no gradient yet: torch's step (which makes Adam's state) for every step
    assert len(calls) == 4
    model2 = TwoHeads()
    opt2 = torch.optim.Adam(model2.parameters(), lr=3e-4, eps=1e-5, fused=True)
    step2 = optim.GradientStep(model2, opt2, 0.5)
    calls.clear()
    _steps_of_every_parameter(model2, step2, 4)
    assert len(calls) == 1  # the first makes Adam's moments; then the kernel alone


def test_a_step_set_on_the_optimizer_is_called_for_every_step():
    # a wrapper that counts steps or injects a fault after one (tests/integration/test_failed_run.py) sets
    # ``step`` on the instance: the direct kernel must not go around it
    model = TwoHeads()
    opt = torch.optim.Adam(model.parameters(), lr=3e-4, eps=1e-5, fused=True)
    calls, step_of_class = [], opt.step
    opt.step = lambda *a, **k: calls.append(1) or step_of_class(*a, **k)
    step = optim.GradientStep(model, opt, 0.5)
    assert not step.direct_adam
    _steps_of_every_parameter(model, step, 3)
    assert len(calls) == 3


@pytest.mark.parametrize("make", [
    lambda params: torch.optim.Adam(params, lr=1e-3),  # not fused
    lambda params: torch.optim.Adam(params, lr=1e-3, fused=True, weight_decay=0.1),
    lambda params: torch.optim.SGD(params, lr=1e-3),
])
def test_other_optimizers_go_through_their_own_step(make):
    reference, mine = TwoHeads(), None
    mine = copy.deepcopy(reference)
    opt_ref, opt_mine = make(reference.parameters()), make(mine.parameters())
    step = optim.GradientStep(mine, opt_mine, 0.5)
    assert not step.direct_adam
    x = torch.randn(8, 11, generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        opt_ref.zero_grad(set_to_none=False)
        step.zero()
        for model in (reference, mine):
            (model.actor(x).pow(2).sum() + model.critic(x).sum() + model.log_std.sum()).backward()
        nn.utils.clip_grad_norm_(reference.parameters(), 0.5)
        step.clip()
        opt_ref.step()
        step.step(skip=torch.tensor(False))
    assert _bits(mine.parameters()) == _bits(reference.parameters())


def test_an_update_through_ppo_optimize_is_bitwise_the_one_torch_functions_give(monkeypatch):
    """The whole update: ppo.optimize with the direct step, and with every call sent to torch's functions."""
    def run(direct: bool) -> list[bytes]:
        torch.manual_seed(3)
        model = TwoHeads()
        opt = torch.optim.Adam(model.parameters(), lr=3e-4, eps=1e-5, fused=True)
        if not direct:
            monkeypatch.setattr(optim.GradientStep, "_bound", lambda self: None)
        data = torch.Generator().manual_seed(4)
        obs, actions = torch.randn(256, 11, generator=data), torch.randn(256, 3, generator=data)
        advantages, returns = torch.randn(256, generator=data), torch.randn(256, generator=data)
        old_value = torch.randn(256, generator=data)

        def minibatch(idx: torch.Tensor, _host: np.ndarray) -> ppo.Minibatch:
            mean, value = model.actor(obs[idx]), model.critic(obs[idx]).squeeze(-1)
            logprob = (-0.5 * ((actions[idx] - mean) / model.log_std.exp()).pow(2) - model.log_std).sum(-1)
            old = logprob.detach() + 0.01
            return logprob, old, advantages[idx], value, old_value[idx], returns[idx], logprob.detach() * 0
        settings = ppo.Settings(epochs=3, minibatches=4, clip_coef=0.2, clip_vloss=True, vf_coef=0.5, ent_coef=0.0,
                                max_grad_norm=0.5, norm_adv=True, target_kl=None)
        ppo.optimize(model, opt, minibatch, 256, settings, generator=torch.Generator().manual_seed(5))
        monkeypatch.undo()
        return _bits(model.parameters())
    assert run(direct=True) == run(direct=False)
