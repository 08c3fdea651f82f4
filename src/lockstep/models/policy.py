"""The one policy API: every policy, feedforward or recurrent, answers the same calls.

A feedforward policy is a recurrent one whose state holds 0 floats per env slot: its state is an
empty [N, 0] tensor that goes in and comes out unchanged, so no caller asks which kind it has.

    step(obs [N], noise [N, w], state [N, S])           -> action [N, *act], log-prob, value [N], next state [N, S]
    evaluate(obs [T, N], actions, starts, state [N, S]) -> log-prob, entropy, value [T, N]
    evaluate_step(obs [N], actions [N], state [N, S])   -> log-prob [N], next state   (the audit's replay)
    mode(obs [N], state [N, S])                         -> the most likely action [N, *act], next state
    states(obs [T, N], starts, state [N, S], cuts)      -> states after the steps [T, N, S]   (bootstrap)
    value_after(obs [M], state [M, S])                  -> V [M]   (bootstrap)

Actions are sampled from externally supplied uniform noise (``algo/noise.py``) rather than a global
RNG, so each env slot draws from its own reproducible stream whatever batch its request lands in.
The heads here (Categorical for Discrete, a diagonal Gaussian for Box) hold the one formula for the
behaviour log-prob at inference and for the recomputed one in training and the audit.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import torch
from torch import nn

from lockstep.common.tree import first_leaf, leaf_map
from lockstep.envs import SpaceSpec

LOG_2PI = math.log(2 * math.pi)


class Policy(nn.Module):
    """An action head and a value over an observation and a per-slot state (module docstring).

    What a subclass implements: a feedforward policy (``state_size`` 0) only ``features``; a
    recurrent one sets ``state_size`` and implements ``step_features``, ``sequence_features`` and
    ``states`` (``RecurrentPolicy`` is the built-in one). Discrete actions are Categorical over
    ``action_dim`` choices; Box actions a diagonal Gaussian with a state-independent ``log_std``.
    """

    state_size = 0

    def __init__(self, action: SpaceSpec, init_log_std: float = 0.0) -> None:
        super().__init__()
        self.discrete = action.discrete
        self.action_dim = action.n if self.discrete else int(np.prod(action.shape))
        self.action_shape = () if self.discrete else tuple(action.shape)
        if not self.discrete:
            self.log_std = nn.Parameter(torch.full((self.action_dim,), float(init_log_std)))

    @property
    def noise_width(self) -> int:
        """Uniform numbers needed per sampled action."""
        return self.action_dim if self.discrete else 2 * self.action_dim

    def initial_state(self, slots: int) -> np.ndarray:
        """[slots, S] zeros: the state of slots whose episodes start (S = 0: an empty array)."""
        return np.zeros((slots, self.state_size), np.float32)

    # -- what a subclass implements ------------------------------------------------------------

    def features(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A feedforward policy's network: obs [B, *obs] -> (head output [B, action_dim], value [B])."""
        raise NotImplementedError(f"{type(self).__name__} must implement features(obs) (a feedforward policy) or "
                                  "step_features, sequence_features and states (a recurrent one): "
                                  "docs/custom-policy.md")

    def step_features(self, obs: torch.Tensor, state: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step, no reset: obs [N, *obs], state [N, S] -> head output [N, action_dim], value [N], next state."""
        head, value = self.features(obs)
        return head, value, state  # a feedforward policy's empty state passes through

    def sequence_features(self, obs: torch.Tensor, starts: torch.Tensor, state: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        """obs [T, N, *obs], starts [T, N] (the state resets there), state [N, S] -> head output
        [T * N, action_dim] and value [T * N], rows in (t, n) order."""
        head, value = self.features(leaf_map(lambda x: x.reshape(-1, *x.shape[2:]), obs))  # the steps are independent
        return head, value

    def states(self, obs: torch.Tensor, starts: torch.Tensor, state: torch.Tensor,
               cuts: Iterable[int] = ()) -> torch.Tensor:
        """[T, N, S] the state after each step where one is bootstrapped from (``RecurrentPolicy.core``)."""
        T, N = starts.shape
        return torch.zeros((T, N, self.state_size), device=first_leaf(obs).device)  # nothing to carry: no forward pass

    # -- the API every caller uses -------------------------------------------------------------

    def step(self, obs: torch.Tensor, noise: torch.Tensor, state: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample actions with the given noise: obs [N, *obs], noise [N, noise_width] in (0, 1), state [N, S]
        (already reset where episodes start) -> action [N, *act], log-prob [N], value [N], next state [N, S].
        """
        head, value, after = self.step_features(obs, state)
        action, logprob = self.sample_head(head, noise)
        return action, logprob, value, after

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor, starts: torch.Tensor, state: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """obs [T, N, *obs], actions [T, N, *act], starts [T, N], state [N, S] -> log-prob, entropy, value
        [T, N] of the given actions under the current parameters (a feedforward policy ignores starts, state)."""
        T, N = starts.shape
        head, value = self.sequence_features(obs, starts, state)
        logprob, entropy = self.evaluate_head(head, actions.reshape(T * N, *actions.shape[2:]))
        return logprob.reshape(T, N), entropy.reshape(T, N), value.reshape(T, N)

    def evaluate_step(self, obs: torch.Tensor, actions: torch.Tensor, state: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of given actions, as ``step`` computed it: obs [N, *obs], actions [N, *act], state [N, S]
        -> log-prob [N], next state [N, S]."""
        head, _, after = self.step_features(obs, state)
        return self.evaluate_head(head, actions)[0], after

    def mode(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The most likely action (argmax for Discrete, the Gaussian's mean for Box) [N, *act], next state."""
        head, _, after = self.step_features(obs, state)
        action = head.argmax(-1) if self.discrete else head.reshape(-1, *self.action_shape)
        return action, after

    def value_after(self, obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """V [M] of observations [M, *obs] that follow states [M, S] (no reset): the bootstrap values."""
        return self.step_features(obs, state)[1]

    # -- heads ---------------------------------------------------------------------------------

    def sample_head(self, out: torch.Tensor, uniform: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Head output [B, action_dim], noise [B, noise_width] -> action [B, *act], log-prob [B]."""
        if self.discrete:
            logits = out.log_softmax(-1)  # [B, n]
            gumbel = -torch.log(-torch.log(uniform))  # Gumbel-max: argmax(logits + g) ~ Categorical
            action = (logits + gumbel).argmax(-1)
            return action, logits.gather(-1, action[:, None]).squeeze(-1)
        u1, u2 = uniform[:, : self.action_dim], uniform[:, self.action_dim:]
        z = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)  # Box-Muller: z ~ N(0, 1)
        action = out + self.log_std.exp() * z
        # The log-prob of the float32 action that is returned and stored, not of z: with a small std
        # and a large mean the action keeps only part of z's precision, and training and the audit
        # recompute the log-prob from the stored action (``evaluate``), so the two must be one formula.
        return action.reshape(-1, *self.action_shape), self._gaussian_logprob(out, action)

    def evaluate_head(self, out: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Head output [B, action_dim], actions [B, *act] -> log-prob [B], entropy [B]."""
        if self.discrete:
            logits = out.log_softmax(-1)
            logprob = logits.gather(-1, action.long()[:, None]).squeeze(-1)
            entropy = -(logits.exp() * logits).sum(-1)
            return logprob, entropy
        a = action.reshape(action.shape[0], -1)
        entropy = (0.5 + 0.5 * LOG_2PI + self.log_std).sum().expand(a.shape[0])
        return self._gaussian_logprob(out, a), entropy

    def _gaussian_logprob(self, mean: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Log-density [B] of flat actions [B, d] under N(mean, exp(log_std)^2), summed over dimensions.

        The one formula for the behaviour log-prob (``step``) and the recomputed one (``evaluate``),
        so that on the same rows they are bit-identical.
        """
        return (-0.5 * ((action - mean) / self.log_std.exp()).pow(2) - self.log_std - 0.5 * LOG_2PI).sum(-1)
