"""A training update reads the device once (and the KL once per epoch with ``ppo.target_kl``), sends uint8
observations as bytes, skips non-finite steps on the device, and the LSTM finds its segments on the host.

Counted by ``lockstep_bench.syncs.HostSyncs`` on the CPU: the calls that wait for a GPU there. The numbers
of the update did not change with any of this (bit-identical parameters, Adam state and statistics for
the cases of ``lockstep_bench.syncs`` before and after: docs/performance.md, "Host syncs of an update")."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from lockstep_bench.syncs import CASES, HostSyncs, batch, trainer

from lockstep.algo import optim, ppo
from lockstep.config import ModelConfig
from lockstep.models import build_policy


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_update_reads_the_device_once_and_the_kl_once_per_epoch_with_a_target(name):
    plain, stopping = trainer(name), trainer(name, target_kl=1e9)  # a target that never stops its 2 epochs
    for model, expected in ((plain, 1), (stopping, 1 + 2)):
        with HostSyncs() as syncs:
            model.train(batch(name))
        assert syncs.count == expected, dict(syncs.by_name)


def test_uint8_observations_go_to_the_device_as_bytes_and_train_as_converted_on_the_host(monkeypatch):
    seen = []
    on_device, on_host = trainer("cnn-uint8"), trainer("cnn-uint8")
    normalize = on_device.normalizer
    monkeypatch.setattr(on_device, "normalizer", lambda: lambda obs: seen.append(obs.dtype) or normalize()(obs))
    as_bytes, as_floats = batch("cnn-uint8"), batch("cnn-uint8")
    for field in ("obs", "bootstrap_obs", "final_obs"):  # the old way: float32 on the host
        setattr(as_floats, field, getattr(as_floats, field).astype(np.float32))
    on_device.train(as_bytes)
    on_host.train(as_floats)
    assert seen and set(seen) == {torch.uint8}
    for a, b in zip(on_device.model.parameters(), on_host.model.parameters()):
        assert torch.equal(a, b)


def test_fused_adam_skips_a_non_finite_step_on_the_device_without_counting_it():
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1, fused=True)
    assert optim._skips_on_device(optimizer)

    def minibatch(idx: torch.Tensor, host_idx: np.ndarray) -> ppo.Minibatch:
        value = model(torch.ones(len(idx), 1)).squeeze(1)
        returns = torch.full_like(value, np.inf if host_idx[0] == 1 else 1.0)  # unit 1's minibatch: inf
        zeros = torch.zeros_like(value)
        return zeros, zeros, torch.ones_like(value), value, value.detach(), returns, zeros

    with HostSyncs() as syncs:
        stats = ppo.optimize(model, optimizer, minibatch, 4, ppo.Settings(
            epochs=1, minibatches=4, clip_coef=0.2, clip_vloss=False, vf_coef=0.5, ent_coef=0.0, max_grad_norm=10.0,
            norm_adv=False, target_kl=None))
    assert stats.skipped_steps == 1 and stats.gradient_steps == 3 and syncs.count == 1
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert all(float(optimizer.state[p]["step"]) == 3 for p in model.parameters())  # the skipped step uncounted
    assert not hasattr(optimizer, "found_inf")  # nothing left behind for the next user of the optimizer


def test_a_recurrent_inference_pass_reads_nothing_back_from_the_device():
    observation, action, model = CASES["lstm-box"]
    policy = build_policy(observation, action, ModelConfig(**model))
    obs, state = torch.randn(5, 3), torch.zeros(5, policy.state_size)
    with HostSyncs() as syncs:
        policy.step(obs, torch.rand(5, policy.noise_width), state)
        policy.value_after(obs, state)
    assert syncs.count == 0, dict(syncs.by_name)
