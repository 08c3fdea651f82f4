"""The optimizer's part of a gradient step: zero the gradients, clip their norm, take Adam's step.

``torch.optim.Adam.step`` and ``nn.utils.clip_grad_norm_`` spend most of their time, for the small
networks of PPO, in Python: grouping the tensors by device and dtype, walking the module for its
parameters, the optimizer's hooks and profiler records. ``GradientStep`` binds the lists of tensors once
per update and calls the kernels those functions end in (``_foreach_zero_``, ``_foreach_norm``,
``_foreach_mul_``, ``_fused_adam_``) directly, in the same order with the same arguments: the same bits
(``tests/unit/test_optim.py``) without that Python (docs/benchmarks/2026-12-03-optimizer-and-env-loop.md
measures the difference).

Where that equivalence is not plain (an optimizer other than fused Adam with one parameter group and
default options, parameters on several devices or of several dtypes), the step goes through
``optimizer.step()`` and ``clip_grad_norm_`` as usual.
"""

from __future__ import annotations

import torch
from torch import nn


def _direct_adam(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer``'s step is fused Adam's kernel alone, with nothing that torch.optim adds to it and
    nothing put in its place (a ``step`` set on the instance, as a wrapper that counts or injects faults does)."""
    if type(optimizer) is not torch.optim.Adam or len(optimizer.param_groups) != 1 or "step" in vars(optimizer):
        return False
    if not hasattr(torch, "_fused_adam_"):
        return False
    group = optimizer.param_groups[0]
    plain = dict(amsgrad=False, maximize=False, foreach=None, capturable=False, differentiable=False,
                 decoupled_weight_decay=False)
    return (bool(group.get("fused")) and group.get("weight_decay", 0) == 0 and not isinstance(group["lr"], torch.Tensor)
            and all(group.get(key, value) == value for key, value in plain.items())
            and not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks)


def _skips_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer.step`` reads a ``found_inf`` flag and skips on the device when it is set (fused Adam:
    the flag torch's GradScaler uses), so that deciding to skip a step needs no value read back."""
    return bool(getattr(optimizer, "_step_supports_amp_scaling", False))


class GradientStep:
    """Zeroing, clipping and the optimizer step of one update's minibatches, for ``model``'s parameters.

    Invariant: the tensors bound (gradients, Adam's moments and step counts) are the ones the model and the
    optimizer hold; every call checks that the gradients still are (backward accumulates into them in place)
    and otherwise goes through torch's functions for the rest of the update.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, max_grad_norm: float) -> None:
        self.optimizer = optimizer
        self.max_grad_norm = float(max_grad_norm)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.grads: list[torch.Tensor] | None = None  # bound once every parameter has one (after a backward pass)
        self.adam: tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]] | None = None
        self.direct_adam = _direct_adam(optimizer)

    def _bound(self) -> list[torch.Tensor] | None:
        """The gradients, bound on first use, while they are the parameters' own and all of one kind."""
        if self.grads is None:
            grads = [p.grad for p in self.params if p.grad is not None]
            if not grads or len(grads) != len(self.params):
                return None  # a parameter without a gradient: torch's functions decide what to do with it
            kinds = {(g.device, g.dtype) for g in grads}
            if len(kinds) != 1 or any(g.is_sparse for g in grads):
                return None
            self.grads = grads
        if any(p.grad is not g for p, g in zip(self.params, self.grads)):
            self.grads, self.direct_adam = None, False  # replaced: no more direct calls in this update
            return None
        return self.grads

    def zero(self) -> None:
        """``optimizer.zero_grad(set_to_none=False)``."""
        grads = self._bound()
        if grads is None:
            self.optimizer.zero_grad(set_to_none=False)
        else:
            torch._foreach_zero_(grads)

    def clip(self) -> torch.Tensor:
        """``nn.utils.clip_grad_norm_(params, max_grad_norm)``: scale the gradients to at most that norm and
        return their norm before scaling (a 0-d tensor, not read back)."""
        grads = self._bound()
        if grads is None:
            return nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        with torch.no_grad():
            norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
            torch._foreach_mul_(grads, torch.clamp(self.max_grad_norm / (norm + 1e-6), max=1.0))
        return norm

    def step(self, skip: torch.Tensor) -> None:
        """``optimizer.step()`` unless ``skip`` (0-d bool): an optimizer that reads a ``found_inf`` flag (fused
        Adam) skips on the device, without a read back; another reads ``skip`` back and steps or not."""
        if _skips_on_device(self.optimizer):
            self._step(skip.float())
        elif not skip.item():
            self._step(None)

    def _step(self, found_inf: torch.Tensor | None) -> None:
        grads = self._bound() if self.direct_adam else None
        if grads is None or not self._adam_state():
            self._torch_step(found_inf)
            return
        exp_avgs, exp_avg_sqs, steps = self.adam
        group = self.optimizer.param_groups[0]
        beta1, beta2 = group["betas"]
        with torch.no_grad():
            torch._foreach_add_(steps, 1)
            torch._fused_adam_(self.params, grads, exp_avgs, exp_avg_sqs, [], steps, amsgrad=False, lr=group["lr"],
                               beta1=float(beta1), beta2=float(beta2), weight_decay=0.0, eps=group["eps"],
                               maximize=False, grad_scale=None, found_inf=found_inf)
            if found_inf is not None:
                torch._foreach_sub_(steps, [found_inf] * len(steps))

    def _adam_state(self) -> bool:
        """Bind Adam's moments and step counts; False before its first step has made them."""
        if self.adam is None:
            states = [self.optimizer.state.get(p, {}) for p in self.params]
            if not all({"exp_avg", "exp_avg_sq", "step"} <= state.keys() for state in states):
                return False
            self.adam = ([s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                         [s["step"] for s in states])
        return True

    def _torch_step(self, found_inf: torch.Tensor | None) -> None:
        if found_inf is None:
            self.optimizer.step()
            return
        self.optimizer.found_inf = found_inf
        try:
            self.optimizer.step()
        finally:
            del self.optimizer.found_inf  # the optimizer's next user must not skip on this flag
