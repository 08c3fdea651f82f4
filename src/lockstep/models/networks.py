"""Torsos and layers with CleanRL's initialization: what turns an observation into features.

The MLP (orthogonal init, gain sqrt(2) in hidden layers), the Nature CNN for Atari frames and
the small MinAtar CNN. Each torso returns its module and its feature width; the policies put
heads (and an LSTM) on top.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lockstep.envs import SpaceSpec


def layer(inp: int, out: int, gain: float) -> nn.Linear:
    layer = nn.Linear(inp, out)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


class Chain(nn.Sequential):
    """``nn.Sequential`` whose forward calls linear layers and activations as functions.

    The same operations in the same order (bit for bit, and the same state-dict keys), without one
    module call per layer: at batch 1 the module machinery costs more than the arithmetic. Module
    hooks on the layers inside are therefore not called; other layers are called as modules.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for module in self:
            kind = type(module)
            if kind is nn.Linear:
                x = F.linear(x, module.weight, module.bias)
            elif kind is nn.Tanh:
                x = torch.tanh(x)
            elif kind is nn.ReLU:
                x = torch.relu(x)
            elif kind is nn.Flatten:
                x = x.flatten(module.start_dim, module.end_dim)
            else:
                x = module(x)
        return x


def mlp(inp: int, hidden: list[int], out: int, activation: str, out_gain: float) -> Chain:
    act = {"tanh": nn.Tanh, "relu": nn.ReLU}[activation]
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [layer(inp, width, math.sqrt(2)), act()]
        inp = width
    layers.append(layer(inp, out, out_gain))
    return Chain(*layers)


def pixel_scale(image: SpaceSpec) -> float:
    """The factor that brings an image leaf's pixels into [0, 1]: 1 / its space's largest bound (255 for RGB or
    grey frames, 1 for MinAtar's object channels), applied inside the network, on the learner."""
    top = float(np.max(image.high)) if image.high is not None and np.size(image.high) else 255.0
    return 1.0 / top if top > 0 else 1.0


def nature_cnn(channels: int, size: tuple[int, int], scale: float = 1 / 255) -> tuple[nn.Sequential, int]:
    """Mnih et al. (2015)'s torso for 84x84 frames, CleanRL's ``ppo_atari.py`` init: 512 features.

    [B, C, H, W] uint8 or float in [0, 1 / scale] -> [B, 512]; the pixels are scaled here, on the learner.
    """
    convs = nn.Sequential(
        conv(channels, 32, 8, 4), nn.ReLU(),
        conv(32, 64, 4, 2), nn.ReLU(),
        conv(64, 64, 3, 1), nn.ReLU(),
        nn.Flatten(),
    )
    with torch.no_grad():
        flat = convs(torch.zeros(1, channels, *size)).shape[1]
    return CNN(Scale(scale), *convs, layer(flat, 512, math.sqrt(2)), nn.ReLU()), 512


def small_cnn(channels: int, size: tuple[int, int], scale: float = 1.0) -> tuple[nn.Sequential, int]:
    """Young and Tian (2019)'s MinAtar torso: one 3x3 convolution with 16 filters, then 128 units.

    [B, C, H, W] in [0, 1 / scale] ({0, 1} for MinAtar's [C, 10, 10]) -> [B, 128].
    """
    convs = nn.Sequential(conv(channels, 16, 3, 1), nn.ReLU(), nn.Flatten())
    with torch.no_grad():
        flat = convs(torch.zeros(1, channels, *size)).shape[1]
    return CNN(Scale(scale), *convs, layer(flat, 128, math.sqrt(2)), nn.ReLU()), 128


class CNN(nn.Sequential):
    """A convolutional torso: ``nn.Sequential`` (the same layers and state-dict keys) whose passes with gradients
    may compute in a lower precision.

    ``update_dtype`` (``learner.update_precision``; None: float32) is the dtype that ``torch.autocast`` gives the
    convolutions and the linear layer in a pass that records gradients, the update's: the parameters, their
    gradients and the features handed on stay float32. Passes without gradients (inference, the values the
    update recomputes, the audit, an export's trace) compute in float32 always.
    """

    update_dtype: torch.dtype | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.update_dtype is None or not torch.is_grad_enabled():
            return super().forward(x)
        with torch.autocast(x.device.type, dtype=self.update_dtype):
            return super().forward(x).float()


def mlp_torso(inp: int, hidden: list[int], activation: str) -> tuple[Chain, int]:
    """Flat observations -> the last hidden layer's activations."""
    act = {"tanh": nn.Tanh, "relu": nn.ReLU}[activation]
    layers: list[nn.Module] = [nn.Flatten()]
    for width in hidden:
        layers += [layer(inp, width, math.sqrt(2)), act()]
        inp = width
    return Chain(*layers), inp


class Scale(nn.Module):
    """Multiply by a constant after converting to float (pixels travel as uint8)."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.factor == 1.0:  # MinAtar's {0, 1} grids, normalized frames: no pass over them for nothing
            return x.float()
        return x.float() * self.factor


def conv(inp: int, out: int, kernel: int, stride: int) -> nn.Conv2d:
    layer = nn.Conv2d(inp, out, kernel, stride)
    nn.init.orthogonal_(layer.weight, math.sqrt(2))
    nn.init.zeros_(layer.bias)
    return layer
