"""Steps of an agent that has left its episode (``agent_active`` 0) are never trained on: whatever they hold,
the update, the reward scaling and the observation statistics come out the same, bit for bit."""

from __future__ import annotations

import numpy as np
import torch

from lockstep.config import Config
from lockstep.envs import env_spec
from lockstep.envs.departures import LIFETIMES
from lockstep.envs.spaces import ACTIVE_LEAF
from lockstep.learner.rollout import Batch
from lockstep.learner.trainer import Trainer

SPEC = env_spec("pettingzoo:lockstep.envs.departures")
T, N = 10, 3  # one Departures episode of one env: slots a0, a1, a2


def _batch(seed: int = 0) -> Batch:
    rng = np.random.default_rng(seed)
    obs = np.zeros((T, N), SPEC.observation.array_dtype)
    obs["observation"] = rng.random((T, N, 3), dtype=np.float32)
    active = np.arange(T)[:, None] < np.array(list(LIFETIMES.values()))[None, :]  # [T, N]
    obs[ACTIVE_LEAF] = active[..., None]
    terminated = np.zeros((T, N), bool)
    terminated[2, 0] = terminated[5, 1] = True  # a0 and a1 leave; every step of theirs after is flagged too
    terminated |= ~active
    bootstrap = np.zeros(N, SPEC.observation.array_dtype)
    bootstrap[ACTIVE_LEAF] = 1
    return Batch(version=0, members=(0,), slots_per_member=(N,), obs=obs,
                 actions=rng.integers(0, 2, (T, N)), logprobs=np.full((T, N), np.log(0.5), np.float32),
                 values=rng.standard_normal((T, N)).astype(np.float32),
                 rewards=rng.integers(0, 2, (T, N)).astype(np.float32), terminated=terminated,
                 truncated=np.zeros((T, N), bool), versions=np.zeros((T, N), np.int64), bootstrap_obs=bootstrap,
                 lengths=np.full(N, T))


def _trained(batch: Batch) -> list[torch.Tensor]:
    config = Config()
    config.env.normalize_obs = config.env.normalize_reward = True
    config.ppo.epochs, config.ppo.minibatches = 2, 2
    torch.manual_seed(0)
    trainer = Trainer(config, SPEC, torch.device("cpu"), max_lag=0)
    trainer.train(batch)
    mean = trainer.obs_rms.mean  # per Box leaf: {path: [*leaf]}
    return [p.detach().clone() for p in trainer.model.parameters()] + [torch.as_tensor(mean["observation"]),
                                                                        torch.as_tensor(trainer.reward_scaler.rms.var)]


def _scramble(batch: Batch, where: np.ndarray) -> Batch:
    rng = np.random.default_rng(99)
    batch.obs["observation"][where] = rng.random((int(where.sum()), 3), dtype=np.float32) * 100
    batch.actions[where] = 1 - batch.actions[where]
    batch.rewards[where] = 1e6
    batch.values[where] = -1e6
    batch.logprobs[where] = -30.0
    return batch


def test_the_batch_marks_the_steps_of_agents_that_left_as_not_valid():
    batch = _batch()
    assert batch.valid.sum(0).tolist() == [3, 6, 10] and batch.inactive == 7 + 4


def test_what_an_inactive_step_holds_changes_nothing_of_the_update():
    base = _trained(_batch())
    inactive = _batch().obs[ACTIVE_LEAF][..., 0] == 0  # [T, N], read from the leaf, not from what is tested
    scrambled = _trained(_scramble(_batch(), inactive))
    assert all(torch.equal(a, b) for a, b in zip(base, scrambled))


def test_what_an_active_step_holds_does_change_the_update():
    """The check above can fail: the same change at one active step moves the parameters."""
    where = np.zeros((T, N), bool)
    where[1, 0] = True
    base, changed = _trained(_batch()), _trained(_scramble(_batch(), where))
    assert not all(torch.equal(a, b) for a, b in zip(base, changed))
