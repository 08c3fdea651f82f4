"""The one policy API: every policy, feedforward or recurrent, answers the same calls.

A feedforward policy is a recurrent one whose state holds 0 floats per env slot: its state is an
empty [N, 0] tensor that goes in and comes out unchanged, so no caller asks which kind it has.

    step(obs [N], noise [N, w], state [N, S])           -> action [N, *act], log-prob, value [N], next state [N, S]
    evaluate(obs [T, N], actions, starts, state [N, S]) -> log-prob, entropy, value [T, N]
    evaluate_step(obs [N], actions [N], state [N, S])   -> log-prob [N], next state   (one step replayed)
    audit_step(obs [N], actions [N], state [N, S])      -> log-prob, its terms' magnitude [N], next state   (the audit)
    mode(obs [N], state [N, S])                         -> the most likely action [N, *act], next state
    states(obs [T, N], starts, state [N, S], cuts)      -> states after the steps [T, N, S]   (bootstrap)
    value_after(obs [M], state [M, S])                  -> V [M]   (bootstrap)

Actions are sampled from externally supplied uniform noise (``algo/noise.py``) rather than a global
RNG, so each env slot draws from its own reproducible stream whatever batch its request lands in.
The heads here (Categorical for Discrete, a diagonal Gaussian for Box) hold the one formula for the
behaviour log-prob at inference and for the recomputed one in training and the audit. The other action
spaces are made of those: a MultiDiscrete is a Categorical per entry, a MultiBinary a Categorical of 2
per bit, a Dict or Tuple its leaves' heads side by side; their log-probs and entropies are summed over
the entries (``Heads``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import torch
from torch import nn

from lockstep.common.tree import first_leaf, leaf_map
from lockstep.envs import SpaceSpec, action_entries, leaf_choices

LOG_2PI = math.log(2 * math.pi)
# the logit of a choice an action mask forbids: finite, so that its probability is exactly 0 (and 0 * log 0
# in the entropy is 0, not NaN), and far below what Gumbel noise of float32 uniforms reaches (under 17)
MASKED = -1e8


class Policy(nn.Module):
    """An action head and a value over an observation and a per-slot state (module docstring).

    What a subclass implements: a feedforward policy (``state_size`` 0) only ``features``; a
    recurrent one sets ``state_size`` and implements ``step_features``, ``sequence_features`` and
    ``states`` (``RecurrentPolicy`` is the built-in one). Discrete actions are Categorical over
    ``action_dim`` choices; Box actions a diagonal Gaussian with a state-independent ``log_std``.
    """

    state_size = 0
    action_mask = ""  # the observation leaf that masks the action's choices (``build_policy`` sets it), or none

    def __init__(self, action: SpaceSpec, init_log_std: float = 0.0) -> None:
        super().__init__()
        self.discrete = action.discrete
        self.action_shape = action.element_shape
        # one Discrete or one Box: the heads below; any other space: ``Heads``, Categoricals and a Gaussian
        self.heads = None if action.kind in ("discrete", "box") else Heads(action)
        if self.heads is not None:
            self.action_dim, gaussian = self.heads.width, self.heads.gaussian
        else:
            self.action_dim = action.n if self.discrete else int(np.prod(action.shape))
            gaussian = 0 if self.discrete else self.action_dim
        self.action_long = action.action_dtype == np.int64  # how stored actions become tensors
        if gaussian:
            self.log_std = nn.Parameter(torch.full((gaussian,), float(init_log_std)))

    @property
    def noise_width(self) -> int:
        """Uniform numbers needed per sampled action: one per choice of each Categorical (Gumbel-max), two per
        Gaussian dimension (Box-Muller)."""
        if self.heads is not None:
            return self.heads.noise_width
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
        head = self.masked(head, obs)
        action, logprob = self.sample_head(head, noise)
        return action, logprob, value, after

    def evaluate(self, obs: torch.Tensor, actions: torch.Tensor, starts: torch.Tensor, state: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """obs [T, N, *obs], actions [T, N, *act], starts [T, N], state [N, S] -> log-prob, entropy, value
        [T, N] of the given actions under the current parameters (a feedforward policy ignores starts, state)."""
        T, N = starts.shape
        head, value = self.sequence_features(obs, starts, state)
        head = self.masked(head, obs)
        logprob, entropy = self.evaluate_head(head, actions.reshape(T * N, *actions.shape[2:]))
        return logprob.reshape(T, N), entropy.reshape(T, N), value.reshape(T, N)

    def evaluate_step(self, obs: torch.Tensor, actions: torch.Tensor, state: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of given actions, as ``step`` computed it: obs [N, *obs], actions [N, *act], state [N, S]
        -> log-prob [N], next state [N, S]."""
        logprob, _, after = self.audit_step(obs, actions, state)
        return logprob, after

    def audit_step(self, obs: torch.Tensor, actions: torch.Tensor, state: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``evaluate_step`` and the magnitude of each log-prob's terms: obs [N, *obs], actions [N, *act], state
        [N, S] -> log-prob [N], magnitude [N] (``logprob_magnitude``), next state [N, S]."""
        head, _, after = self.step_features(obs, state)
        head = self.masked(head, obs)
        logprob = self.evaluate_head(head, actions)[0]
        flat = actions.reshape(actions.shape[0], -1)
        if self.heads is not None:
            magnitude = self.heads.magnitude(head, flat, getattr(self, "log_std", None))
        elif self.discrete:
            magnitude = _categorical_magnitude(head)
        else:
            magnitude = _gaussian_magnitude(head, flat, self.log_std)
        return logprob, magnitude, after

    def mode(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The most likely action (argmax for Discrete, the Gaussian's mean for Box) [N, *act], next state."""
        head, _, after = self.step_features(obs, state)
        head = self.masked(head, obs)
        if self.heads is not None:
            return self.heads.mode(head), after
        action = head.argmax(-1) if self.discrete else head.reshape(-1, *self.action_shape)
        return action, after

    def entropy_by_entry(self, obs: torch.Tensor, starts: torch.Tensor, state: torch.Tensor,
                         valid: torch.Tensor) -> dict[str, float]:
        """The mean entropy of each entry of an action made of parts (``Heads.labels``: a MultiDiscrete's
        dimensions, a Dict's leaves) over the ``valid`` [T, N] steps of sequences obs [T, N, *obs]; {} for a
        Discrete or Box action (its entropy is the one reported)."""
        if self.heads is None:
            return {}
        head, _ = self.sequence_features(obs, starts, state)  # rows in (t, n) order
        head = self.masked(head, obs)  # the distribution acted from: a part forced to one choice has entropy 0
        means = self.heads.entropies(head[valid.reshape(-1)], getattr(self, "log_std", None)).mean(0)
        return dict(zip(self.heads.labels, means.tolist()))

    def masked(self, head: torch.Tensor, obs: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
        """Head output [B, action_dim] with the logits of choices the observation's action mask forbids
        (``action_mask``: its leaf, [B, *mask] or [T, N, *mask] for rows in (t, n) order) set to ``MASKED``;
        unchanged without a mask. Sampling, the stored log-prob, training, evaluation and the audit all pass
        here, so all see the same distribution."""
        if not self.action_mask:
            return head
        allowed = obs[self.action_mask].reshape(head.shape[0], -1) != 0  # [B, choices]
        width = allowed.shape[1]
        logits = head[:, :width].masked_fill(~allowed, MASKED)
        return torch.cat([logits, head[:, width:]], -1) if head.shape[1] > width else logits

    def value_after(self, obs: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """V [M] of observations [M, *obs] that follow states [M, S] (no reset): the bootstrap values."""
        return self.step_features(obs, state)[1]

    # -- heads ---------------------------------------------------------------------------------

    def sample_head(self, out: torch.Tensor, uniform: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Head output [B, action_dim], noise [B, noise_width] -> action [B, *act], log-prob [B]."""
        if self.heads is not None:
            return self.heads.sample(out, uniform, getattr(self, "log_std", None))
        if self.discrete:
            logits = out.log_softmax(-1)  # [B, n]
            action = gumbel_argmax(logits, uniform)
            return action, logits.gather(-1, action[:, None]).squeeze(-1)
        u1, u2 = uniform[:, : self.action_dim], uniform[:, self.action_dim:]
        z = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)  # Box-Muller: z ~ N(0, 1)
        action = out + self.log_std.exp() * z
        # The log-prob of the float32 action that is returned and stored, not of z: with a small std
        # and a large mean the action keeps only part of z's precision, and training and the audit
        # recompute the log-prob from the stored action (``evaluate``), so the two must be one formula.
        return action.reshape(-1, *self.action_shape), _gaussian(out, action, self.log_std)

    def evaluate_head(self, out: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Head output [B, action_dim], actions [B, *act] -> log-prob [B], entropy [B]."""
        if self.heads is not None:
            logprob, entropies = self.heads.evaluate(out, action, getattr(self, "log_std", None))
            return logprob, entropies.sum(-1)
        if self.discrete:
            logits = out.log_softmax(-1)
            logprob = logits.gather(-1, action.long()[:, None]).squeeze(-1)
            entropy = -(logits.exp() * logits).sum(-1)
            return logprob, entropy
        a = action.reshape(action.shape[0], -1)
        entropy = (0.5 + 0.5 * LOG_2PI + self.log_std).sum().expand(a.shape[0])
        return _gaussian(out, a, self.log_std), entropy


def gumbel_argmax(logits: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """A sample [B] of Categorical(logits) [B, n] from uniform noise [B, n] in (0, 1): Gumbel-max,
    argmax(logits + g) with g = -log(-log(u)) Gumbel noise."""
    return (logits + -torch.log(-torch.log(uniform))).argmax(-1)


class Heads:
    """The heads of an action made of parts (``envs.spaces.action_entries``): a Categorical per discrete
    entry (Discrete: one, MultiDiscrete: one per element, MultiBinary: one of 2 per bit) and one diagonal
    Gaussian over every Box element. The action is the flat vector of the entries, [B, D].

    Head output [B, width]: each Categorical's logits in entry order, then the Gaussian's means.
    Noise [B, noise_width]: each Categorical's Gumbel uniforms, then two per Gaussian dimension.
    """

    def __init__(self, action: SpaceSpec) -> None:
        self.choices: list[int] = []  # per categorical entry
        self.categorical_at: list[int] = []  # its position in the action vector
        self.gaussian_at: list[int] = []  # positions of the Box elements
        categorical, gaussian = [], []  # the entries' names: the leaf's path, [i] for each of several elements
        for path, leaf, first, size in action_entries(action):
            names = [path] if size == 1 else [f"{path}[{i}]" for i in range(size)]
            if leaf.kind == "box":
                self.gaussian_at += range(first, first + size)
                gaussian += names
                continue
            self.choices += leaf_choices(leaf)
            self.categorical_at += range(first, first + size)
            categorical += names
        self.labels = categorical + gaussian  # of the entropies, in ``entropies``' order
        self.logits = sum(self.choices)
        self.gaussian = len(self.gaussian_at)
        self.width = self.logits + self.gaussian
        self.noise_width = self.logits + 2 * self.gaussian
        self.size = len(self.choices) + self.gaussian  # D
        self.dtype = torch.float32 if self.gaussian else torch.long
        self._cuts = np.cumsum([0, *self.choices]).tolist()

    def _categoricals(self, out: torch.Tensor) -> list[torch.Tensor]:
        """Each categorical entry's log-probabilities [B, n_i]."""
        return [out[:, a:z].log_softmax(-1) for a, z in zip(self._cuts[:-1], self._cuts[1:])]

    def sample(self, out: torch.Tensor, uniform: torch.Tensor, log_std: torch.Tensor | None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Head output [B, width], noise [B, noise_width] -> action [B, D], log-prob [B] (summed over entries)."""
        action = torch.zeros((out.shape[0], self.size), dtype=self.dtype, device=out.device)
        logprob = torch.zeros(out.shape[0], device=out.device)
        for i, (logits, a, z) in enumerate(zip(self._categoricals(out), self._cuts[:-1], self._cuts[1:])):
            choice = gumbel_argmax(logits, uniform[:, a:z])  # [B]
            action[:, self.categorical_at[i]] = choice.to(self.dtype)
            logprob = logprob + logits.gather(-1, choice[:, None]).squeeze(-1)
        if self.gaussian:
            mean, noise = out[:, self.logits:], uniform[:, self.logits:]
            u1, u2 = noise[:, : self.gaussian], noise[:, self.gaussian:]
            z = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)  # Box-Muller: z ~ N(0, 1)
            sampled = mean + log_std.exp() * z
            action[:, self.gaussian_at] = sampled
            # the log-prob of the stored float32 action, as ``Policy.sample_head`` computes it for a Box
            logprob = logprob + _gaussian(mean, action[:, self.gaussian_at], log_std)
        return action, logprob

    def evaluate(self, out: torch.Tensor, action: torch.Tensor, log_std: torch.Tensor | None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """Head output [B, width], actions [B, D] -> log-prob [B], entropies [B, E] (``entropies``: summed
        for the loss, reported one by one)."""
        logprob = torch.zeros(out.shape[0], device=out.device)
        for i, logits in enumerate(self._categoricals(out)):
            chosen = action[:, self.categorical_at[i]].long()
            logprob = logprob + logits.gather(-1, chosen[:, None]).squeeze(-1)
        if self.gaussian:
            logprob = logprob + _gaussian(out[:, self.logits:], action[:, self.gaussian_at].float(), log_std)
        return logprob, self.entropies(out, log_std)

    def entropies(self, out: torch.Tensor, log_std: torch.Tensor | None) -> torch.Tensor:
        """Head output [B, width] -> [B, E] the entropy of each entry (``labels``): each Categorical's, then
        each Gaussian dimension's."""
        columns = [-(logits.exp() * logits).sum(-1) for logits in self._categoricals(out)]
        if self.gaussian:
            columns += list((0.5 + 0.5 * LOG_2PI + log_std)[:, None].expand(self.gaussian, out.shape[0]))
        return torch.stack(columns, -1)

    def magnitude(self, out: torch.Tensor, action: torch.Tensor, log_std: torch.Tensor | None) -> torch.Tensor:
        """Head output [B, width], actions [B, D] -> [B] the magnitude of the log-prob's terms, summed over the
        entries (``logprob_magnitude``)."""
        total = sum((_categorical_magnitude(out[:, a:z]) for a, z in zip(self._cuts[:-1], self._cuts[1:])),
                    torch.zeros(out.shape[0], device=out.device))
        if self.gaussian:
            total = total + _gaussian_magnitude(out[:, self.logits:], action[:, self.gaussian_at].float(), log_std)
        return total

    def mode(self, out: torch.Tensor) -> torch.Tensor:
        """The most likely action [B, D]: each Categorical's argmax, the Gaussian's mean."""
        action = torch.zeros((out.shape[0], self.size), dtype=self.dtype, device=out.device)
        for i, logits in enumerate(self._categoricals(out)):
            action[:, self.categorical_at[i]] = logits.argmax(-1).to(self.dtype)
        if self.gaussian:
            action[:, self.gaussian_at] = out[:, self.logits:]
        return action


def _gaussian(mean: torch.Tensor, action: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """Log-density [B] of flat actions [B, d] under N(mean, exp(log_std)^2), summed over dimensions.

    The one formula for the behaviour log-prob (``step``) and the recomputed one (``evaluate``),
    so that on the same rows they are bit-identical.
    """
    return (-0.5 * ((action - mean) / log_std.exp()).pow(2) - log_std - 0.5 * LOG_2PI).sum(-1)


# -- how large a log-prob's float32 rounding can be ----------------------------------------------------------
#
# Two float32 computations of one log-prob (inference at one batch size, in torch or numpy; the audit at
# another) round differently: a matrix product's sums are ordered by its kernel, so each head output carries
# an error of a few units of float32's epsilon relative to its size. ``logprob_magnitude`` is the size of the
# terms that error enters, so that the audit's tolerance can be relative to it:
# - a Categorical's log-softmax, logit_a - logsumexp(logits): twice its largest unmasked |logit|;
# - a Gaussian dimension's -(a - mu)^2 / (2 sigma^2) - log sigma - log(2 pi) / 2: an error in mu (or in a, of
#   the same size as mu's) moves it by |u| / sigma times that error, u = (a - mu) / sigma, so
#   (|a| + |mu|) |u| / sigma, plus u^2 / 2, |log sigma| and 1 for the terms themselves.
# With a small sigma and large means (a Gaussian policy late in training) this is in the thousands, and the
# same log-prob computed at batch 1 and at batch 4,096 differs by up to ~6 epsilons of it.


def _categorical_magnitude(logits: torch.Tensor) -> torch.Tensor:
    """Logits [B, n] (masked ones at ``MASKED``) -> [B] twice the largest |logit| an action mask allows."""
    return 2 * logits.masked_fill(logits <= MASKED, 0.0).abs().amax(-1)


def _gaussian_magnitude(mean: torch.Tensor, action: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """Means [B, d], actions [B, d], log-std [d] -> [B] the magnitude of ``_gaussian``'s terms (above)."""
    std = log_std.exp()
    u = (action - mean) / std
    return ((action.abs() + mean.abs()) * u.abs() / std + 0.5 * u * u + log_std.abs() + 1).sum(-1)
