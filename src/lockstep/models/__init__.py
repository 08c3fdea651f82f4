"""Policies: MLP, CNN and LSTM actor-critics with a Categorical or a Gaussian head.

``build_policy`` picks the network from the observation space and the ``model`` config section:
an MLP for flat observations, the Nature CNN for Atari frames, a small CNN for MinAtar, each
optionally followed by an LSTM (``model.lstm_size``).

Actions are sampled from externally supplied uniform noise (see ``noise.py``)
rather than a global RNG, so each env slot draws from its own reproducible
stream whatever batch its request lands in.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from lockstep.config import ModelConfig, setting_of
from lockstep.envs import SpaceSpec
from lockstep.models.networks import layer, mlp, mlp_torso, nature_cnn, small_cnn

LOG_2PI = math.log(2 * math.pi)


class Policy(nn.Module):
    """What lockstep needs of a policy network: an action head over features of the observation.

    Subclasses set ``actor`` (features -> action logits or Gaussian means) and ``critic``
    (features -> value) through ``features``. Discrete actions are Categorical over ``action_dim``
    choices; Box actions a diagonal Gaussian with a state-independent ``log_std``. Actions are
    sampled from given uniform noise (``noise_width`` numbers per row), never from a global RNG.

    ``state_size`` is 0 for a feedforward policy. A recurrent policy (``RecurrentPolicy``) keeps
    ``state_size`` floats per env slot between steps; the learner stores them (see ``sample_step``).
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

    def features(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """obs [B, *obs] -> (policy head output [B, action_dim], value [B])."""
        raise NotImplementedError

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """[B, *obs] -> [B]"""
        return self.features(obs)[1]

    def sample(self, obs: torch.Tensor, uniform: torch.Tensor,
               between: Callable[[], None] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample actions with the given noise. obs [B, *obs], uniform [B, noise_width] in (0, 1).

        Returns action [B, *act], log-prob [B], value [B]. ``between`` runs after the forward
        pass and before sampling (adversarial tests widen the window in which an in-place update
        could tear a pass; ``ActorCritic`` runs it between its two networks).
        """
        out, value = self.features(obs)
        if between is not None:
            between()
        action, logprob = self.sample_head(out, uniform)
        return action, logprob, value

    def evaluate(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-prob [B], entropy [B] and value [B] of given actions under the current parameters."""
        out, value = self.features(obs)
        logprob, entropy = self.evaluate_head(out, action)
        return logprob, entropy, value

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

        The one formula for the behaviour log-prob (``sample``) and the recomputed one
        (``evaluate``), so that on the same rows they are bit-identical.
        """
        return (-0.5 * ((action - mean) / self.log_std.exp()).pow(2) - self.log_std - 0.5 * LOG_2PI).sum(-1)


class ActorCritic(Policy):
    """Separate actor and critic MLPs on flat observations (CleanRL's ``ppo.py`` layout and initialization)."""

    def __init__(self, observation: SpaceSpec, action: SpaceSpec, hidden: list[int],
                 activation: str = "tanh", init_log_std: float = 0.0) -> None:
        super().__init__(action, init_log_std)
        obs_dim = int(np.prod(observation.shape))
        self.critic = mlp(obs_dim, hidden, 1, activation, 1.0)
        self.actor = mlp(obs_dim, hidden, self.action_dim, activation, 0.01)

    def features(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        flat = obs.flatten(1)
        return self.actor(flat), self.critic(flat).squeeze(-1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs.flatten(1)).squeeze(-1)

    def sample(self, obs: torch.Tensor, uniform: torch.Tensor,
               between: Callable[[], None] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        flat = obs.flatten(1)
        out = self.actor(flat)
        if between is not None:  # between the two networks: a torn read mixes versions across them
            between()
        value = self.critic(flat).squeeze(-1)
        action, logprob = self.sample_head(out, uniform)
        return action, logprob, value


class TorsoActorCritic(Policy):
    """A shared torso (a CNN for images) with a linear policy head and a linear value head."""

    def __init__(self, torso: nn.Module, width: int, action: SpaceSpec, init_log_std: float = 0.0) -> None:
        super().__init__(action, init_log_std)
        self.torso = torso
        self.actor = layer(width, self.action_dim, 0.01)
        self.critic = layer(width, 1, 1.0)

    def features(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.torso(obs)
        return self.actor(hidden), self.critic(hidden).squeeze(-1)


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

    def initial_state(self, slots: int) -> np.ndarray:
        return np.zeros((slots, self.state_size), np.float32)

    def core(self, obs: torch.Tensor, starts: torch.Tensor, state: torch.Tensor,
             cuts: Iterable[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """obs [T, B, *obs], starts [T, B], state [B, 2W] -> LSTM outputs [T, B, W], states after steps [T, B, 2W].

        The sequence runs in segments, one ``nn.LSTM`` call each (a Python loop over single steps
        is several times slower): a segment ends before every step where some slot's episode starts,
        whose state is zeroed there, and before every step in ``cuts``. The state after a step is
        known where a segment ends (the last step, every step before a start or a cut); the other
        rows of the returned states are NaN, so that reading one is loud.
        """
        T, B = starts.shape
        x = self.torso(obs.reshape(T * B, *obs.shape[2:])).reshape(T, B, -1)  # [T, B, width]
        h, c = state[None, :, : self.size], state[None, :, self.size:]  # [1, B, W] each
        bounds = sorted({0, T} | {int(t) for t in starts.any(1).nonzero().flatten()} | {t for t in cuts if 0 < t < T})
        outputs = []
        states = torch.full((T, B, self.state_size), float("nan"), device=x.device)
        for first, end in zip(bounds[:-1], bounds[1:]):
            keep = (1.0 - starts[first].float())[None, :, None]  # [1, B, 1]: zero the state where episodes start
            out, (h, c) = self.lstm(x[first:end], ((h * keep).contiguous(), (c * keep).contiguous()))
            outputs.append(out)
            states[end - 1] = torch.cat([h[0], c[0]], -1)
        return torch.cat(outputs), states

    def features_step(self, obs: torch.Tensor, state: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``features`` for one step, no reset: obs [B, *obs], state [B, 2W] -> policy head output
        [B, action_dim], value [B], next state [B, 2W]."""
        out, after = self.advance(obs, state)
        return self.actor(self._policy_in(out)), self.critic(self._value_in(out)).squeeze(-1), after

    def sample_step(self, obs: torch.Tensor, uniform: torch.Tensor, state: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step: obs [B, *obs], noise [B, w], state [B, 2W] (already reset where episodes start)
        -> action [B, *act], log-prob [B], value [B], next state [B, 2W]."""
        head, value, after = self.features_step(obs, state)
        action, logprob = self.sample_head(head, uniform)
        return action, logprob, value, after

    def evaluate_sequence(self, obs: torch.Tensor, action: torch.Tensor, starts: torch.Tensor, state: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """obs [T, B, *obs], actions [T, B, *act], starts [T, B], state [B, 2W] -> log-prob, entropy, value [T, B]."""
        T, B = starts.shape
        out, _ = self.core(obs, starts, state)
        flat = out.reshape(T * B, -1)
        actions = action.reshape(T * B, *action.shape[2:])
        logprob, entropy = self.evaluate_head(self.actor(self._policy_in(flat)), actions)
        return logprob.reshape(T, B), entropy.reshape(T, B), self.critic(self._value_in(flat)).reshape(T, B)

    def evaluate_step(self, obs: torch.Tensor, action: torch.Tensor, state: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of given actions: obs [B, *obs], actions [B, *act], state [B, 2W] -> log-prob [B], next state."""
        head, _, after = self.features_step(obs, state)
        return self.evaluate_head(head, action)[0], after

    def values_sequence(self, obs: torch.Tensor, starts: torch.Tensor, state: torch.Tensor, cuts: Iterable[int] = ()
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """obs [T, B, *obs], starts [T, B], state [B, 2W] -> values [T, B], states [T, B, 2W] after the steps
        that end a segment (``core``): the last step, each step before an episode start or a step in ``cuts``."""
        out, states = self.core(obs, starts, state, cuts)
        return self.critic(self._value_in(out)).squeeze(-1), states

    def value_after(self, obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """V of observations [M, *obs] that follow states [M, 2W] (no reset): the bootstrap values."""
        return self.features_step(obs, state)[1]

    def advance(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step, no reset: obs [B, *obs], state [B, 2W] -> LSTM output [B, W], next state [B, 2W]."""
        out, states = self.core(obs[None], torch.zeros(1, obs.shape[0], device=obs.device), state)
        return out[0], states[0]

    def features(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise TypeError("a recurrent policy needs its state: use sample_step / evaluate_sequence")


def torso_kind(observation: SpaceSpec, kind: str) -> str:
    """``model.kind`` resolved: auto takes a CNN for image observations [C, H, W] (the Nature CNN from
    36 pixels up, the small MinAtar CNN below) and the MLP for everything else."""
    if kind != "auto":
        return kind
    if len(observation.shape) == 3:
        return "nature-cnn" if min(observation.shape[1:]) >= 36 else "small-cnn"
    return "mlp"


def build_policy(observation: SpaceSpec, action: SpaceSpec, model: ModelConfig) -> Policy:
    """The policy the config names, for these spaces: ``model.policy``'s factory, or the built-in family."""
    if model.policy:
        policy = load_factory(model.policy)(observation, action, model)
        if not isinstance(policy, Policy):
            raise TypeError(f"model.policy {model.policy!r} returned a {type(policy).__name__}, not a "
                            "lockstep.Policy (subclass lockstep.Policy: docs/custom-policy.md)")
        return policy
    kind = torso_kind(observation, model.kind)
    if kind in ("nature-cnn", "small-cnn"):
        if len(observation.shape) != 3:
            raise ValueError(f"model.kind {kind} needs image observations [C, H, W], got shape {observation.shape}")
        make = nature_cnn if kind == "nature-cnn" else small_cnn
        torso, width = make(observation.shape[0], tuple(observation.shape[1:]))
    elif kind == "mlp":
        if model.lstm_size == 0:
            return ActorCritic(observation, action, model.hidden, model.activation, model.init_log_std)
        torso, width = mlp_torso(int(np.prod(observation.shape)), model.hidden, model.activation)
    else:
        raise ValueError(f"unknown model.kind {kind!r}; kinds: {', '.join(setting_of('model.kind').choices)}")
    if model.lstm_size > 0:
        return RecurrentPolicy(torso, width, model.lstm_size, action, model.init_log_std, model.critic_lstm)
    return TorsoActorCritic(torso, width, action, model.init_log_std)


def load_factory(reference: str) -> Callable[..., Policy]:
    """``package.module:name`` or ``path/to/file.py:name`` (a dotted name for a nested attribute)."""
    where, _, name = reference.rpartition(":")
    if not where or not name:
        raise ValueError(f"model.policy {reference!r} must look like package.module:factory or file.py:factory")
    try:
        if where.endswith(".py"):
            spec = importlib.util.spec_from_file_location(f"lockstep_policy_{Path(where).stem}", where)
            if spec is None or not Path(where).is_file():
                raise ImportError(f"no file {where}")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
        target = module
        for part in name.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"model.policy {reference!r} cannot be loaded: {err}") from err
    return target


def resolve_device(name: str) -> torch.device:
    """``--device``: auto (CUDA when torch sees it, else the CPU), cpu, cuda or cuda:N."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"--device {name} was asked for, but torch sees no CUDA device; use --device auto or cpu")
    return torch.device(name)
