"""Observation and return statistics: the running moments the trainer keeps, and the frozen
normalizer each policy version carries (``inference.PolicySnapshot``, ``Trainer.normalizer``)."""

from __future__ import annotations

import numpy as np
import torch


class RunningMeanStd:
    """Running mean and variance over batches (Chan et al.'s parallel update), float64."""

    def __init__(self, shape: tuple[int, ...] = (), epsilon: float = 1e-4) -> None:
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = epsilon

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, np.float64).reshape(-1, *self.mean.shape)
        if len(x):
            self.update_moments(x.mean(0), x.var(0), x.shape[0])

    def update_moments(self, batch_mean: np.ndarray, batch_var: np.ndarray, n: int) -> None:
        """Fold in a batch of ``n`` rows given by its mean and (population) variance."""
        if n == 0:
            return
        delta = batch_mean - self.mean
        total = self.count + n
        self.mean = self.mean + delta * n / total
        m2 = self.var * self.count + batch_var * n + delta**2 * self.count * n / total
        self.var = m2 / total
        self.count = total

    def state_dict(self) -> dict:
        return {"mean": self.mean.copy(), "var": self.var.copy(), "count": self.count}

    def load_state_dict(self, state: dict) -> None:
        self.mean, self.var, self.count = np.array(state["mean"]), np.array(state["var"]), float(state["count"])


class ObsNormalizer:
    """Frozen observation normalization: (obs - mean) / sqrt(var + eps), clipped. Identity when disabled."""

    def __init__(self, mean: np.ndarray | None, var: np.ndarray | None, clip: float, device: torch.device) -> None:
        self.enabled = mean is not None
        if self.enabled:
            self.mean = torch.as_tensor(mean, dtype=torch.float32, device=device)
            self.scale = torch.as_tensor(1.0 / np.sqrt(var + 1e-8), dtype=torch.float32, device=device)
            self.clip = clip

    def __call__(self, obs: torch.Tensor) -> torch.Tensor:
        obs = obs.float()
        if not self.enabled:
            return obs
        return ((obs - self.mean) * self.scale).clamp(-self.clip, self.clip)
