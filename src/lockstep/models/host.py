"""The built-in MLP policy's sampling step in numpy: inference at small batches on the CPU.

A step of CleanRL's 64x64 ``ActorCritic`` in torch is ~25 small operations (six linear layers, four
activations, the normalization, the noise and the head's sampling), each paying torch's dispatch, which at
batch 1 costs more than the arithmetic itself; a one-env preset (Hopper, HalfCheetah) pays that pass at
every env step. docs/performance.md ("The numpy step") measures both kernels.

``HostStep`` is that arithmetic: ``ObsNormalizer``, the MLPs of ``networks.mlp``, ``Policy.sample_head``
(Gumbel-max for a Discrete action, Box-Muller for a Box) and ``policy._gaussian``, in the same order and in
float32. Its outputs equal torch's up to float32 rounding (the matrix products and the transcendental
functions round differently in numpy's BLAS and libm than in torch's): the log-prob of each stored action
is still recomputed by torch in training and in the audit, whose tolerance (float32's rounding of the
log-prob's terms, ``tools.audit``) covers the difference, as it covers torch's own batch-1 and batch-64
products. A run stays bitwise repeatable: the same shapes give the same bits on every run.

It takes only what it computes exactly as ``Policy.step`` does: an ``ActorCritic`` itself (a subclass may
change its forward pass), one Discrete or Box action without an action mask, flat Box observations, and batches
whose largest layer product OpenBLAS computes on the calling thread (``MAX_PRODUCT``), so that no BLAS
thread wakes beside the trainer. Everything else goes to torch (``PolicySnapshot.step``).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from lockstep.models.feedforward import ActorCritic
from lockstep.models.policy import LOG_2PI

# OpenBLAS multiplies on the calling thread while rows x inputs x outputs <= 65536 x 4 (its
# GEMM_MULTITHREAD_THRESHOLD); above that, numpy's BLAS threads would wake beside the trainer's.
MAX_PRODUCT = 1 << 18
_TINY = np.float32(np.finfo(np.float32).tiny)
_BELOW_ONE = np.nextafter(np.float32(1), np.float32(0))
_ACTIVATIONS = {nn.Tanh: np.tanh, nn.ReLU: lambda x, out: np.maximum(x, 0, out=out)}


class HostStep:
    """``Policy.step`` of one frozen ``ActorCritic`` and its observation normalizer, on numpy arrays."""

    def __init__(self, actor: list, critic: list, log_std: np.ndarray | None, discrete: bool,
                 action_shape: tuple[int, ...], mean: np.ndarray | None, scale: np.ndarray | None,
                 clip: float) -> None:
        self.actor, self.critic = actor, critic  # [(weight^T [in, out], bias [out], activation or None)]
        self.log_std = log_std  # [d] float32 (a Box action), or None
        self.discrete = discrete
        self.action_shape = action_shape
        self.mean, self.scale, self.clip = mean, scale, np.float32(clip)  # mean None: no normalization
        self.inputs = actor[0][0].shape[0]
        self.widest = max(w.shape[0] * w.shape[1] for w, _, _ in actor + critic)

    @classmethod
    def of(cls, model: nn.Module, normalize, device: torch.device) -> HostStep | None:
        """The numpy step of ``model`` (frozen: its parameters are copied) with ``normalize`` (an
        ``ObsNormalizer`` of a flat observation), or None where it would not compute what torch computes."""
        if (device.type != "cpu" or type(model) is not ActorCritic or model.encode is not None
                or model.heads is not None or model.action_mask or getattr(normalize, "leaves", None) is not None):
            return None
        layers = [_layers(model.actor), _layers(model.critic)]
        if None in layers:
            return None
        log_std = None if model.discrete else model.log_std.detach().numpy().astype(np.float32)
        mean = scale = None
        if normalize.enabled:  # the observation's shape ([5, 5], say) flattened, as ``step`` flattens each row
            mean, scale = (t.detach().cpu().numpy().reshape(-1).copy() for t in (normalize.mean, normalize.scale))
        return cls(*layers, log_std, model.discrete, tuple(model.action_shape), mean, scale, normalize.clip)

    def takes(self, obs: np.ndarray) -> bool:
        """Whether this batch runs here: flat rows of the right width, few enough for one BLAS thread."""
        return (obs.dtype.names is None and obs.ndim >= 1 and 0 < len(obs)
                and obs[0].size == self.inputs and len(obs) * self.widest <= MAX_PRODUCT)

    def step(self, obs: np.ndarray, uniform: np.ndarray, state: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """obs [B, *obs], uniform [B, w] in (0, 1), state [B, 0] -> action [B, *act], log-prob [B] float32,
        value [B] float32, next state [B, 0] (``Policy.step`` through ``inference.act``)."""
        x = np.asarray(obs).reshape(len(obs), -1).astype(np.float32)  # [B, obs_dim], a copy
        if self.mean is not None:
            x -= self.mean
            x *= self.scale
            np.clip(x, -self.clip, self.clip, out=x)
        u = np.clip(np.asarray(uniform, np.float32), _TINY, _BELOW_ONE)  # as ``inference._noise``
        out, value = _forward(x, self.actor), _forward(x, self.critic)[:, 0]  # [B, action_dim], [B]
        if self.discrete:
            shifted = out - out.max(-1, keepdims=True)
            logits = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))  # log_softmax [B, n]
            action = (logits + -np.log(-np.log(u))).argmax(-1)  # Gumbel-max [B]
            logprob = np.take_along_axis(logits, action[:, None], -1)[:, 0]
            return action.astype(np.int64), logprob, value, np.asarray(state, np.float32)
        d = out.shape[1]
        z = np.sqrt(-2.0 * np.log(u[:, :d])) * np.cos(2.0 * math.pi * u[:, d:])  # Box-Muller: z ~ N(0, 1)
        std = np.exp(self.log_std)
        action = out + std * z  # [B, d]
        logprob = (-0.5 * ((action - out) / std) ** 2 - self.log_std - 0.5 * LOG_2PI).sum(-1)  # as _gaussian
        return (action.reshape(-1, *self.action_shape), logprob.astype(np.float32, copy=False), value,
                np.asarray(state, np.float32))


def _layers(chain: nn.Sequential) -> list | None:
    """A ``networks.mlp`` chain as [(weight^T, bias, activation after it or None)]; None if it holds anything
    else."""
    layers: list = []
    for module in chain:
        if type(module) is nn.Linear and module.bias is not None:
            weight = np.ascontiguousarray(module.weight.detach().numpy().T, np.float32)  # [in, out], a copy
            layers.append([weight, module.bias.detach().numpy().copy(), None])
        elif type(module) in _ACTIVATIONS and layers and layers[-1][2] is None:
            layers[-1][2] = _ACTIVATIONS[type(module)]
        else:
            return None
    return [tuple(layer) for layer in layers] if layers else None


def _forward(x: np.ndarray, layers: list) -> np.ndarray:
    """[B, in] through the chain's linear layers and activations -> [B, out] float32."""
    for weight, bias, activation in layers:
        x = x @ weight
        x += bias
        if activation is not None:
            activation(x, out=x)
    return x
