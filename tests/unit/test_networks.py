"""The MLP's functional forward (``networks.Chain``) is nn.Sequential's, bit for bit, forward and backward."""

from __future__ import annotations

import copy

import torch
from torch import nn

from lockstep.models.networks import Chain, mlp, mlp_torso


def _as_sequential(chain: Chain) -> nn.Sequential:
    return nn.Sequential(*copy.deepcopy(list(chain)))  # the same layers and weights, called as modules


def test_chain_gives_sequential_bits_and_gradients():
    torch.manual_seed(0)
    for activation in ("tanh", "relu"):
        for net in (mlp(11, [64, 64], 3, activation, 0.01), mlp_torso(11, [32, 16], activation)[0]):
            plain = _as_sequential(net)
            assert type(plain) is nn.Sequential and list(plain.state_dict()) == list(net.state_dict())
            for rows in (1, 7):
                x = torch.randn(rows, 11) * 3
                out, ref = net(x), plain(x)
                assert torch.equal(out, ref)
                out.square().sum().backward()
                grads = [p.grad.clone() for p in net.parameters()]
                net.zero_grad()
                ref.square().sum().backward()
                for g, p in zip(grads, plain.parameters()):
                    assert torch.equal(g, p.grad)
                plain.zero_grad()


def test_chain_calls_other_modules_as_modules():
    class Double(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * x

    chain = Chain(nn.Linear(2, 2), Double())
    x = torch.ones(1, 2)
    assert torch.equal(chain(x), 2 * chain[0](x))


def test_image_pixels_enter_the_network_in_zero_to_one_whatever_cnn_takes_them():
    """A 32x32 RGB leaf (below the Nature CNN's 36 pixels: the small CNN) is scaled by 1/255 as an 84x84 frame
    is; MinAtar's {0, 1} channels stay as they are; the normalizer skips images, so the network must scale."""
    import gymnasium as gym
    import numpy as np

    from lockstep.envs import SpaceSpec
    from lockstep.models.encoders import leaf_encoder

    cases = {(3, 32, 32, 255): 1.0, (3, 84, 84, 255): 1.0, (4, 10, 10, 1): 1.0, (2, 40, 40, 1): 1.0}
    for (c, h, w, top), brightest in cases.items():
        leaf = SpaceSpec.from_space(gym.spaces.Box(0, top, (c, h, w), np.uint8))
        encoder, _ = leaf_encoder(leaf)
        scaled = encoder[0](torch.full((1, c, h, w), top, dtype=torch.uint8))  # the first module: the scale
        assert scaled.max().item() == brightest, (c, h, w, top)
