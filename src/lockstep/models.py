"""Policies: an MLP actor-critic with a Categorical or a Gaussian head, and the observation normalizer.

Actions are sampled from externally supplied uniform noise (see ``noise.py``)
rather than a global RNG, so each env slot draws from its own reproducible
stream whatever batch its request lands in.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from lockstep.envs import SpaceSpec

LOG_2PI = math.log(2 * math.pi)


def _layer(inp: int, out: int, gain: float) -> nn.Linear:
    layer = nn.Linear(inp, out)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def _mlp(inp: int, hidden: list[int], out: int, activation: str, out_gain: float) -> nn.Sequential:
    act = {"tanh": nn.Tanh, "relu": nn.ReLU}[activation]
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [_layer(inp, width, math.sqrt(2)), act()]
        inp = width
    layers.append(_layer(inp, out, out_gain))
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    """Separate actor and critic MLPs (CleanRL's layout and initialization)."""

    def __init__(self, observation: SpaceSpec, action: SpaceSpec, hidden: list[int],
                 activation: str = "tanh", init_log_std: float = 0.0) -> None:
        super().__init__()
        obs_dim = int(np.prod(observation.shape))
        self.discrete = action.kind == "discrete"
        self.action_dim = action.n if self.discrete else int(np.prod(action.shape))
        self.action_shape = () if self.discrete else tuple(action.shape)
        self.critic = _mlp(obs_dim, hidden, 1, activation, 1.0)
        self.actor = _mlp(obs_dim, hidden, self.action_dim, activation, 0.01)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((self.action_dim,), float(init_log_std)))

    @property
    def noise_width(self) -> int:
        """Uniform numbers needed per sampled action."""
        return self.action_dim if self.discrete else 2 * self.action_dim

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """[B, *obs] -> [B]"""
        return self.critic(obs.flatten(1)).squeeze(-1)

    def sample(self, obs: torch.Tensor, uniform: torch.Tensor,
               between: Callable[[], None] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample actions with the given noise. obs [B, *obs], uniform [B, noise_width] in (0, 1).

        Returns action [B, *act], log-prob [B], value [B]. ``between`` runs after the
        policy head and before the value head (adversarial tests widen the window in
        which an in-place update could tear a forward pass).
        """
        flat = obs.flatten(1)
        out = self.actor(flat)
        if between is not None:
            between()
        value = self.critic(flat).squeeze(-1)
        if self.discrete:
            logits = out.log_softmax(-1)  # [B, n]
            gumbel = -torch.log(-torch.log(uniform))  # Gumbel-max: argmax(logits + g) ~ Categorical
            action = (logits + gumbel).argmax(-1)
            return action, logits.gather(-1, action[:, None]).squeeze(-1), value
        u1, u2 = uniform[:, : self.action_dim], uniform[:, self.action_dim:]
        z = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)  # Box-Muller: z ~ N(0, 1)
        action = out + self.log_std.exp() * z
        # The log-prob of the float32 action that is returned and stored, not of z: with a small std
        # and a large mean the action keeps only part of z's precision, and training and the audit
        # recompute the log-prob from the stored action (``evaluate``), so the two must be one formula.
        return action.reshape(-1, *self.action_shape), self._gaussian_logprob(out, action), value

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-prob [B], entropy [B] and value [B] of given actions under the current parameters."""
        flat = obs.flatten(1)
        out = self.actor(flat)
        value = self.critic(flat).squeeze(-1)
        if self.discrete:
            logits = out.log_softmax(-1)
            logprob = logits.gather(-1, action.long()[:, None]).squeeze(-1)
            entropy = -(logits.exp() * logits).sum(-1)
            return logprob, entropy, value
        a = action.reshape(action.shape[0], -1)
        entropy = (0.5 + 0.5 * LOG_2PI + self.log_std).sum().expand(a.shape[0])
        return self._gaussian_logprob(out, a), entropy, value

    def _gaussian_logprob(self, mean: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Log-density [B] of flat actions [B, d] under N(mean, exp(log_std)^2), summed over dimensions.

        The one formula for the behaviour log-prob (``sample``) and the recomputed one
        (``evaluate``), so that on the same rows they are bit-identical.
        """
        return (-0.5 * ((action - mean) / self.log_std.exp()).pow(2) - self.log_std - 0.5 * LOG_2PI).sum(-1)


class RunningMeanStd:
    """Running mean and variance over batches (Chan et al.'s parallel update), float64."""

    def __init__(self, shape: tuple[int, ...] = (), epsilon: float = 1e-4) -> None:
        self.mean = np.zeros(shape, np.float64)
        self.var = np.ones(shape, np.float64)
        self.count = epsilon

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x, np.float64).reshape(-1, *self.mean.shape)
        batch_mean, batch_var, n = x.mean(0), x.var(0), x.shape[0]
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


def resolve_device(name: str) -> torch.device:
    """``--device``: auto (CUDA when torch sees it, else the CPU), cpu, cuda or cuda:N."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"--device {name} was asked for, but torch sees no CUDA device; use --device auto or cpu")
    return torch.device(name)
