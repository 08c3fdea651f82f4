"""Recurrent policies: a torso, a recurrent core (an LSTM or a GRU) and linear heads; the core's state is
each env slot's state.

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

# the recurrent cores (``model.rnn``): the module, and how many [W] vectors a slot's state holds
CORES: dict[str, tuple[type[nn.RNNBase], int]] = {"lstm": (nn.LSTM, 2), "gru": (nn.GRU, 1)}

Hidden = torch.Tensor | tuple[torch.Tensor, ...]  # what ``nn.GRU`` (h) or ``nn.LSTM`` ((h, c)) takes, each [1, B, W]


def _parts(hx: Hidden) -> tuple[torch.Tensor, ...]:
    return hx if isinstance(hx, tuple) else (hx,)


def _hidden(parts: Iterable[torch.Tensor], lstm: bool) -> Hidden:
    parts = tuple(p.contiguous() for p in parts)
    return parts if lstm else parts[0]


class Paired(nn.Module):
    """Two cores of ``size`` over the same input, the actor's and the critic's, called like one ``nn.LSTM`` (or
    ``nn.GRU``) of twice the size: outputs [T, B, 2 * size] and each state part [1, B, 2 * size] are the actor's
    half, then the critic's (sb3-contrib's ``enable_critic_lstm``: the value's memory does not steer the policy's)."""

    def __init__(self, width: int, size: int, rnn: str = "lstm") -> None:
        super().__init__()
        make = CORES[rnn][0]
        self.actor, self.critic = make(width, size), make(width, size)
        self.size = size
        self.with_cell = rnn == "lstm"  # an LSTM: the state is (h, c)

    def forward(self, x: torch.Tensor, state: Hidden) -> tuple[torch.Tensor, Hidden]:
        H = self.size
        parts = _parts(state)  # [1, B, 2 * size] each
        out_a, hx_a = self.actor(x, _hidden((p[..., :H] for p in parts), self.with_cell))
        out_c, hx_c = self.critic(x, _hidden((p[..., H:] for p in parts), self.with_cell))
        joined = tuple(torch.cat([a, c], -1) for a, c in zip(_parts(hx_a), _parts(hx_c)))
        return torch.cat([out_a, out_c], -1), joined if self.with_cell else joined[0]


class RecurrentPolicy(Policy):
    """A torso, a recurrent core and linear heads; the core's state is what the learner keeps per env slot.

    ``rnn`` names the core (``CORES``): an LSTM, whose state is (h, c), or a GRU, whose state is h. The
    state of B slots travels as one float32 array [B, S]: h, then c for an LSTM (S = 2W), h alone for a
    GRU (S = W), W being the core's width: ``size``, or 2 * ``size`` with ``critic_lstm`` (``Paired``: the
    critic's own core beside the actor's). The core is the module named ``rnn`` (``self.lstm`` or
    ``self.gru``, the parameters' names in a checkpoint). A slot's state is reset to zeros where its
    episode starts; ``starts`` [T, B] marks those steps in a sequence.
    """

    def __init__(self, torso: nn.Module, width: int, size: int, action: SpaceSpec, init_log_std: float = 0.0,
                 critic_lstm: bool = False, rnn: str = "lstm") -> None:
        super().__init__(action, init_log_std)
        if rnn not in CORES:
            raise ValueError(f"unknown recurrent core {rnn!r}; cores: {', '.join(CORES)}")
        self.torso = torso
        self.rnn = rnn
        core = Paired(width, size, rnn) if critic_lstm else CORES[rnn][0](width, size)
        self.add_module(rnn, core)
        for name, param in core.named_parameters():
            if "bias" in name:
                nn.init.zeros_(param)
            else:
                nn.init.orthogonal_(param, 1.0)
        self.critic_lstm = critic_lstm
        self.size = 2 * size if critic_lstm else size  # W
        self.state_size = CORES[rnn][1] * self.size
        self.actor = layer(size, self.action_dim, 0.01)
        self.critic = layer(size, 1, 1.0)

    def _policy_in(self, out: torch.Tensor) -> torch.Tensor:
        """The actor head's input: the core's output [..., W], or its actor half with ``critic_lstm``."""
        return out[..., : self.size // 2] if self.critic_lstm else out

    def _value_in(self, out: torch.Tensor) -> torch.Tensor:
        return out[..., self.size // 2:] if self.critic_lstm else out

    def core(self, obs: torch.Tensor, starts: np.ndarray | torch.Tensor | None, state: torch.Tensor,
             cuts: Iterable[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """obs [T, B, *obs], starts [T, B] (None: no episode starts), state [B, S] -> core outputs [T, B, W],
        states after steps [T, B, S].

        The sequence runs in segments, one ``nn.LSTM`` (``nn.GRU``) call each (a Python loop over single steps
        is several times slower): a segment ends before every step where some slot's episode starts,
        whose state is zeroed there, and before every step in ``cuts``. The state after a step is
        known where a segment ends (the last step, every step before a start or a cut); the other
        rows of the returned states are NaN, so that reading one is loud. The segments are read from
        ``starts`` on the host (the learner passes a numpy array): on a GPU, finding them in a device
        tensor would wait for the device once per call.
        """
        T, B = first_leaf(obs).shape[:2]
        x = self.torso(leaf_map(lambda o: o.reshape(T * B, *o.shape[2:]), obs)).reshape(T, B, -1)  # [T, B, width]
        core, lstm = self.get_submodule(self.rnn), self.rnn == "lstm"
        hx = _hidden(state[None].split(self.size, -1), lstm)  # (h, c) or h, [1, B, W] each
        host = np.zeros((T, B), bool) if starts is None else np.asarray(starts.cpu() if torch.is_tensor(starts)
                                                                        else starts, bool)
        bounds = sorted({0, T} | set(np.flatnonzero(host.any(1)).tolist()) | {t for t in cuts if 0 < t < T})
        resets = None if starts is None else torch.from_numpy(host).to(x.device, non_blocking=True)  # [T, B]
        outputs = []
        states = torch.full((T, B, self.state_size), float("nan"), device=x.device)
        for first, end in zip(bounds[:-1], bounds[1:]):
            if resets is not None:
                keep = (1.0 - resets[first].float())[None, :, None]  # [1, B, 1]: zero the state where episodes start
                hx = _hidden((p * keep for p in _parts(hx)), lstm)
            out, hx = core(x[first:end], hx)
            outputs.append(out)
            states[end - 1] = torch.cat([p[0] for p in _parts(hx)], -1)
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
