"""Recurrent policies: a torso, an LSTM and linear heads; the LSTM's (h, c) is each env slot's state.

The learner keeps every slot's state between requests (SEED's design), zeroes it where an episode
starts, stores it at the start of every unroll, and trains by backpropagation through each unroll.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
from torch import nn

from lockstep.common.tree import first_leaf, leaf_map
from lockstep.envs import SpaceSpec
from lockstep.models.networks import layer
from lockstep.models.policy import Policy


class PairedLSTM(nn.Module):
    """Two LSTMs of ``size`` over the same input, the actor's and the critic's, called like one ``nn.LSTM``
    of twice the size: outputs [T, B, 2 * size] and states [1, B, 2 * size] are the actor's half, then
    the critic's (sb3-contrib's ``enable_critic_lstm``: the value's memory does not steer the policy's)."""

    def __init__(self, width: int, size: int) -> None:
        super().__init__()
        self.actor, self.critic = nn.LSTM(width, size), nn.LSTM(width, size)
        self.size = size

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        h, c = state  # [1, B, 2 * size] each
        H = self.size
        out_a, (h_a, c_a) = self.actor(x, (h[..., :H].contiguous(), c[..., :H].contiguous()))
        out_c, (h_c, c_c) = self.critic(x, (h[..., H:].contiguous(), c[..., H:].contiguous()))
        return torch.cat([out_a, out_c], -1), (torch.cat([h_a, h_c], -1), torch.cat([c_a, c_c], -1))


class RecurrentPolicy(Policy):
    """A torso, an LSTM and linear heads; the LSTM's (h, c) is the state the learner keeps per env slot.

    The state of B slots travels as one float32 array [B, 2 * W] (h, then c), W being the LSTM's
    width: ``size``, or 2 * ``size`` with ``critic_lstm`` (a ``PairedLSTM``: the critic's own LSTM
    beside the actor's). A slot's state is reset to zeros where its episode starts; ``starts`` [T, B]
    marks those steps in a sequence.
    """

    def __init__(self, torso: nn.Module, width: int, size: int, action: SpaceSpec, init_log_std: float = 0.0,
                 critic_lstm: bool = False) -> None:
        super().__init__(action, init_log_std)
        self.torso = torso
        self.lstm = PairedLSTM(width, size) if critic_lstm else nn.LSTM(width, size)
        for name, param in self.lstm.named_parameters():
            if "bias" in name:
                nn.init.zeros_(param)
            else:
                nn.init.orthogonal_(param, 1.0)
        self.critic_lstm = critic_lstm
        self.size = 2 * size if critic_lstm else size  # W
        self.state_size = 2 * self.size
        self.actor = layer(size, self.action_dim, 0.01)
        self.critic = layer(size, 1, 1.0)

    def _policy_in(self, out: torch.Tensor) -> torch.Tensor:
        """The actor head's input: the LSTM output [..., W], or its actor half with ``critic_lstm``."""
        return out[..., : self.size // 2] if self.critic_lstm else out

    def _value_in(self, out: torch.Tensor) -> torch.Tensor:
        return out[..., self.size // 2:] if self.critic_lstm else out

    def core(self, obs: torch.Tensor, starts: np.ndarray | torch.Tensor | None, state: torch.Tensor,
             cuts: Iterable[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """obs [T, B, *obs], starts [T, B] (None: no episode starts), state [B, 2W] -> LSTM outputs [T, B, W],
        states after steps [T, B, 2W].

        The sequence runs in segments, one ``nn.LSTM`` call each (a Python loop over single steps
        is several times slower): a segment ends before every step where some slot's episode starts,
        whose state is zeroed there, and before every step in ``cuts``. The state after a step is
        known where a segment ends (the last step, every step before a start or a cut); the other
        rows of the returned states are NaN, so that reading one is loud. The segments are read from
        ``starts`` on the host (the learner passes a numpy array): on a GPU, finding them in a device
        tensor would wait for the device once per call.
        """
        T, B = first_leaf(obs).shape[:2]
        x = self.torso(leaf_map(lambda o: o.reshape(T * B, *o.shape[2:]), obs)).reshape(T, B, -1)  # [T, B, width]
        h, c = state[None, :, : self.size], state[None, :, self.size:]  # [1, B, W] each
        host = np.zeros((T, B), bool) if starts is None else np.asarray(starts.cpu() if torch.is_tensor(starts)
                                                                        else starts, bool)
        bounds = sorted({0, T} | set(np.flatnonzero(host.any(1)).tolist()) | {t for t in cuts if 0 < t < T})
        resets = None if starts is None else torch.from_numpy(host).to(x.device, non_blocking=True)  # [T, B]
        outputs = []
        states = torch.full((T, B, self.state_size), float("nan"), device=x.device)
        for first, end in zip(bounds[:-1], bounds[1:]):
            if resets is not None:
                keep = (1.0 - resets[first].float())[None, :, None]  # [1, B, 1]: zero the state where episodes start
                h, c = h * keep, c * keep
            out, (h, c) = self.lstm(x[first:end], (h.contiguous(), c.contiguous()))
            outputs.append(out)
            states[end - 1] = torch.cat([h[0], c[0]], -1)
        return torch.cat(outputs), states

    def step_features(self, obs: torch.Tensor, state: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # one step: no episode starts within it
        out, after = self.core(leaf_map(lambda o: o[None], obs), None, state)
        out = out[0]  # [B, W]
        return self.actor(self._policy_in(out)), self.critic(self._value_in(out)).squeeze(-1), after[0]

    def sequence_features(self, obs: torch.Tensor, starts: torch.Tensor, state: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor]:
        T, B = starts.shape
        out, _ = self.core(obs, starts, state)
        flat = out.reshape(T * B, -1)
        return self.actor(self._policy_in(flat)), self.critic(self._value_in(flat)).reshape(T * B)

    def states(self, obs: torch.Tensor, starts: torch.Tensor, state: torch.Tensor,
               cuts: Iterable[int] = ()) -> torch.Tensor:
        return self.core(obs, starts, state, cuts)[1]
