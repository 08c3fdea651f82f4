"""Per-leaf encoders for Dict and Tuple observations, concatenated (as SB3's CombinedExtractor does).

Each leaf of the observation (``envs.spaces``) has its own encoder, chosen by its space:

==========================  ==========================================================  ===================
leaf                        encoder                                                     features
==========================  ==========================================================  ===================
uint8 Box [C, H, W]         the CNN family, pixels scaled into [0, 1] by the space's    512 or 128
                            bound (1/255; MinAtar's 0/1 channels by 1), the Nature CNN
                            from 36 pixels up, the small MinAtar CNN below
Discrete(n)                 one-hot                                                     n
MultiDiscrete(nvec)         one-hot per entry, side by side                             sum(nvec)
Box, MultiBinary            the values, flattened, as float32                           prod(shape)
==========================  ==========================================================  ===================

The features of every leaf, in the spec's leaf order, are concatenated: a feedforward policy feeds them to
separate actor and critic MLPs (``feedforward.LeafActorCritic``, an image leaf's CNN shared by both), a
recurrent one to the MLP of ``model.hidden``, an LSTM and the heads (``build.build_policy``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from lockstep.envs import SpaceSpec
from lockstep.models.networks import nature_cnn, pixel_scale, small_cnn


class OneHot(nn.Module):
    """Discrete values [B, *shape] -> one-hot rows [B, sum(nvec)], entry i one-hot over ``nvec[i]`` choices."""

    def __init__(self, nvec: tuple[int, ...]) -> None:
        super().__init__()
        offsets = torch.tensor([0, *nvec[:-1]], dtype=torch.long).cumsum(0)
        self.register_buffer("offsets", offsets, persistent=False)  # [d] where each entry's choices begin
        self.width = sum(nvec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        index = x.long().reshape(x.shape[0], -1) + self.offsets  # [B, d]
        return torch.zeros((x.shape[0], self.width), device=x.device).scatter_(1, index, 1.0)


class Flat(nn.Module):
    """Values [B, *shape] -> [B, prod(shape)] float32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], -1).float()


def leaf_encoder(leaf: SpaceSpec) -> tuple[nn.Module, int]:
    """The encoder of one leaf and its feature width (module docstring)."""
    if leaf.image:
        make = nature_cnn if min(leaf.shape[1:]) >= 36 else small_cnn
        return make(leaf.shape[0], tuple(leaf.shape[1:]), pixel_scale(leaf))
    if leaf.kind == "discrete":
        return OneHot((leaf.n,)), leaf.n
    if leaf.kind == "multi_discrete":
        return OneHot(leaf.nvec), sum(leaf.nvec)
    return Flat(), math.prod(leaf.shape)


def flat_encoder(observation: SpaceSpec) -> tuple[nn.Module | None, int]:
    """What a flat (not Dict or Tuple) observation goes through before an MLP, and the width it gives: the
    one-hot of a Discrete or MultiDiscrete one (an index is no magnitude), None for the values themselves."""
    if observation.kind in ("discrete", "multi_discrete"):
        return leaf_encoder(observation)
    return None, math.prod(observation.shape)


class LeafEncoders(nn.Module):
    """A dict of leaves {path: [B, *leaf]} -> the concatenated features [B, width] of each leaf's encoder."""

    def __init__(self, observation: SpaceSpec) -> None:
        super().__init__()
        self.paths = observation.paths()
        built = [leaf_encoder(leaf) for _, leaf in observation.leaves]
        # by position: a path may hold dots, which a module name may not
        self.encoders = nn.ModuleList(module for module, _ in built)
        self.widths = {path: width for path, (_, width) in zip(self.paths, built)}
        self.width = sum(self.widths.values())

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat(self.features(obs), -1)

    def features(self, obs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        """Each leaf's features [B, width of the leaf], in the spec's leaf order."""
        return [encode(obs[path]) for path, encode in zip(self.paths, self.encoders)]
