"""Observation and return statistics: the running moments the trainer keeps, and the frozen
normalizer each policy version carries (``inference.PolicySnapshot``, ``Trainer.normalizer``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lockstep.envs import SpaceSpec

FRAME_SAMPLE = 256  # frames of a batch whose moments update the statistics of a normalized image observation


class RunningMeanStd:
    """Running mean and variance over batches (Chan et al.'s parallel update), float64."""

    def __init__(self, shape: tuple[int, ...] = (), epsilon: float = 1e-4) -> None:
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = epsilon

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x).reshape(-1, *self.mean.shape)
        if not len(x):
            return
        if x.dtype == np.uint8:  # frames (env.normalize_images): their moments in torch's float32, from at most
            # FRAME_SAMPLE of them evenly spaced (a batch of 1,024 frames in numpy's float64: half a second)
            x = x[::max(1, len(x) // FRAME_SAMPLE)]
            var, mean = torch.var_mean(torch.from_numpy(x).float(), dim=0, correction=0)
            self.update_moments(mean.double().numpy(), var.double().numpy(), len(x))
        else:
            x = x.astype(np.float64, copy=False)
            self.update_moments(x.mean(0), x.var(0), len(x))

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


class LeafStatistics:
    """The running moments of a Dict or Tuple observation: one ``RunningMeanStd`` per normalized leaf (each
    Box leaf but uint8 images, which their encoder scales, and the action mask), keyed by path; ``mean`` and
    ``var`` are dicts."""

    def __init__(self, observation: SpaceSpec) -> None:
        self.leaves = {path: RunningMeanStd(leaf.shape) for path, leaf in observation.leaves
                       if normalized(leaf) and path != observation.mask}  # an action mask stays as it came

    @property
    def mean(self) -> dict[str, np.ndarray]:
        return {path: rms.mean for path, rms in self.leaves.items()}

    @property
    def var(self) -> dict[str, np.ndarray]:
        return {path: rms.var for path, rms in self.leaves.items()}

    def state_dict(self) -> dict:
        return {"leaves": {path: rms.state_dict() for path, rms in self.leaves.items()}}

    def load_state_dict(self, state: dict) -> None:
        for path, rms in self.leaves.items():
            rms.load_state_dict(state["leaves"][path])


def normalized(leaf: SpaceSpec, images: bool = False) -> bool:
    """Whether observation normalization applies to a leaf: Box leaves but uint8 images (``images``: those
    too, ``env.normalize_images``)."""
    return leaf.kind == "box" and (images or not leaf.image)


def observation_statistics(observation: SpaceSpec) -> RunningMeanStd | LeafStatistics:
    """The running moments ``env.normalize_obs`` keeps: of the whole observation, or of each leaf of a tree."""
    return LeafStatistics(observation) if observation.tree else RunningMeanStd(observation.shape)


def stored_moments(state: dict | None) -> tuple[Any, Any]:
    """(mean, var) of a checkpoint's ``obs_rms`` (a ``state_dict`` of either statistics); (None, None) for none."""
    if state is None:
        return None, None
    if "leaves" in state:
        return ({path: s["mean"] for path, s in state["leaves"].items()},
                {path: s["var"] for path, s in state["leaves"].items()})
    return state["mean"], state["var"]


def copy_moments(moments: np.ndarray | dict | None) -> np.ndarray | dict | None:
    """A copy of a mean or variance: an array, a dict of them by leaf path (a tree), or None."""
    if moments is None:
        return None
    if isinstance(moments, dict):
        return {path: np.array(value) for path, value in moments.items()}
    return np.array(moments)


def as_tensors(obs: np.ndarray, device: torch.device) -> torch.Tensor | dict[str, torch.Tensor]:
    """Observations [B, ...] as the policy takes them: one tensor, or for the records of a Dict or Tuple
    space one tensor per leaf [B, *leaf] in its own dtype, keyed by path (``common.tree``)."""
    if obs.dtype.names:
        # a copy: a leaf of records is strided by the record size, which torch cannot view
        return {path: torch.as_tensor(obs[path].copy(), device=device) for path in obs.dtype.names}
    return torch.as_tensor(obs, device=device)


class ObsNormalizer:
    """Frozen observation normalization: (obs - mean) / sqrt(var + eps), clipped. Identity when disabled.

    A flat observation becomes float32 either way. For a tree (``mean`` and ``var`` dicts keyed by path)
    only the normalized leaves change (``normalized``); the others reach their encoders as they came."""

    def __init__(self, mean: np.ndarray | dict | None, var: np.ndarray | dict | None, clip: float,
                 device: torch.device) -> None:
        self.enabled = mean is not None
        self.clip = clip
        if isinstance(mean, dict):
            self.leaves = {path: self._moments(mean[path], var[path], device) for path in mean}
        elif self.enabled:
            self.mean, self.scale = self._moments(mean, var, device)

    @staticmethod
    def _moments(mean: np.ndarray, var: np.ndarray, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.as_tensor(mean, dtype=torch.float32, device=device),
                torch.as_tensor(1.0 / np.sqrt(var + 1e-8), dtype=torch.float32, device=device))

    def __call__(self, obs: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor | dict[str, torch.Tensor]:
        if isinstance(obs, dict):
            leaves = getattr(self, "leaves", {})
            return {path: self._normalize(x, *leaves[path]) if path in leaves else x for path, x in obs.items()}
        obs = obs.float()
        if not self.enabled:
            return obs
        return self._normalize(obs, self.mean, self.scale)

    def _normalize(self, obs: torch.Tensor, mean: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        # the same operations as ((obs - mean) * scale).clamp(...), in place on the one new tensor: a batch of frames
        # is 28M floats, and each temporary of them costs a pass over memory
        return (obs.float() - mean).mul_(scale).clamp_(-self.clip, self.clip)
