"""Small training batches for the update's sync and bit-identity tests: an MLP, a CNN on uint8 images and
an LSTM with episode starts, truncations and a slot cut short, each on a seeded random [T, N] batch."""

from __future__ import annotations

import numpy as np
import torch

from lockstep.config import Config
from lockstep.envs import EnvSpec, SpaceSpec
from lockstep.learner.rollout import Batch
from lockstep.learner.trainer import Trainer

T, N = 8, 4


def _box(shape: tuple[int, ...], dtype: str = "float32", low: float = -np.inf, high: float = np.inf) -> SpaceSpec:
    return SpaceSpec("box", shape, dtype, low=np.full(shape, low, dtype), high=np.full(shape, high, dtype))


CASES = {  # name -> (observation, action, model settings)
    "mlp": (_box((3,)), SpaceSpec("discrete", (), "int64", n=2), {"hidden": [8]}),
    "cnn-uint8": (_box((2, 10, 10), "uint8", 0, 255), SpaceSpec("discrete", (), "int64", n=3), {}),
    "lstm-box": (_box((3,)), _box((2,), "float32", -1.0, 1.0), {"hidden": [8], "lstm_size": 6}),
}


def trainer(name: str, **ppo) -> Trainer:
    observation, action, model = CASES[name]
    config = Config()
    config.ppo.epochs, config.ppo.minibatches = 2, 2
    for key, value in {**model}.items():
        setattr(config.model, key, value)
    for key, value in ppo.items():
        setattr(config.ppo, key, value)
    return Trainer(config, EnvSpec(name, observation, action), torch.device("cpu"), max_lag=None)


def batch(name: str, seed: int = 0, version: int = 0) -> Batch:
    """A batch of random observations and actions, with an episode that terminates, one that is truncated
    and (for the LSTM) a slot cut short and the states it starts from."""
    observation, action, _ = CASES[name]
    rng = np.random.default_rng(seed)
    shape = observation.shape

    def obs(*lead: int) -> np.ndarray:
        if observation.dtype == "uint8":
            return rng.integers(0, 256, (*lead, *shape), dtype=np.uint8)
        return rng.standard_normal((*lead, *shape)).astype(np.float32)

    actions = (rng.integers(0, action.n, (T, N)) if action.kind == "discrete"
               else rng.uniform(-1, 1, (T, N, *action.shape)).astype(np.float32))
    terminated, truncated = np.zeros((T, N), bool), np.zeros((T, N), bool)
    terminated[2, 0], truncated[4, 1] = True, True
    recurrent = "lstm" in name
    lengths = np.full(N, T, np.int64)
    if recurrent:
        lengths[3] = T - 3  # cut short
    valid = np.arange(T)[:, None] < lengths[None]
    state = trainer_state = None
    if recurrent:
        trainer_state = CASES[name][2]["lstm_size"] * 2
        state = rng.standard_normal((N, trainer_state)).astype(np.float32)
    return Batch(version=version, members=(0, 1), slots_per_member=(2, 2), obs=obs(T, N), actions=actions,
                 logprobs=rng.uniform(-2, -0.1, (T, N)).astype(np.float32),
                 values=rng.standard_normal((T, N)).astype(np.float32),
                 rewards=rng.standard_normal((T, N)).astype(np.float32), terminated=terminated,
                 truncated=truncated, versions=np.where(valid, version, -1).astype(np.int64),
                 bootstrap_obs=obs(N), lengths=lengths, final_t=np.array([4]), final_n=np.array([1]),
                 final_obs=obs(1), initial_state=state)
