"""A Dict or Tuple observation's feedforward policy has separate actor and critic networks, as a flat one has.

CartPole declared as a Dict of two Box leaves (``tasks.SplitCartPole``) holds the flat vector's numbers in its
order: its policy is the flat ``ActorCritic`` on the leaves side by side (with one seed the two train alike:
tests/integration/test_dict_split_cartpole.py). An older checkpoint of the shared-trunk layout is refused by
name, never loaded into the wrong places.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lockstep import config as config_lib
from lockstep.algo.normalize import as_tensors
from lockstep.config import ModelConfig
from lockstep.envs import env_spec, make_env, stack_records
from lockstep.learner.trainer import Trainer
from lockstep.models import ActorCritic, LeafActorCritic, TorsoActorCritic, build_policy
from lockstep.models.encoders import LeafEncoders
from lockstep.models.load import PolicyMismatch, load_policy
from lockstep.models.networks import mlp_torso

FLAT = env_spec("CartPole-v1")
SPLIT = env_spec("lockstep.envs.tasks:SplitCartPole")
GLIMPSE = env_spec("lockstep.envs.tasks:Glimpse")  # an image leaf (the small CNN), a vector and a Discrete


def _split(obs: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"cart": obs[:, :2], "pole": obs[:, 2:]}


def test_a_dict_of_vectors_gets_the_flat_actor_critic_on_its_leaves_side_by_side():
    model = ModelConfig(hidden=[64, 64])
    torch.manual_seed(3)
    flat = build_policy(FLAT.observation, FLAT.action, model)
    torch.manual_seed(3)
    split = build_policy(SPLIT.observation, SPLIT.action, model)
    assert type(flat) is ActorCritic and type(split) is LeafActorCritic
    # the same parameters under the same names: CleanRL's init (orthogonal, sqrt(2) hidden, 0.01 policy, 1.0 value)
    assert split.state_dict().keys() == flat.state_dict().keys()
    for name, value in flat.state_dict().items():
        torch.testing.assert_close(split.state_dict()[name], value, rtol=0, atol=0)
    obs = torch.randn(6, 4, generator=torch.Generator().manual_seed(1))
    head, value = flat.features(obs)
    split_head, split_value = split.features(_split(obs))
    torch.testing.assert_close(split_head, head, rtol=0, atol=0)
    torch.testing.assert_close(split_value, value, rtol=0, atol=0)
    torch.testing.assert_close(split.value_after(_split(obs), torch.zeros(6, 0)), value, rtol=0, atol=0)


@pytest.mark.parametrize("spec", [SPLIT, GLIMPSE], ids=["vectors", "with-an-image"])
def test_the_value_loss_trains_no_parameter_of_the_policy_and_the_policy_loss_none_of_the_value(spec):
    policy = build_policy(spec.observation, spec.action, ModelConfig(hidden=[16, 16]))
    env = make_env(spec.env_id)
    env.action_space.seed(0)
    observations = [env.reset(seed=0)[0]]
    for _ in range(7):
        observations.append(env.step(env.action_space.sample())[0])
    head, value = policy.features(as_tensors(stack_records(observations, spec.observation), torch.device("cpu")))
    names, parameters = zip(*policy.named_parameters())

    def reached(loss: torch.Tensor) -> set[str]:
        """The parameters a gradient of ``loss`` moves."""
        grads = torch.autograd.grad(loss, parameters, retain_graph=True, allow_unused=True)
        return {name for name, g in zip(names, grads) if g is not None and bool(g.abs().sum() > 0)}

    by_value, by_policy = reached(value.square().mean()), reached(head.square().mean())
    assert by_value and by_policy
    assert all(name.startswith("actor.") for name in by_policy - by_value)
    assert all(name.startswith("critic.") for name in by_value - by_policy)
    # what both train is an image leaf's CNN, and only that (CleanRL's Atari agent shares its CNN too)
    assert all(name.startswith("encoders.") for name in by_value & by_policy)
    assert bool(by_value & by_policy) == (spec is GLIMPSE)


def _layout_1(spec) -> nn.Module:
    """A Dict observation's feedforward policy as it was built before: one trunk MLP, two linear heads."""
    encoders = LeafEncoders(spec.observation)
    trunk, width = mlp_torso(encoders.width, [16], "tanh")
    return TorsoActorCritic(nn.Sequential(encoders, trunk), width, spec.action)


def test_a_checkpoint_of_the_shared_trunk_layout_is_refused_naming_its_layout():
    older = _layout_1(SPLIT).state_dict()
    config = config_lib.Config()
    config.env.id, config.model.hidden = SPLIT.env_id, [16]
    with pytest.raises(PolicyMismatch, match="older.pt does not hold .* these parameters are layout 1 of a Dict or "
                                             "Tuple observation's MLP policy"):
        load_policy(config, SPLIT.observation, SPLIT.action, older, None, None, torch.device("cpu"), "older.pt")
    trainer = Trainer(config, SPLIT, torch.device("cpu"))  # a resume: refused before anything starts
    state = trainer.state_dict()
    trainer.load_state_dict(state)
    with pytest.raises(config_lib.ConfigError, match="--resume: the checkpoint's parameters do not fit .* layout 1 .* "
                                                     r"\(layout 2: encoders"):
        trainer.load_state_dict({**state, "model": older})
