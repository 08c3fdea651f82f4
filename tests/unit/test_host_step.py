"""The numpy step of the built-in MLP policy (``models.host``) samples what torch's ``Policy.step`` samples.

``PolicySnapshot.step`` runs small batches of an ``ActorCritic`` on the CPU in numpy; everything else, and every
batch with ``learner.inference_kernel: torch``, goes through ``inference.act``. The two must agree to float32
rounding (the same discrete actions, log-probs within the audit's tolerance of torch's recomputation), and the
numpy step must refuse every policy whose forward pass it does not reproduce.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lockstep.algo import noise
from lockstep.algo.normalize import ObsNormalizer
from lockstep.config import ModelConfig
from lockstep.envs import SpaceSpec, env_spec
from lockstep.learner.inference import PolicySnapshot, act
from lockstep.models import ActorCritic, build_policy
from lockstep.models.host import MAX_PRODUCT, HostStep

CPU = torch.device("cpu")
AUDIT_TOLERANCE = 1e-5
HOPPER_OBS = SpaceSpec("box", (11,), "float32", low=np.full(11, -np.inf, np.float32),
                       high=np.full(11, np.inf, np.float32))
HOPPER_ACT = SpaceSpec("box", (3,), "float32", low=-np.ones(3, np.float32), high=np.ones(3, np.float32))
CARTPOLE = env_spec("CartPole-v1")


def _snapshot(model, obs_dim: int, kernel: str = "auto", normalized: bool = True) -> PolicySnapshot:
    rng = np.random.default_rng(1)
    mean, var = (rng.normal(size=obs_dim), rng.uniform(0.2, 5.0, size=obs_dim)) if normalized else (None, None)
    return PolicySnapshot(2, model, mean, var, 5.0, CPU, kernel)


def _inputs(rows: int, obs_dim: int, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    obs = (np.random.default_rng(rows).normal(size=(rows, obs_dim)) * 4).astype(np.float32)  # some clipped
    return obs, noise.uniform(noise.slot_keys(7, 0, rows), np.arange(rows), width), np.zeros((rows, 0), np.float32)


def _trained_looking(model: ActorCritic) -> ActorCritic:
    """Parameters away from the init (whose output layer is ~0): means of order 1, a std below 1."""
    torch.manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
        if hasattr(model, "log_std"):
            model.log_std.copy_(torch.tensor([-1.0, -0.5, 0.3])[: model.log_std.numel()])
    return model


@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("rows", [1, 4, 64])
def test_a_box_policy_samples_torchs_actions_and_logprobs_within_rounding(activation, rows):
    torch.manual_seed(0)
    model = _trained_looking(ActorCritic(HOPPER_OBS, HOPPER_ACT, [64, 64], activation))
    snapshot = _snapshot(model, 11)
    obs, uniform, state = _inputs(rows, 11, snapshot.noise_width)
    assert snapshot.host is not None and snapshot.host.takes(obs)
    got = snapshot.step(obs, uniform, state)
    want = act(snapshot.model, snapshot.normalize, obs, uniform, state, CPU)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
    np.testing.assert_allclose(got[0], want[0], rtol=0, atol=1e-5)  # actions
    np.testing.assert_allclose(got[1], want[1], rtol=0, atol=AUDIT_TOLERANCE / 2)  # log-probs
    np.testing.assert_allclose(got[2], want[2], rtol=1e-5, atol=1e-5)  # values
    assert not np.array_equal(got[0], np.zeros_like(got[0]))


def test_the_stored_logprob_is_what_torch_recomputes_from_the_stored_action():
    """The relation the PPO ratio and ``lockstep audit`` rely on: ``evaluate`` of the stored action, in torch at
    a training batch's size, gives back the log-prob the numpy step stored."""
    torch.manual_seed(0)
    model = _trained_looking(ActorCritic(HOPPER_OBS, HOPPER_ACT, [64, 64]))
    snapshot = _snapshot(model, 11)
    obs, uniform, state = _inputs(256, 11, snapshot.noise_width)
    stored = [snapshot.step(obs[i:i + 1], uniform[i:i + 1], state[i:i + 1]) for i in range(256)]  # batch 1: Hopper
    actions = torch.as_tensor(np.concatenate([s[0] for s in stored]))
    logprobs = np.concatenate([s[1] for s in stored])
    with torch.inference_mode():
        x = snapshot.normalize(torch.as_tensor(obs))
        recomputed = [snapshot.model.evaluate(x[None, i:i + 64], actions[None, i:i + 64],
                                              torch.zeros(1, 64, dtype=torch.bool), torch.zeros(64, 0))[0][0]
                      for i in range(0, 256, 64)]  # minibatches of 64, as training's
    assert np.abs(torch.cat(recomputed).numpy() - logprobs).max() <= AUDIT_TOLERANCE


def test_a_discrete_policy_samples_the_same_actions():
    model = build_policy(CARTPOLE.observation, CARTPOLE.action, ModelConfig(hidden=[64, 64]))
    for normalized in (True, False):
        snapshot = _snapshot(model, 4, normalized=normalized)
        obs, uniform, state = _inputs(4, 4, snapshot.noise_width)
        obs = np.repeat(obs, 16, 0)  # each observation under 16 noises: choices other than the likeliest
        uniform = noise.uniform(noise.slot_keys(9, 0, len(obs)), np.arange(len(obs)), snapshot.noise_width)
        state = np.zeros((len(obs), 0), np.float32)
        assert snapshot.host.takes(obs)
        got = snapshot.step(obs, uniform, state)
        want = act(snapshot.model, snapshot.normalize, obs, uniform, state, CPU)
        assert got[0].dtype == np.int64 and np.array_equal(got[0], want[0])
        assert len(np.unique(got[0])) == 2
        np.testing.assert_allclose(got[1], want[1], rtol=0, atol=AUDIT_TOLERANCE / 10)
        np.testing.assert_allclose(got[2], want[2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(5, 5), (3, 1), (2, 3, 2)])
def test_a_normalized_box_of_several_dimensions_is_normalized_per_element(shape):
    """The normalizer's moments have the observation's shape while the step flattens each row: a [5, 5] grid
    must not fail to broadcast, and a [3, 1] one at a batch of 3 must not broadcast into wrong numbers."""
    size = int(np.prod(shape))
    box = SpaceSpec("box", shape, "float32", low=np.full(shape, -np.inf, np.float32),
                    high=np.full(shape, np.inf, np.float32))
    torch.manual_seed(0)
    model = _trained_looking(ActorCritic(box, HOPPER_ACT, [64, 64]))
    rng = np.random.default_rng(1)
    snapshot = PolicySnapshot(2, model, rng.normal(size=shape), rng.uniform(0.2, 5.0, size=shape), 5.0, CPU, "auto")
    rows = shape[0]  # the batch as long as the first axis: where a wrong broadcast goes unnoticed
    obs, uniform, state = _inputs(rows, size, snapshot.noise_width)
    obs = obs.reshape(rows, *shape)
    assert snapshot.host is not None and snapshot.host.takes(obs)
    got = snapshot.step(obs, uniform, state)
    want = act(snapshot.model, snapshot.normalize, obs, uniform, state, CPU)
    np.testing.assert_allclose(got[1], want[1], rtol=0, atol=AUDIT_TOLERANCE / 2)  # log-probs
    np.testing.assert_allclose(got[2], want[2], rtol=1e-5, atol=1e-5)  # values


def test_a_repeated_step_gives_the_same_bits():
    torch.manual_seed(0)
    snapshot = _snapshot(_trained_looking(ActorCritic(HOPPER_OBS, HOPPER_ACT, [64, 64])), 11)
    obs, uniform, state = _inputs(4, 11, snapshot.noise_width)
    first, again = snapshot.step(obs, uniform, state), snapshot.step(obs.copy(), uniform.copy(), state)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))


def test_large_batches_and_the_torch_kernel_go_through_torch_bit_for_bit():
    torch.manual_seed(0)
    model = _trained_looking(ActorCritic(HOPPER_OBS, HOPPER_ACT, [64, 64]))
    snapshot = _snapshot(model, 11)
    rows = MAX_PRODUCT // (64 * 64) + 1  # the 64x64 layer's product is past one BLAS thread
    obs, uniform, state = _inputs(rows, 11, snapshot.noise_width)
    assert not snapshot.host.takes(obs) and snapshot.host.takes(obs[:-1])
    want = act(snapshot.model, snapshot.normalize, obs, uniform, state, CPU)
    assert all(np.array_equal(a, b) for a, b in zip(snapshot.step(obs, uniform, state), want))
    forced = _snapshot(model, 11, kernel="torch")
    assert forced.host is None
    small = obs[:3], uniform[:3], state[:3]
    want = act(forced.model, forced.normalize, *small, CPU)
    assert all(np.array_equal(a, b) for a, b in zip(forced.step(*small), want))


class _Changed(ActorCritic):
    """A subclass may change the forward pass: the numpy step must not assume it did not."""

    def features(self, obs):
        head, value = super().features(obs)
        return head * 2, value


def _refused() -> dict[str, tuple]:
    normalize = ObsNormalizer(None, None, 5.0, CPU)
    multi = SpaceSpec("multi_discrete", (2,), "int64", nvec=(3, 2))
    masked = build_policy(CARTPOLE.observation, CARTPOLE.action, ModelConfig(hidden=[8]))
    masked.action_mask = "mask"
    return {
        "a subclass": (_Changed(HOPPER_OBS, HOPPER_ACT, [8]), normalize, CPU),
        "a recurrent policy": (build_policy(CARTPOLE.observation, CARTPOLE.action,
                                            ModelConfig(hidden=[8], lstm_size=8)), normalize, CPU),
        "a MultiDiscrete action": (ActorCritic(HOPPER_OBS, multi, [8]), normalize, CPU),
        "an action mask": (masked, normalize, CPU),
        "a Dict observation's normalizer": (ActorCritic(HOPPER_OBS, HOPPER_ACT, [8]),
                                            ObsNormalizer({"a": np.zeros(2)}, {"a": np.ones(2)}, 5.0, CPU), CPU),
        "a GPU": (ActorCritic(HOPPER_OBS, HOPPER_ACT, [8]), normalize, torch.device("cuda")),
    }


@pytest.mark.parametrize("case", list(_refused()))
def test_what_it_does_not_reproduce_stays_with_torch(case):
    assert HostStep.of(*_refused()[case]) is None
    assert HostStep.of(ActorCritic(HOPPER_OBS, HOPPER_ACT, [8]), ObsNormalizer(None, None, 5.0, CPU), CPU)


def test_an_observation_of_another_width_or_records_is_not_taken():
    host = HostStep.of(ActorCritic(HOPPER_OBS, HOPPER_ACT, [8]), ObsNormalizer(None, None, 5.0, CPU), CPU)
    assert host.takes(np.zeros((2, 11), np.float32))
    assert not host.takes(np.zeros((2, 12), np.float32))
    assert not host.takes(np.zeros((0, 11), np.float32))
    assert not host.takes(np.zeros(2, [("a", np.float32, (11,))]))
