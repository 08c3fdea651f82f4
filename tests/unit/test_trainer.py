"""The trainer: bootstrap values and continuation masks, version-stamp checks, reward scaling, the optimizer.

Expected values are worked out by hand in the comments. The value function is a single
linear layer with known weights, V(o) = o[0] + 2 o[1] + 0.5, so every bootstrap value below
can be checked on paper.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from lockstep.algo import ppo
from lockstep.config import Config
from lockstep.envs import EnvSpec, SpaceSpec
from lockstep.learner.rollout import Batch
from lockstep.learner.trainer import OffPolicyError, RewardScaler, Trainer, adam, bootstrap

OBS = SpaceSpec("box", (2,), "float32", low=np.full(2, -np.inf, np.float32), high=np.full(2, np.inf, np.float32))
SPEC = EnvSpec("test", OBS, SpaceSpec("discrete", (), "int64", n=2))


def V(o0: float, o1: float) -> float:
    """The value function the linear trainer below is set up with."""
    return o0 + 2 * o1 + 0.5


def linear_trainer(max_lag: int | None = 0, normalize_reward: bool = False) -> Trainer:
    """A trainer whose critic is one linear layer with V(o) = o[0] + 2 o[1] + 0.5."""
    config = Config()
    config.model.hidden = []
    config.ppo.epochs, config.ppo.minibatches = 1, 1
    config.env.normalize_reward = normalize_reward
    trainer = Trainer(config, SPEC, torch.device("cpu"), max_lag=max_lag)
    (critic,) = trainer.model.critic
    with torch.no_grad():
        critic.weight.copy_(torch.tensor([[1.0, 2.0]]))
        critic.bias.copy_(torch.tensor([0.5]))
    return trainer


def value_fn(trainer: Trainer):
    """What ``Trainer.train`` bootstraps with: the critic on normalized raw observations."""
    normalize = trainer.normalizer()
    return lambda obs, *_: trainer.model.value_after(normalize(torch.as_tensor(obs, dtype=torch.float32)),
                                                     torch.zeros(len(obs), 0))  # a feedforward policy's state


def make_batch(values, *, members=None, slots=None, lengths=None, terminated=(), truncated=(), finals=(),
               bootstrap_obs=None, rewards=None, versions=0, version=0) -> Batch:
    """A [T, N] batch. ``terminated``/``truncated``: (t, n) pairs; ``finals``: (t, n, final observation)."""
    values = np.array(values, np.float32)
    T, N = values.shape
    members = members or (0,)
    slots = slots or (N,)
    term = np.zeros((T, N), bool)
    trunc = np.zeros((T, N), bool)
    for t, n in terminated:
        term[t, n] = True
    for t, n in [*truncated, *[(t, n) for t, n, _ in finals]]:
        trunc[t, n] = True
    return Batch(
        version=version, members=tuple(members), slots_per_member=tuple(slots),
        obs=np.zeros((T, N, 2), np.float32), actions=np.zeros((T, N), np.int64),
        logprobs=np.full((T, N), np.log(0.5), np.float32), values=values,
        rewards=np.zeros((T, N), np.float32) if rewards is None else np.array(rewards, np.float32),
        terminated=term, truncated=trunc,
        versions=np.broadcast_to(np.array(versions, np.int64), (T, N)).copy(),
        bootstrap_obs=np.zeros((N, 2), np.float32) if bootstrap_obs is None else np.array(bootstrap_obs, np.float32),
        lengths=np.full(N, T, np.int64) if lengths is None else np.array(lengths, np.int64),
        final_t=np.array([t for t, _, _ in finals], np.int64), final_n=np.array([n for _, n, _ in finals], np.int64),
        final_obs=np.array([o for _, _, o in finals], np.float32).reshape(len(finals), 2),
    )


# ---------------------------------------------------------------------------------------------
# bootstrap values and continuation masks
# ---------------------------------------------------------------------------------------------
# T=3, N=3. Member 0 owns slots 0 and 1, member 1 owns slot 2, whose unroll was cut short at length 2.
#   slot 0: terminated at t=1.
#   slot 1: truncated at t=0; its episode's last observation is (1, 1); row 1 holds the reset observation.
#   slot 2: cut short: step 1 is its last, bootstrapped from its bootstrap observation (1, 2).
MIXED = {
    "values": [[1, 2, 3],
               [4, 5, 6],
               [7, 8, 0]],  # slot 2 has no step 2: zeros, as an unroll leaves them
    "members": (0, 1), "slots": (2, 1), "lengths": [3, 3, 2],
    "terminated": [(1, 0)],
    "finals": [(0, 1, (1.0, 1.0))],
    "bootstrap_obs": [(2.0, 0.0), (0.0, 3.0), (1.0, 2.0)],
}
MIXED_NEXT_VALUES = [
    [4.0, V(1, 1), 6.0],  # ordinary: next row's value; truncated: V(final obs) = 3.5, not the reset row's 5
    [0.0, 8.0, V(1, 2)],  # terminated: 0; ordinary; cut short at L=2: V(bootstrap obs) = 5.5
    [V(2, 0), V(0, 3), 0.0],  # last step: V(bootstrap obs) = 2.5 and 6.5; past slot 2's cut: nothing
]
MIXED_CONTINUES = [
    [1.0, 0.0, 1.0],
    [0.0, 1.0, 0.0],  # slot 2's trace ends at its last step, L-1 = 1
    [0.0, 0.0, 0.0],
]


def test_value_function_of_the_linear_trainer_is_what_the_comments_say():
    trainer = linear_trainer()
    obs = np.array([[1, 1], [1, 2], [2, 0], [0, 3]], np.float32)
    np.testing.assert_array_equal(value_fn(trainer)(obs).detach().numpy(), [3.5, 5.5, 2.5, 6.5])
    assert [V(1, 1), V(1, 2), V(2, 0), V(0, 3)] == [3.5, 5.5, 2.5, 6.5]


def _bootstrap(trainer: Trainer, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
    with torch.no_grad():
        next_values, continues = bootstrap(batch, torch.as_tensor(batch.values), value_fn(trainer))
    assert next_values.shape == continues.shape == (batch.num_steps, batch.num_slots)
    assert next_values.dtype == continues.dtype == torch.float32
    return next_values.numpy(), continues.numpy()


def test_bootstrap_of_terminated_truncated_cut_short_and_ordinary_steps():
    next_values, continues = _bootstrap(linear_trainer(), make_batch(**MIXED))
    np.testing.assert_array_equal(next_values, MIXED_NEXT_VALUES)
    np.testing.assert_array_equal(continues, MIXED_CONTINUES)


def test_terminated_step_has_no_next_value_and_does_not_continue():
    next_values, continues = _bootstrap(linear_trainer(), make_batch(**MIXED))
    assert next_values[1, 0] == 0.0 and continues[1, 0] == 0.0
    assert next_values[0, 0] == 4.0 and continues[0, 0] == 1.0  # the step before it is ordinary


def test_truncated_step_bootstraps_from_its_final_observation_not_the_reset_observation():
    batch = make_batch(**MIXED)
    batch.obs[1, 1] = (5.0, 5.0)  # the reset observation, V = 15.5, and its behaviour value is 5
    next_values, continues = _bootstrap(linear_trainer(), batch)
    assert next_values[0, 1] == V(1, 1) == 3.5
    assert continues[0, 1] == 0.0


def test_slot_cut_short_bootstraps_at_its_last_step_and_owns_nothing_after():
    """T=4 and slot 1 acted only L=1 step: step 0 bootstraps from V(bootstrap obs); steps 1..3 are not its."""
    batch = make_batch(values=[[1, 2], [3, np.nan], [4, np.nan], [5, np.nan]],  # padding that must not leak
                       members=(0, 1), slots=(1, 1), lengths=[4, 1], bootstrap_obs=[(0, 0), (3, 1)])
    next_values, continues = _bootstrap(linear_trainer(), batch)
    np.testing.assert_array_equal(next_values, [[3.0, V(3, 1)], [4.0, 0.0], [5.0, 0.0], [V(0, 0), 0.0]])
    np.testing.assert_array_equal(continues, [[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 0.0]])


def test_episode_ending_at_a_slot_last_step_ignores_the_bootstrap_observation():
    """T=2. Slot 0 terminates at its last step, slot 1 is truncated at its last step (final obs (3, 0)),
    slot 2 is cut short at L=1 and truncated at step 0 (final obs (0, 1)), slot 3 cut short at L=1 and
    terminated at step 0. Every bootstrap observation is (2, 2), V = 6.5, and none of them may be used."""
    batch = make_batch(values=[[1, 2, 3, 4], [5, 6, 0, 0]], members=(0, 1, 2), slots=(2, 1, 1),
                       lengths=[2, 2, 1, 1], terminated=[(1, 0), (0, 3)],
                       finals=[(1, 1, (3.0, 0.0)), (0, 2, (0.0, 1.0))], bootstrap_obs=[(2.0, 2.0)] * 4)
    next_values, continues = _bootstrap(linear_trainer(), batch)
    np.testing.assert_array_equal(next_values, [[5.0, 6.0, V(0, 1), 0.0], [0.0, V(3, 0), 0.0, 0.0]])
    np.testing.assert_array_equal(continues, [[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])


def test_train_feeds_gae_the_bootstrap_values_and_masks(monkeypatch):
    seen = {}
    real_gae = ppo.gae

    def spy(rewards, values, next_values, continues, gamma, lam):
        seen.update(values=values.clone(), next_values=next_values.clone(), continues=continues.clone())
        return real_gae(rewards, values, next_values, continues, gamma, lam)

    monkeypatch.setattr(ppo, "gae", spy)
    trainer = linear_trainer()
    stats = trainer.train(make_batch(**MIXED))
    np.testing.assert_array_equal(seen["values"].numpy(), MIXED["values"])
    np.testing.assert_array_equal(seen["next_values"].numpy(), MIXED_NEXT_VALUES)
    np.testing.assert_array_equal(seen["continues"].numpy(), MIXED_CONTINUES)
    assert stats.samples == 8 and trainer.version == 1


# ---------------------------------------------------------------------------------------------
# version stamps
# ---------------------------------------------------------------------------------------------

def at_version(trainer: Trainer, version: int) -> Trainer:
    trainer.version = version
    return trainer


def stamped(versions, lengths=None) -> Batch:
    versions = np.array(versions, np.int64)
    return make_batch(np.zeros(versions.shape), versions=versions, lengths=lengths)


def test_strict_trainer_refuses_one_sample_of_an_older_version_and_names_the_versions():
    trainer = at_version(linear_trainer(max_lag=0), 3)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(OffPolicyError, match=r"1 of 6 samples were produced by versions \[2\]; version 3 trains "
                                             r"on them and allows a lag of at most 0"):
        trainer.train(stamped([[3, 3, 3], [3, 2, 3]]))
    assert trainer.version == 3 and trainer.env_steps == 0
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


def test_strict_trainer_refuses_samples_of_a_newer_version():
    trainer = at_version(linear_trainer(max_lag=0), 3)
    with pytest.raises(OffPolicyError, match=r"versions \[4\]"):
        trainer.train(stamped([[3, 4]]))


def test_strict_trainer_accepts_on_policy_batch_and_ignores_stamps_past_a_cut():
    """The padding of an unroll cut short is never stamped (-1) and never checked."""
    trainer = at_version(linear_trainer(max_lag=0), 3)
    stats = trainer.train(stamped([[3, 3], [3, -1]], lengths=[2, 1]))
    assert (stats.version, stats.samples, stats.off_policy_samples, stats.policy_lag_max) == (3, 3, 0, 0)
    assert trainer.version == 4


def test_pipelined_trainer_accepts_lag_one():
    trainer = at_version(linear_trainer(max_lag=1), 5)
    stats = trainer.train(stamped([[5, 4], [4, 4]]))
    assert (stats.off_policy_samples, stats.policy_lag_max, stats.policy_lag_mean) == (3, 1, 0.75)


def test_pipelined_trainer_refuses_lag_two_and_names_the_versions():
    trainer = at_version(linear_trainer(max_lag=1), 5)
    with pytest.raises(OffPolicyError, match=r"2 of 4 samples were produced by versions \[3\]; version 5 trains "
                                             r"on them and allows a lag of at most 1"):
        trainer.train(stamped([[5, 3], [4, 3]]))


def test_unbounded_trainer_only_counts_lag():
    trainer = at_version(linear_trainer(max_lag=None), 10)
    stats = trainer.train(stamped([[10, 8], [5, 9]]))
    # lags 0, 2, 5, 1
    assert (stats.off_policy_samples, stats.policy_lag_max, stats.policy_lag_mean) == (3, 5, 2.0)
    assert (trainer.lag_sum, trainer.lag_max, trainer.version) == (8, 5, 11)


# ---------------------------------------------------------------------------------------------
# reward scaling: running discounted returns per member
# ---------------------------------------------------------------------------------------------
GAMMA = 0.5


def rewards_batch(rewards, members=(0,), slots=None, lengths=None, terminated=(), truncated=(), versions=0) -> Batch:
    rewards = np.array(rewards, np.float32)
    return make_batch(np.zeros(rewards.shape), rewards=rewards, members=members, slots=slots or (rewards.shape[1],),
                      lengths=lengths, terminated=terminated, truncated=truncated, versions=versions)


def test_running_return_continues_across_batches_and_resets_at_episode_end():
    scaler = RewardScaler(GAMMA, clip=10.0)
    scaler.scale(rewards_batch([[1], [2], [4]]))
    # 1; 0.5 * 1 + 2 = 2.5; 0.5 * 2.5 + 4 = 5.25
    np.testing.assert_array_equal(scaler.returns[0], [5.25])
    scaler.scale(rewards_batch([[1], [1], [1]], terminated=[(1, 0)]))
    # 0.5 * 5.25 + 1 = 3.625; 0.5 * 3.625 + 1 = 2.8125, the episode ends: 0; then 1
    np.testing.assert_array_equal(scaler.returns[0], [1.0])
    seen = [1, 2.5, 5.25, 3.625, 2.8125, 1]
    assert scaler.rms.mean == pytest.approx(np.mean(seen), rel=1e-4)  # rms starts from a count of 1e-4
    assert scaler.rms.var == pytest.approx(np.var(seen), rel=1e-3)


def test_truncation_also_resets_the_running_return():
    scaler = RewardScaler(GAMMA, clip=10.0)
    scaler.scale(rewards_batch([[2], [2]], truncated=[(0, 0)]))
    np.testing.assert_array_equal(scaler.returns[0], [2.0])  # 2, reset, 2


def test_members_of_one_batch_keep_separate_running_returns():
    scaler = RewardScaler(GAMMA, clip=10.0)
    scaler.scale(rewards_batch([[1, 2, 4], [1, 2, 4]], members=(3, 7), slots=(1, 2), terminated=[(0, 1)]))
    # member 3 slot 0: 1, 1.5. member 7 slot 0 (batch slot 1): 2, ends, 2. member 7 slot 1: 4, 6
    np.testing.assert_array_equal(scaler.returns[3], [1.5])
    np.testing.assert_array_equal(scaler.returns[7], [2.0, 6.0])
    scaler.scale(rewards_batch([[2, 0, 0]], members=(3, 7), slots=(1, 2)))
    np.testing.assert_array_equal(scaler.returns[3], [2.75])
    np.testing.assert_array_equal(scaler.returns[7], [1.0, 3.0])
    scaler.scale(rewards_batch([[2, 0]], members=(9, 11), slots=(1, 1)))  # a batch without members 3 and 7
    np.testing.assert_array_equal(scaler.returns[3], [2.75])
    np.testing.assert_array_equal(scaler.returns[7], [1.0, 3.0])
    np.testing.assert_array_equal(scaler.returns[9], [2.0])


def test_running_return_stops_at_a_slot_cut_short():
    scaler = RewardScaler(GAMMA, clip=10.0)
    scaler.scale(rewards_batch([[1, 1], [1, 1], [1, 100]], slots=(2,), lengths=[3, 2]))
    # slot 0: 1, 1.5, 1.75; slot 1: 1, 1.5 and its padding (100) is not a reward
    np.testing.assert_array_equal(scaler.returns[0], [1.75, 1.5])


def test_scaled_rewards_are_divided_by_the_return_std_and_clipped():
    scaler = RewardScaler(GAMMA, clip=2.0)
    scaled = scaler.scale(rewards_batch([[1], [2], [4], [-100]]))
    std = np.sqrt(scaler.rms.var + 1e-8)
    np.testing.assert_allclose(scaled[:3, 0], np.array([1, 2, 4]) / std, rtol=1e-6)
    assert scaled[3, 0] == -2.0
    assert scaled.dtype == np.float32


def test_member_that_comes_back_with_another_number_of_envs_starts_from_zero_returns():
    """A restarted actor with another --num-envs (or a resume with other envs per actor) reuses its id."""
    scaler = RewardScaler(GAMMA, clip=10.0)
    scaler.scale(rewards_batch([[1, 1, 5], [1, 1, 5]], members=(0, 1), slots=(2, 1)))
    np.testing.assert_array_equal(scaler.returns[0], [1.5, 1.5])
    scaled = scaler.scale(rewards_batch([[2, 2, 2, 2], [2, 2, 2, 2]], members=(0, 1), slots=(3, 1)))
    assert scaled.shape == (2, 4)
    np.testing.assert_array_equal(scaler.returns[0], [3.0, 3.0, 3.0])  # 2, 3 from zero, not from 1.5
    np.testing.assert_array_equal(scaler.returns[1], [0.5 * (0.5 * 7.5 + 2) + 2])  # member 1 carries on: 4.875
    scaler.scale(rewards_batch([[4]], members=(0,), slots=(1,)))
    np.testing.assert_array_equal(scaler.returns[0], [4.0])


def test_training_goes_on_when_a_member_comes_back_with_another_number_of_envs():
    trainer = linear_trainer(normalize_reward=True)
    trainer.train(rewards_batch([[1, 1], [1, 1]], members=(4,), slots=(2,)))
    stats = trainer.train(rewards_batch([[1, 1, 1], [1, 1, 1]], members=(4,), slots=(3,), versions=1))
    assert stats.samples == 6 and trainer.version == 2
    np.testing.assert_allclose(trainer.reward_scaler.returns[4], [0.99 * 1 + 1] * 3)  # from zero, gamma 0.99


# -- the optimizer ------------------------------------------------------------------------------


def _policy_and_grads(seed: int) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    torch.manual_seed(seed)
    model = Trainer(Config(), SPEC, torch.device("cpu")).model
    return model, [torch.randn_like(p) for p in model.parameters()]


def test_adam_is_fused_where_torch_has_the_kernel_and_takes_the_same_steps_as_the_loop():
    fused_model, grads = _policy_and_grads(0)
    loop_model, _ = _policy_and_grads(0)
    fused = adam(list(fused_model.parameters()), 1e-2, 1e-5)
    loop = torch.optim.Adam(loop_model.parameters(), lr=1e-2, eps=1e-5)
    has_cpu_kernel = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 4)
    assert bool(fused.defaults["fused"]) == has_cpu_kernel
    for _ in range(3):
        for model, optimizer in ((fused_model, fused), (loop_model, loop)):
            for p, g in zip(model.parameters(), grads):
                p.grad = g.clone()
            optimizer.step()
    for a, b in zip(fused_model.parameters(), loop_model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)  # the same update, rounded differently
    start, _ = _policy_and_grads(0)
    moved = sum(float((a - b).abs().sum().detach()) for a, b in zip(fused_model.parameters(), start.parameters()))
    assert moved > 0.1  # three steps of lr 1e-2 moved the parameters: the comparison compares something


def test_adam_falls_back_to_the_loop_where_torch_has_no_fused_kernel(monkeypatch):
    real = torch.optim.Adam

    def without_fused(params, **kwargs):  # what torch < 2.4 says for CPU parameters
        if kwargs.get("fused"):
            raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of supported "
                               "devices: ['cuda']")
        return real(params, **kwargs)

    monkeypatch.setattr(torch.optim, "Adam", without_fused)
    model, _ = _policy_and_grads(0)
    optimizer = adam(list(model.parameters()), 1e-3, 1e-5)
    assert isinstance(optimizer, real) and not optimizer.defaults["fused"]
    assert optimizer.defaults["lr"] == 1e-3 and optimizer.defaults["eps"] == 1e-5


# ---------------------------------------------------------------------------------------------
# ppo.vtrace: targets and advantages from the policy being trained
# ---------------------------------------------------------------------------------------------

def vtrace_trainer(vtrace: bool, gae_lambda: float = 0.95, max_lag: int = 0) -> Trainer:
    """A small MLP trainer, the same initial parameters for every call."""
    config = Config()
    config.model.hidden = [8]
    config.ppo.epochs, config.ppo.minibatches = 2, 2
    config.ppo.vtrace, config.ppo.gae_lambda = vtrace, gae_lambda
    return Trainer(config, SPEC, torch.device("cpu"), max_lag=max_lag)


def acted_batch(trainer: Trainer, shift=None, versions=0) -> Batch:
    """T=6, N=3 random steps (an episode terminated, one truncated, slot 2 cut short at 4 steps) whose behaviour
    log-probs and values are the trainer's own, plus ``shift`` [T, N] on the log-probs (μ = π e^-shift)."""
    g = np.random.default_rng(5)
    T, N = 6, 3
    batch = make_batch(np.zeros((T, N)), lengths=[6, 6, 4], terminated=[(2, 0)], finals=[(3, 1, (0.5, -0.5))],
                       rewards=g.normal(size=(T, N)), bootstrap_obs=g.normal(size=(N, 2)), versions=versions,
                       version=trainer.version)
    batch.obs[:] = g.normal(size=(T, N, 2))
    batch.actions[:] = g.integers(0, 2, size=(T, N))
    with torch.no_grad():
        logprobs, _, values = trainer.model.evaluate(trainer.normalizer()(torch.as_tensor(batch.obs)),
                                                     torch.as_tensor(batch.actions), batch.starts,
                                                     torch.zeros(N, 0))
    batch.logprobs[:] = logprobs.numpy() - (0.0 if shift is None else np.asarray(shift, np.float32))
    batch.values[:] = values.numpy()
    return batch


def test_vtrace_on_policy_updates_as_gae_with_lambda_one_whatever_gae_lambda_says():
    """Every ratio is 1 where the behaviour policy is the one being trained: V-trace's targets and advantages are
    GAE's with λ = 1 (to rounding), and ppo.gae_lambda is not used."""
    traced, gae_1, gae_95 = vtrace_trainer(True, 0.95), vtrace_trainer(False, 1.0), vtrace_trainer(False, 0.95)
    before = [p.detach().clone() for p in traced.model.parameters()]
    stats = traced.train(acted_batch(traced))
    assert gae_1.train(acted_batch(gae_1)).vtrace_truncated is None
    gae_95.train(acted_batch(gae_95))
    assert stats.vtrace_truncated == 0.0 and (traced.vtrace_samples, traced.vtrace_truncated) == (16, 0)
    for a, b in zip(traced.model.parameters(), gae_1.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(a, start) for a, start in zip(traced.model.parameters(), before))
    assert any(not torch.allclose(a, c, rtol=1e-4, atol=1e-5)
               for a, c in zip(traced.model.parameters(), gae_95.model.parameters()))


def test_vtrace_reports_the_fraction_of_valid_lagged_samples_whose_ratio_rho_bar_truncated():
    trainer = at_version(vtrace_trainer(True, max_lag=2), 2)
    # μ = π / 4 on the first two rows (ratio 4 > ρ̄ = 1: truncated), μ = 2 π elsewhere (ratio 1/2: not); slot 2's
    # steps past its cut (rows 4, 5) have ratio 4 too, and are not samples
    shift = np.full((6, 3), -np.log(2.0))
    shift[:2] = np.log(4.0)
    shift[4:, 2] = np.log(4.0)
    stats = trainer.train(acted_batch(trainer, shift, versions=[[2, 1, 0]] * 6))
    assert stats.policy_lag_max == 2 and stats.vtrace_truncated == pytest.approx(6 / 16)
    assert (trainer.vtrace_samples, trainer.vtrace_truncated) == (16, 6)
    state = trainer.state_dict()
    again = vtrace_trainer(True, max_lag=2)
    again.load_state_dict(state)
    assert (again.vtrace_samples, again.vtrace_truncated) == (16, 6)


# ---------------------------------------------------------------------------------------------
# the CNN's memory layout on the CPU
# ---------------------------------------------------------------------------------------------


def _cnn_trainer() -> Trainer:
    import gymnasium as gym

    from lockstep.envs.spaces import action_spec

    config = Config()
    config.model.kind = "small-cnn"
    observation = SpaceSpec.from_space(gym.spaces.Box(0, 255, (2, 6, 6), np.uint8))
    return Trainer(config, EnvSpec("frames", observation, action_spec(gym.spaces.Discrete(3))), torch.device("cpu"))


def _frames_batch(version: int) -> Batch:
    rng = np.random.default_rng(3)
    T, N = 4, 2
    zeros = np.zeros((T, N), np.float32)
    return Batch(version=version, members=(0,), slots_per_member=(N,),
                 obs=rng.integers(0, 256, (T, N, 2, 6, 6), dtype=np.uint8), actions=rng.integers(0, 3, (T, N)),
                 logprobs=np.full((T, N), -np.log(3), np.float32), values=zeros,
                 rewards=rng.standard_normal((T, N)).astype(np.float32), terminated=zeros.astype(bool),
                 truncated=zeros.astype(bool), versions=np.full((T, N), version, np.int64),
                 bootstrap_obs=rng.integers(0, 256, (N, 2, 6, 6), dtype=np.uint8), lengths=np.full(N, T, np.int64))


def test_on_the_cpu_the_cnn_trains_channels_last_and_a_checkpoints_moments_of_another_layout_are_aligned():
    trainer = _cnn_trainer()
    conv = trainer.model.torso[1].weight  # after the pixel scale
    assert conv.dim() == 4 and conv.is_contiguous(memory_format=torch.channels_last)
    trainer.train(_frames_batch(0))
    saved = trainer.state_dict()
    # the same checkpoint as a run with NCHW weights (a GPU's) saves it: every moment in the default layout
    nchw = {**saved, "optimizer": {**saved["optimizer"], "state": {
        i: {k: v.contiguous() if torch.is_tensor(v) else v for k, v in s.items()}
        for i, s in saved["optimizer"]["state"].items()}}}
    assert any(not torch.equal(torch.as_strided(v, (v.numel(),), (1,)), torch.as_strided(
        nchw["optimizer"]["state"][i][k], (v.numel(),), (1,))) for i, s in saved["optimizer"]["state"].items()
               for k, v in s.items() if torch.is_tensor(v) and v.dim() == 4)  # their memory orders differ
    resumed = []
    for state in (saved, nchw):
        other = _cnn_trainer()
        other.load_state_dict(copy.deepcopy(state))  # as torch.load gives it: the optimizer steps its tensors in place
        other.train(_frames_batch(1))
        resumed.append(torch.cat([p.detach().reshape(-1) for p in other.model.parameters()]))
    torch.testing.assert_close(resumed[0], resumed[1], rtol=0, atol=0)  # each weight with its own moments
