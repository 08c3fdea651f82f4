"""Which policy a config names: ``build_policy`` for the built-in family or a user's factory.

An MLP for flat observations, the Nature CNN for Atari frames, a small CNN for MinAtar, per-leaf
encoders and the MLPs for Dict and Tuple observations (``encoders``), each optionally followed by a
recurrent core (``model.lstm_size``; ``model.rnn``: an LSTM or a GRU); or ``model.policy``'s factory
(``package.module:name`` or ``file.py:name``), found by ``load_factory``.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path

from torch import nn

from lockstep.config import ConfigError, ModelConfig, setting_of
from lockstep.envs import SpaceSpec
from lockstep.envs.spaces import MIN_IMAGE_SIDE
from lockstep.models.encoders import LeafEncoders, flat_encoder
from lockstep.models.feedforward import ActorCritic, LeafActorCritic, TorsoActorCritic
from lockstep.models.networks import mlp_torso, nature_cnn, pixel_scale, small_cnn
from lockstep.models.policy import Policy
from lockstep.models.recurrent import RecurrentPolicy


def torso_kind(observation: SpaceSpec, kind: str) -> str:
    """``model.kind`` resolved: auto takes a CNN for image observations [C, H, W] (the Nature CNN from
    36 pixels up, the small MinAtar CNN below, none under 3: ``MIN_IMAGE_SIDE``) and the MLP for everything
    else (for a Dict or Tuple observation: after the per-leaf encoders)."""
    if kind != "auto":
        return kind
    if observation.tree:
        return "mlp"
    if len(observation.shape) == 3 and min(observation.shape[1:]) >= MIN_IMAGE_SIDE:
        return "nature-cnn" if min(observation.shape[1:]) >= 36 else "small-cnn"
    return "mlp"


def build_policy(observation: SpaceSpec, action: SpaceSpec, model: ModelConfig,
                 normalized_images: bool = False) -> Policy:
    """The policy the config names, for these spaces: ``model.policy``'s factory, or the built-in family;
    either masks its actions with the observation's action mask, if it has one. ``normalized_images``
    (``env.normalize_images``): a flat image observation arrives normalized, so the CNN does not scale it."""
    policy = _build(observation, action, model, normalized_images)
    policy.action_mask = observation.mask
    return policy


def _build(observation: SpaceSpec, action: SpaceSpec, model: ModelConfig, normalized_images: bool) -> Policy:
    if model.policy:
        policy = load_factory(model.policy)(observation, action, model)
        if not isinstance(policy, Policy):
            raise TypeError(f"model.policy {model.policy!r} returned a {type(policy).__name__}, not a "
                            "lockstep.Policy (subclass lockstep.Policy: docs/custom-policy.md)")
        return policy
    kind = torso_kind(observation, model.kind)
    if observation.tree:
        if kind != "mlp":
            raise ConfigError(f"model.kind {kind} takes one image; a Dict or Tuple observation gets an encoder per "
                             "leaf (a CNN for each image leaf) before the MLP: set model.kind to auto or mlp")
        if model.lstm_size == 0:
            return LeafActorCritic(observation, action, model.hidden, model.activation, model.init_log_std,
                                   model.critic_input)
        if model.critic_input == "global":
            raise ConfigError("model.critic_input global needs a feedforward network (model.lstm_size 0): under an "
                             "LSTM the actor and critic share one torso, which would let the actor read the state")
        encoders = LeafEncoders(observation)  # one trunk under the LSTM, as for a flat observation
        trunk, width = mlp_torso(encoders.width, model.hidden, model.activation)
        torso: nn.Module = nn.Sequential(encoders, trunk)
    elif kind in ("nature-cnn", "small-cnn"):
        if len(observation.shape) != 3 or min(observation.shape[1:]) < MIN_IMAGE_SIDE:
            raise ConfigError(f"model.kind {kind} needs image observations [C, H, W] of at least {MIN_IMAGE_SIDE}x"
                             f"{MIN_IMAGE_SIDE} pixels, got shape {observation.shape}; model.kind mlp takes any")
        make = nature_cnn if kind == "nature-cnn" else small_cnn
        scale = 1.0 if normalized_images else pixel_scale(observation)
        torso, width = make(observation.shape[0], tuple(observation.shape[1:]), scale)
    elif kind == "mlp":
        if model.lstm_size == 0:
            return ActorCritic(observation, action, model.hidden, model.activation, model.init_log_std)
        encode, inputs = flat_encoder(observation)
        torso, width = mlp_torso(inputs, model.hidden, model.activation)
        if encode is not None:
            torso = nn.Sequential(encode, torso)
    else:
        raise ConfigError(f"unknown model.kind {kind!r}; kinds: {', '.join(setting_of('model.kind').choices)}")
    if model.lstm_size > 0:
        return RecurrentPolicy(torso, width, model.lstm_size, action, model.init_log_std, model.critic_lstm,
                               model.rnn)
    return TorsoActorCritic(torso, width, action, model.init_log_std)


def load_factory(reference: str) -> Callable[..., Policy]:
    """``package.module:name`` or ``path/to/file.py:name`` (a dotted name for a nested attribute)."""
    where, _, name = reference.rpartition(":")
    if not where or not name:
        raise ConfigError(f"model.policy {reference!r} must look like package.module:factory or file.py:factory")
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
        raise ConfigError(f"model.policy {reference!r} cannot be loaded: {err}") from err
    return target
