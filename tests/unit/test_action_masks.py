"""Action masks: a Dict observation's ``action_mask`` leaf forbids choices of the Discrete and
MultiDiscrete heads in sampling, the stored log-prob, training, evaluation and the audit alike."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from lockstep.algo import noise
from lockstep.algo.normalize import ObsNormalizer, as_tensors
from lockstep.config import ModelConfig
from lockstep.envs import SpaceSpec, action_spec, env_spec, stack_records, with_action_mask
from lockstep.learner.inference import act
from lockstep.models import build_policy
from lockstep.transport.codec import CodecError
from lockstep.transport.messages import check_action_mask

FORBIDDEN = "lockstep.envs.tasks:Forbidden"  # action_mask MultiBinary(5), clock; Discrete(5)
CPU = torch.device("cpu")
DRAWS = 10_000


def _records(spec: SpaceSpec, mask: list[int], rows: int) -> np.ndarray:
    return stack_records([{"action_mask": np.array(mask, np.int8), "clock": np.zeros(1, np.float32)}] * rows, spec)


def _draw(policy, records: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One action for each of ``len(records)`` slots, each from its own noise stream, as the learner samples."""
    rows = len(records)
    uniform = noise.uniform(noise.slot_keys(7, 0, rows), np.zeros(rows, np.uint64), policy.noise_width)
    actions, logprobs, _, _ = act(policy, ObsNormalizer(None, None, 10.0, CPU), records, uniform,
                                  policy.initial_state(rows), CPU)
    return actions, logprobs


def test_a_masked_action_is_never_sampled_in_10000_draws():
    spec = env_spec(FORBIDDEN, action_mask_key="action_mask")
    assert spec.observation.mask == "action_mask" and spec.observation.mask_groups == (5,)
    policy = build_policy(spec.observation, spec.action, ModelConfig(hidden=[8]))
    with torch.no_grad():  # the network wants action 0, which the mask forbids, above everything else
        policy.actor[-1].bias[:] = torch.tensor([50.0, 0.0, 0.0, 1.0, 0.0])  # the actor MLP's output layer
    records = _records(spec.observation, [0, 1, 0, 1, 0], DRAWS)
    actions, logprobs = _draw(policy, records)
    assert set(np.unique(actions).tolist()) == {1, 3}  # both allowed ones drawn, nothing else
    assert 0.6 < float((actions == 3).mean()) < 0.85  # e / (1 + e) of the two allowed ones' logits
    assert np.isfinite(logprobs).all() and (logprobs > -5).all()
    # the stored log-prob is the masked one, and training and the audit recompute the same
    obs = as_tensors(records[:4], CPU)
    recomputed, _ = policy.evaluate_step(obs, torch.as_tensor(actions[:4]), torch.zeros(4, 0))
    assert torch.equal(recomputed, torch.as_tensor(logprobs[:4]))
    mode, _ = policy.mode(obs, torch.zeros(4, 0))  # deterministic evaluation keeps to the mask too
    assert mode.tolist() == [3, 3, 3, 3]
    unmasked = build_policy(SpaceSpec.from_space(gym.spaces.Dict(
        {"action_mask": gym.spaces.MultiBinary(5), "clock": gym.spaces.Box(0.0, 1.0, (1,), np.float32)})),
        spec.action, ModelConfig(hidden=[8]))
    with torch.no_grad():
        unmasked.load_state_dict(policy.state_dict())
    assert (_draw(unmasked, records[:100])[0] == 0).all()  # what the mask prevents


def test_a_multidiscrete_action_is_masked_per_dimension():
    observation = SpaceSpec.from_space(gym.spaces.Dict({"action_mask": gym.spaces.MultiBinary(5),
                                                        "clock": gym.spaces.Box(0.0, 1.0, (1,), np.float32)}))
    action = action_spec(gym.spaces.MultiDiscrete([3, 2]))
    observation = with_action_mask(observation, action, "action_mask")
    assert observation.mask_groups == (3, 2)
    policy = build_policy(observation, action, ModelConfig(hidden=[8]))
    actions, logprobs = _draw(policy, _records(observation, [0, 1, 1, 1, 0], DRAWS))
    assert set(map(tuple, actions.tolist())) == {(1, 0), (2, 0)}
    assert np.isfinite(logprobs).all()


def test_the_entropy_of_each_part_is_of_the_masked_distribution():
    """``entropy/PART`` in the metrics: a part whose mask leaves one choice has entropy 0, one that leaves two
    at most log 2, whatever the network's logits for the choices the mask forbids."""
    observation = SpaceSpec.from_space(gym.spaces.Dict({"action_mask": gym.spaces.MultiBinary(5),
                                                        "clock": gym.spaces.Box(0.0, 1.0, (1,), np.float32)}))
    action = action_spec(gym.spaces.MultiDiscrete([3, 2]))
    observation = with_action_mask(observation, action, "action_mask")
    policy = build_policy(observation, action, ModelConfig(hidden=[8]))
    obs = as_tensors(_records(observation, [0, 1, 0, 1, 1], 6), CPU)  # part [0]: choice 1 only; part [1]: both
    obs = {path: x[None] for path, x in obs.items()}  # [T=1, N=6, *leaf]
    entropies = policy.entropy_by_entry(obs, torch.zeros(1, 6, dtype=torch.bool), torch.zeros(6, 0),
                                        torch.ones(1, 6, dtype=torch.bool))
    assert entropies["[0]"] == pytest.approx(0.0, abs=1e-6)
    assert 0.0 < entropies["[1]"] <= np.log(2) + 1e-6


def test_a_mask_that_cannot_mask_the_action_is_refused_at_start_by_name():
    observation = SpaceSpec.from_space(gym.spaces.Dict({"action_mask": gym.spaces.MultiBinary(4),
                                                        "clock": gym.spaces.Box(0.0, 1.0, (1,), np.float32)}))
    with pytest.raises(ValueError, match=r"leaf 'action_mask' \(env.action_mask_key\) is MultiBinary.*of 5 elements"):
        with_action_mask(observation, action_spec(gym.spaces.Discrete(5)), "action_mask")
    with pytest.raises(ValueError, match="no Discrete, MultiDiscrete or MultiBinary part to mask.*action_mask_key"):
        with_action_mask(observation, action_spec(gym.spaces.Box(-1.0, 1.0, (4,))), "action_mask")
    assert with_action_mask(observation, action_spec(gym.spaces.Discrete(5)), "").mask == ""  # off


def test_a_slot_whose_mask_allows_nothing_is_refused_naming_the_slot():
    spec = env_spec(FORBIDDEN, action_mask_key="action_mask").observation
    records = _records(spec, [0, 0, 1, 0, 0], 3)
    check_action_mask(records, spec)
    records["action_mask"][2] = 0
    with pytest.raises(CodecError, match="leaf 'action_mask': env slot 2 allows no action"):
        check_action_mask(records, spec)
