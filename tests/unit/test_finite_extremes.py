"""Finite extremes: values within float32 that still poison training, refused by the step check or
skipped by the guarded update (issue 20, item 5).

A float32 reward of 3e38 is finite, and so is a float64 observation of 1e39 until the learner casts
it to float32; every such value is refused by name (``learner.max_reward``, ``learner.max_observation``),
or with ``--sanitize`` clipped to the bound. Episode statistics are checked too. A loss or gradient that
is not finite anyway (a bound raised to 1e38) takes no optimizer step, and the trainer counts it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_trainer import SPEC, make_batch

from lockstep.algo import ppo
from lockstep.config import Config, ConfigError, set_value
from lockstep.envs import SpaceSpec
from lockstep.learner.trainer import Trainer
from lockstep.transport.codec import CodecError
from lockstep.transport.messages import DEFAULT_BOUNDS, StepBounds, StepData, check_step

OBS32 = SpaceSpec("box", (2,), "float32", low=np.full(2, -np.inf, np.float32), high=np.full(2, np.inf, np.float32))
OBS64 = SpaceSpec("box", (2,), "float64", low=np.full(2, -np.inf), high=np.full(2, np.inf))


def step(obs=((0.0, 0.0), (0.0, 0.0)), reward=(0.0, 0.0), returns=(), lengths=(), dtype=np.float32) -> StepData:
    """A step of two envs in which no episode was truncated."""
    k = len(obs)
    return StepData(obs=np.array(obs, dtype), reward=np.array(reward, np.float32), terminated=np.zeros(k, bool),
                    truncated=np.zeros(k, bool), final_index=np.zeros(0, np.int64), final_obs=np.zeros((0, 2), dtype),
                    episode_return=np.array(returns, np.float64), episode_length=np.array(lengths, np.int64))


def refusal(data: StepData, spec: SpaceSpec = OBS32, bounds: StepBounds = DEFAULT_BOUNDS) -> str:
    with pytest.raises(CodecError) as err:
        check_step(data, 2, spec, bounds)
    return str(err.value)


def test_a_finite_float32_reward_of_3e38_is_refused_naming_the_field_and_the_bound():
    message = refusal(step(reward=(3e38, 0.0)))
    assert "step.reward" in message and "1 value(s) of magnitude over 1e+10" in message
    assert "learner.max_reward = 1e+10" in message


def test_a_float64_observation_of_1e39_that_float32_makes_inf_is_refused():
    with np.errstate(over="ignore"):
        assert np.isfinite(np.float64(1e39)) and not np.isfinite(np.float32(1e39))  # what the cast would do
    message = refusal(step(obs=((1e39, 0.0), (0.0, -2e10)), dtype=np.float64), OBS64)
    assert "step.observation" in message and "2 value(s) of magnitude over 1e+10" in message
    assert "learner.max_observation" in message


def test_nan_and_inf_are_still_refused_and_counted_apart_from_huge_values():
    message = refusal(step(obs=((np.nan, np.inf), (1e20, 0.0))))
    assert "step.observation: 2 non-finite value(s) (NaN or inf), 1 value(s) of magnitude over" in message


def test_values_at_the_bound_pass_and_the_bound_is_the_configured_one():
    data = check_step(step(obs=((1e10, -1e10), (0.0, 0.0)), reward=(-1e10, 1e10)), 2, OBS32)
    assert data.reward.tolist() == [-1e10, 1e10]
    message = refusal(step(reward=(5.0, 0.0)), bounds=StepBounds(max_reward=4.0))
    assert "learner.max_reward = 4" in message


@pytest.mark.parametrize("returns, lengths, field, problem", [
    ((np.inf,), (3,), "step.episode_return", "1 non-finite value(s)"),
    ((np.nan,), (3,), "step.episode_return", "1 non-finite value(s)"),
    ((1e300,), (3,), "step.episode_return", "magnitude over 1e+10"),
    ((1.0,), (-5,), "step.episode_length", "[-5] holds a length below 1"),
    ((1.0, 2.0), (4, 0), "step.episode_length", "[4, 0] holds a length below 1"),
])
def test_episode_statistics_are_checked(returns, lengths, field, problem):
    message = refusal(step(returns=returns, lengths=lengths))
    assert field in message and problem in message


def test_sanitize_clips_to_the_bound_instead_of_the_float_maximum():
    data = step(obs=((np.inf, -np.inf), (np.nan, 3e30)), reward=(3e38, -np.inf), returns=(np.inf,), lengths=(2,))
    data = check_step(data, 2, OBS32, StepBounds(sanitize=True))
    assert data.obs.tolist() == [[1e10, -1e10], [0.0, 1e10]] and data.obs.dtype == np.float32
    assert data.reward.tolist() == [1e10, -1e10] and data.episode_return.tolist() == [1e10]


def test_sanitize_still_refuses_an_episode_length_below_one():
    assert "step.episode_length" in refusal(step(returns=(1.0,), lengths=(0,)), bounds=StepBounds(sanitize=True))


def test_the_bounds_are_config_fields_below_the_float32_maximum():
    config = Config()
    assert config.learner.max_reward == config.learner.max_observation == 1e10
    with pytest.raises(ConfigError, match="learner.max_reward must be > 0 and <= 1e"):
        set_value(config, "learner.max_reward", "3e38")


# -- the guarded update ------------------------------------------------------------------------


def _trainer() -> Trainer:
    config = Config()
    config.ppo.epochs, config.ppo.minibatches = 2, 2
    return Trainer(config, SPEC, torch.device("cpu"))


def _params(trainer: Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.model.parameters()]


def _adam(trainer: Trainer) -> list[tuple[float, list, list]]:
    """Each parameter's Adam step count and moments; a state not created yet is the zeros it starts from (a
    step skipped on the device, ``optim._skips_on_device``, creates it: zeros, step 0)."""
    state = trainer.optimizer.state
    return [(float(state[p]["step"]), state[p]["exp_avg"].tolist(), state[p]["exp_avg_sq"].tolist()) if state.get(p)
            else (0.0, torch.zeros_like(p).tolist(), torch.zeros_like(p).tolist()) for p in trainer.model.parameters()]


def test_a_reward_whose_square_overflows_skips_every_step_and_leaves_the_parameters_as_they_were():
    trainer = _trainer()
    before, adam_before = _params(trainer), _adam(trainer)
    stats = trainer.train(make_batch(np.zeros((4, 2)), rewards=np.full((4, 2), 1e38)))  # (1e38)^2 is inf
    assert stats.update.skipped_steps == 4 and stats.update.gradient_steps == 0  # 2 epochs x 2 minibatches
    for old, new in zip(before, trainer.model.parameters()):
        assert torch.equal(old, new)
    assert _adam(trainer) == adam_before  # Adam's moments and step counts untouched
    assert trainer.version == 1  # the version still advances: the batch was seen, its steps not taken
    stats = trainer.train(make_batch(np.zeros((4, 2)), rewards=np.ones((4, 2)), versions=1))
    assert stats.update.skipped_steps == 0 and stats.update.gradient_steps == 4
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_optimize_skips_only_the_minibatches_whose_loss_is_not_finite():
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    poisoned = 1  # 4 units in 4 minibatches: one unit each, and the one holding unit 1 has a return of inf

    def minibatch(idx: torch.Tensor, _host_idx: np.ndarray) -> ppo.Minibatch:
        value = model(torch.ones(len(idx), 1)).squeeze(1)
        returns = torch.full_like(value, np.inf if int(idx[0]) == poisoned else 1.0)
        zeros = torch.zeros_like(value)
        return zeros, zeros, torch.ones_like(value), value, value.detach(), returns, zeros

    stats = ppo.optimize(model, optimizer, minibatch, 4, ppo.Settings(
        epochs=1, minibatches=4, clip_coef=0.2, clip_vloss=False, vf_coef=0.5, ent_coef=0.0, max_grad_norm=10.0,
        norm_adv=False, target_kl=None))
    assert stats.skipped_steps == 1 and stats.gradient_steps == 3
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert np.isfinite(stats.value_loss)  # the means are over the minibatches that had a finite loss
