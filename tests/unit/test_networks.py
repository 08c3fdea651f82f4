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


def test_a_discrete_observation_enters_one_hot_and_a_tiny_grid_as_a_vector():
    """FrozenLake's Discrete(16) observation is an index: one-hot before the MLPs (a [B] batch, not [B, 1]);
    a [C, H, W] grid under 3x3 pixels is too small for the CNNs' 3x3 convolution: an MLP's vector, flat or as
    a Dict leaf; model.kind small-cnn on it is refused by name."""
    import gymnasium as gym
    import numpy as np
    import pytest

    from lockstep.config import ModelConfig
    from lockstep.envs import SpaceSpec, action_spec
    from lockstep.models import build_policy
    from lockstep.models.build import torso_kind

    act = action_spec(gym.spaces.Discrete(4))
    cases = [(gym.spaces.Discrete(16), 0), (gym.spaces.Discrete(16), 8), (gym.spaces.MultiDiscrete([3, 5]), 0)]
    for space, lstm in cases:
        policy = build_policy(SpaceSpec.from_space(space), act, ModelConfig(hidden=[8], lstm_size=lstm))
        obs = torch.as_tensor(np.stack([space.sample() for _ in range(6)]))  # [6] or [6, 2] indices
        _, _, value, _ = policy.step(obs, torch.rand(6, policy.noise_width), torch.as_tensor(policy.initial_state(6)))
        assert value.shape == (6,)
    tiny = SpaceSpec.from_space(gym.spaces.Box(0, 255, (1, 2, 2), np.uint8))
    assert torso_kind(tiny, "auto") == "mlp" and not tiny.image
    build_policy(tiny, act, ModelConfig(hidden=[8])).features(torch.zeros(3, 1, 2, 2))  # normalized: floats
    leaf = SpaceSpec.from_space(gym.spaces.Dict({"view": gym.spaces.Box(0, 255, (3, 2, 5), np.uint8)}))
    build_policy(leaf, act, ModelConfig(hidden=[8])).features({"view": torch.zeros(3, 3, 2, 5, dtype=torch.uint8)})
    with pytest.raises(ValueError, match=r"model.kind small-cnn needs image observations .* of at least 3x3"):
        build_policy(tiny, act, ModelConfig(hidden=[8], kind="small-cnn"))


def test_a_model_kind_the_observations_cannot_take_is_a_config_error_before_training(tmp_path, capsys):
    """``model.kind small-cnn`` on CartPole's flat observation: ``lockstep train`` exits 2 with one line that
    names the key, as for any other config error, instead of a traceback out of the learner's start."""
    from lockstep import cli

    code = cli.main(["train", "--env", "CartPole-v1", "--transport", "inprocess", "--actors", "1",
                     "--no-progress", "--run-dir", str(tmp_path / "run"), "--set", "model.kind=small-cnn"])
    assert code == 2
    assert "config error: model.kind small-cnn needs image observations" in capsys.readouterr().err
    assert not (tmp_path / "run" / "metrics.csv").exists()
