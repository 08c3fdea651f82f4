"""Inference: immutable policy snapshots and the dynamic batcher that serves every actor.

A ``PolicySnapshot`` holds everything that shapes the action distribution of one
policy version (network parameters and observation-normalization statistics).
Nothing mutates it after construction: the trainer builds version k+1 from its
own copy and the learner swaps one reference, so a forward pass can never see
parameters of two versions.

The ``Batcher`` lives on the gRPC server's event loop. Requests wait until the
batch holds every request that is expected soon, or ``max_batch`` observations,
or ``max_wait`` has passed; then one forward pass answers them all.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from lockstep import noise
from lockstep.models import ActorCritic, ObsNormalizer

_TINY = float(np.finfo(np.float32).tiny)
_BELOW_ONE = float(np.nextafter(np.float32(1), np.float32(0)))


def act(model: ActorCritic, normalize: ObsNormalizer, obs: np.ndarray, uniform: np.ndarray,
        device: torch.device, between: Callable[[], None] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The one sampling function: obs [B, *obs], uniform [B, w] -> action [B, *act], log-prob [B], value [B].

    Used by snapshots and by the in-place backend alike, so every strategy samples
    the same action from the same parameters and noise. ``between``: see ``ActorCritic.sample``.
    """
    with torch.inference_mode():
        x = normalize(torch.as_tensor(obs, device=device))
        # float32 rounds uniforms within 2**-25 of 1 up to 1.0, where Gumbel noise is infinite
        u = torch.as_tensor(uniform, dtype=torch.float32, device=device).clamp_(_TINY, _BELOW_ONE)
        action, logprob, value = model.sample(x, u, between=between)
        return action.cpu().numpy(), logprob.cpu().numpy(), value.cpu().numpy()


class PolicySnapshot:
    """Version ``version`` of the policy, frozen."""

    def __init__(self, version: int, model: ActorCritic, obs_mean: np.ndarray | None,
                 obs_var: np.ndarray | None, clip_obs: float, device: torch.device) -> None:
        self.version = version
        self.device = device
        self.model = copy.deepcopy(model).to(device).eval().requires_grad_(False)
        self.normalize = ObsNormalizer(obs_mean, obs_var, clip_obs, device)
        self.obs_mean = None if obs_mean is None else np.array(obs_mean)
        self.obs_var = None if obs_var is None else np.array(obs_var)

    def act(self, obs: np.ndarray, uniform: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """obs [B, *obs], uniform [B, w] -> action [B, *act], log-prob [B] float32, value [B] float32."""
        return act(self.model, self.normalize, obs, uniform, self.device)


@dataclass
class InferenceResult:
    actions: np.ndarray
    logprobs: np.ndarray
    values: np.ndarray
    version: int
    torn: bool = False  # the forward pass read parameters of two versions (in-place strategies only)


@dataclass
class _Pending:
    obs: np.ndarray
    keys: np.ndarray
    counters: np.ndarray
    future: asyncio.Future


class Batcher:
    """Concatenate pending requests, run one forward pass on the current snapshot, split the replies."""

    def __init__(self, snapshot: Callable[[], PolicySnapshot], max_batch: int, max_wait_s: float,
                 expected: Callable[[], int]) -> None:
        self._snapshot = snapshot
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self._expected = expected  # requests that may arrive soon: a batch with this many flushes at once
        self._pending: list[_Pending] = []
        self._pending_rows = 0
        self._timer: asyncio.TimerHandle | None = None
        self.forward_passes = 0
        self.rows_inferred = 0
        self.busy_s = 0.0

    async def infer(self, obs: np.ndarray, keys: np.ndarray, counters: np.ndarray) -> InferenceResult:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append(_Pending(obs, keys, counters, future))
        self._pending_rows += len(obs)
        if self._pending_rows >= self.max_batch or len(self._pending) >= self._expected():
            self.flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.max_wait_s, self.flush)
        return await future

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending = [p for p in self._pending if not p.future.cancelled()]
        self._pending, self._pending_rows = [], 0
        if not pending:
            return
        start = time.perf_counter()
        snapshot = self._snapshot()
        try:
            obs = np.concatenate([p.obs for p in pending])  # also makes message bytes writable for torch
            keys = np.concatenate([p.keys for p in pending])
            counters = np.concatenate([p.counters for p in pending])
            actions, logprobs, values = snapshot.act(obs, noise.uniform(keys, counters, snapshot.model.noise_width))
        except Exception as err:  # a failed forward pass fails its requests, not the server
            for p in pending:
                p.future.set_exception(err)
            return
        finally:
            self.busy_s += time.perf_counter() - start
        self.forward_passes += 1
        self.rows_inferred += len(obs)
        offset = 0
        for p in pending:
            n = len(p.obs)
            p.future.set_result(InferenceResult(actions[offset:offset + n], logprobs[offset:offset + n],
                                                values[offset:offset + n], snapshot.version))
            offset += n
