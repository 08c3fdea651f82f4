"""Host syncs, counted on any device: the tensor calls that make the host wait for a GPU to finish.

A value read back (``item``, ``tolist``, ``bool``/``int``/``float`` of a tensor, ``cpu``) and a shape that
depends on values (``nonzero``, indexing with a boolean mask) wait for every kernel queued before them.
On a GPU ``torch.cuda.set_sync_debug_mode("warn")`` reports such waits as they happen; ``HostSyncs``
counts the same calls wherever the tensors are, so the count of a training update can be held fixed by a
test on the CPU, where nothing waits. It counts what Python calls: a sync inside one C++ op is not seen.

The cases (``CASES``, ``trainer``, ``batch``): small training updates, an MLP, a CNN on uint8 images and an
LSTM with episode starts, a truncation and a slot cut short, each on a seeded random [T, N] batch; the
update's sync count is tested on them (``tests/unit/test_update_syncs.py``) and measured by ``bench gpu``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from lockstep.config import Config
from lockstep.envs import EnvSpec, SpaceSpec
from lockstep.learner.rollout import Batch
from lockstep.learner.trainer import Trainer

READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "nonzero", "argwhere",
         "masked_select", "unique"}  # each waits for the device (on a GPU)


def _masked(index: Any) -> bool:
    """Whether an index holds a boolean tensor (a mask: the result's shape depends on its values)."""
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


class HostSyncs(TorchFunctionMode):
    """``with HostSyncs() as syncs: ...``; then ``syncs.count`` and ``syncs.by_name`` (call name -> count)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_name: Counter[str] = Counter()

    @property
    def count(self) -> int:
        return sum(self.by_name.values())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in READS or (name in ("__getitem__", "__setitem__") and len(args) > 1 and _masked(args[1])):
            self.by_name[name] += 1
        return func(*args, **(kwargs or {}))


T, N = 8, 4


def _box(shape: tuple[int, ...], dtype: str = "float32", low: float = -np.inf, high: float = np.inf) -> SpaceSpec:
    return SpaceSpec("box", shape, dtype, low=np.full(shape, low, dtype), high=np.full(shape, high, dtype))


CASES = {  # name -> (observation, action, model settings)
    "mlp": (_box((3,)), SpaceSpec("discrete", (), "int64", n=2), {"hidden": [8]}),
    "cnn-uint8": (_box((2, 10, 10), "uint8", 0, 255), SpaceSpec("discrete", (), "int64", n=3), {}),
    "lstm-box": (_box((3,)), _box((2,), "float32", -1.0, 1.0), {"hidden": [8], "lstm_size": 6}),
}


def trainer(name: str, device: str | torch.device = "cpu", **ppo) -> Trainer:
    """A trainer of case ``name`` with 2 epochs x 2 minibatches; ``ppo``: other ``ppo.*`` settings."""
    observation, action, model = CASES[name]
    config = Config()
    config.ppo.epochs, config.ppo.minibatches = 2, 2
    for key, value in model.items():
        setattr(config.model, key, value)
    for key, value in ppo.items():
        setattr(config.ppo, key, value)
    return Trainer(config, EnvSpec(name, observation, action), torch.device(device), max_lag=None)


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
    state = None
    if recurrent:
        state = rng.standard_normal((N, 2 * CASES[name][2]["lstm_size"])).astype(np.float32)  # (h, c)
    return Batch(version=version, members=(0, 1), slots_per_member=(2, 2), obs=obs(T, N), actions=actions,
                 logprobs=rng.uniform(-2, -0.1, (T, N)).astype(np.float32),
                 values=rng.standard_normal((T, N)).astype(np.float32),
                 rewards=rng.standard_normal((T, N)).astype(np.float32), terminated=terminated,
                 truncated=truncated, versions=np.where(valid, version, -1).astype(np.int64),
                 bootstrap_obs=obs(N), lengths=lengths, final_t=np.array([4]), final_n=np.array([1]),
                 final_obs=obs(1), initial_state=state)


def per_update(device: torch.device) -> dict[str, dict[str, int | None]]:
    """Each case's host syncs in its second update on ``device`` (the first warms up kernels and allocator):
    ``counted`` by ``HostSyncs``, and on CUDA ``reported`` by ``torch.cuda.set_sync_debug_mode("warn")``
    (which also sees the waits of host-to-device copies from pageable memory; None on the CPU)."""
    import warnings

    found = {}
    for name in CASES:
        model = trainer(name, device)
        model.train(batch(name, seed=0, version=0))
        reported = None
        with HostSyncs() as syncs, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if device.type == "cuda":
                torch.cuda.set_sync_debug_mode("warn")
            try:
                model.train(batch(name, seed=1, version=1))
            finally:
                if device.type == "cuda":
                    torch.cuda.set_sync_debug_mode("default")
                    reported = sum("synchroniz" in str(w.message) for w in caught)
        found[name] = {"counted": syncs.count, "reported": reported}
    return found
