"""Actions of several parts: MultiDiscrete, MultiBinary, and Dict or Tuple of Discrete, MultiDiscrete,
MultiBinary and Box. One flat vector per action, a head per part, sampled from the supplied noise."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from lockstep.algo import noise
from lockstep.config import ModelConfig
from lockstep.envs import EnvSpec, SpaceSpec, action_spec, env_actions, env_spec, make_vector_env
from lockstep.envs.tasks import Knobs
from lockstep.models import build_policy

OBS = SpaceSpec.from_space(gym.spaces.Box(0.0, 1.0, (3,), np.float32))
MIXED = gym.spaces.Dict({"button": gym.spaces.Discrete(3), "dial": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
                         "keys": gym.spaces.MultiDiscrete([2, 5]), "switches": gym.spaces.MultiBinary(3)})


def _policy(space: gym.Space, lstm: int = 0):
    torch.manual_seed(0)
    return build_policy(OBS, action_spec(space), ModelConfig(hidden=[8], lstm_size=lstm))


def test_a_multidiscrete_action_is_a_categorical_per_dimension_with_the_log_probs_summed():
    policy = _policy(gym.spaces.MultiDiscrete([3, 4]))
    assert (policy.action_dim, policy.noise_width, policy.action_shape) == (7, 7, (2,))
    obs = torch.rand(6, 3)
    uniform = torch.as_tensor(noise.uniform(noise.slot_keys(1, 0, 6), np.zeros(6, np.uint64), policy.noise_width),
                              dtype=torch.float32)
    action, logprob, _, _ = policy.step(obs, uniform, torch.zeros(6, 0))
    assert action.dtype == torch.long and action.shape == (6, 2)
    assert (action[:, 0] < 3).all() and (action[:, 1] < 4).all()
    again, logprob_again, _, _ = policy.step(obs, uniform, torch.zeros(6, 0))  # the noise decides, nothing else
    assert torch.equal(action, again) and torch.equal(logprob, logprob_again)
    head, _ = policy.features(obs)
    first, second = head[:, :3].log_softmax(-1), head[:, 3:].log_softmax(-1)
    by_hand = first.gather(-1, action[:, :1]) + second.gather(-1, action[:, 1:])
    assert torch.allclose(logprob, by_hand.squeeze(-1))
    # training and the audit recompute the same log-prob from the stored action, bit for bit
    recomputed, entropy = policy.evaluate_head(head, action)
    assert torch.equal(recomputed, logprob)
    entropies = policy.entropy_by_entry(obs[None], torch.zeros(1, 6, dtype=torch.bool), torch.zeros(6, 0),
                                        torch.ones(1, 6, dtype=torch.bool))
    assert list(entropies) == ["[0]", "[1]"]
    assert entropies["[0]"] <= np.log(3) + 1e-6 and entropies["[1]"] <= np.log(4) + 1e-6
    assert np.isclose(sum(entropies.values()), float(entropy.detach().mean()), atol=1e-5)


@pytest.mark.parametrize("lstm", [0, 8])
def test_a_dict_of_every_part_samples_and_recomputes_its_log_prob(lstm):
    policy = _policy(MIXED, lstm)
    # button 1 + dial 2 + keys 2 + switches 3: float32, since a Box part is in it
    assert policy.action_shape == (8,) and not policy.action_long
    assert policy.noise_width == 3 + 2 + 5 + 2 * 3 + 2 * 2
    obs, state = torch.rand(5, 3), torch.as_tensor(policy.initial_state(5))
    uniform = torch.as_tensor(noise.uniform(noise.slot_keys(2, 0, 5), np.zeros(5, np.uint64), policy.noise_width),
                              dtype=torch.float32)
    action, logprob, _, _ = policy.step(obs, uniform, state)
    recomputed, _ = policy.evaluate_step(obs, action, state)
    assert torch.equal(recomputed, logprob)
    parts = env_actions(action.detach().numpy(), action_spec(MIXED))
    assert set(parts) == {"button", "dial", "keys", "switches"}
    assert parts["button"].shape == (5,) and parts["keys"].shape == (5, 2) and parts["switches"].dtype == np.int8
    assert all(MIXED.contains({k: v[i] for k, v in parts.items()}) for i in range(5))
    labels = list(policy.entropy_by_entry(obs[None], torch.zeros(1, 5, dtype=torch.bool), state,
                                          torch.ones(1, 5, dtype=torch.bool)))
    assert labels == ["button", "keys[0]", "keys[1]", "switches[0]", "switches[1]", "switches[2]", "dial[0]",
                      "dial[1]"]
    mode, _ = policy.mode(obs, state)
    assert mode.shape == (5, 8)


def test_a_tuple_action_is_stepped_as_a_tuple_and_its_box_part_clipped():
    space = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Box(-1.0, 1.0, (1,), np.float32)))
    parts = env_actions(np.array([[1.0, 7.5], [0.0, -3.0]], np.float32), action_spec(space))
    assert isinstance(parts, tuple) and parts[0].tolist() == [1, 0] and parts[1].tolist() == [[1.0], [-1.0]]


def test_the_actor_clips_the_box_part_of_a_dict_action_and_the_env_gets_its_parts():
    from lockstep.actor import EnvLoop

    spec: EnvSpec = env_spec("lockstep.envs.tasks:Knobs")
    vec = make_vector_env("lockstep.envs.tasks:Knobs", 2)
    loop = EnvLoop(vec, spec.action)
    loop.reset([0, 1])
    # the flat vector: button, dial, switches[0], switches[1]
    loop.step(np.array([[2.0, 4.0, 1.0, 0.0], [0.0, -0.25, 0.0, 1.0]], np.float32))
    first, second = (env.unwrapped.last_action for env in vec.unwrapped.envs)
    assert int(first["button"]) == 2 and first["dial"].tolist() == [1.0] and first["switches"].tolist() == [1, 0]
    assert int(second["button"]) == 0 and second["dial"].tolist() == [-0.25]
    assert loop.reward.tolist() == [2.5, pytest.approx(0.25)]  # the clipped dial's reward, 1 - |1 - 0.5|
    vec.close()
    assert isinstance(Knobs().action_space, gym.spaces.Dict)


def test_a_nested_or_unsupported_action_space_is_refused_by_name():
    with pytest.raises(ValueError, match="must not nest"):
        action_spec(gym.spaces.Dict({"a": gym.spaces.Dict({"b": gym.spaces.Discrete(2)})}))
    with pytest.raises(ValueError, match="must not nest"):
        action_spec(gym.spaces.Dict({"a": gym.spaces.Tuple((gym.spaces.Discrete(2),))}))
    with pytest.raises(ValueError, match="unsupported action space"):
        action_spec(gym.spaces.Text(4))
