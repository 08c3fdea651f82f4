"""Policies: one API (``policy.Policy``) for feedforward and recurrent networks, and the built-in family.

``policy`` holds the API and the action heads, ``feedforward`` and ``recurrent`` the built-in networks
on the torsos of ``networks``, and ``build`` picks the one a config names.
"""

from lockstep.models.build import build_policy, load_factory, torso_kind
from lockstep.models.feedforward import ActorCritic, LeafActorCritic, TorsoActorCritic
from lockstep.models.policy import Policy
from lockstep.models.recurrent import Paired, RecurrentPolicy

__all__ = ["ActorCritic", "LeafActorCritic", "Paired", "Policy", "RecurrentPolicy", "TorsoActorCritic",
           "build_policy", "load_factory", "torso_kind"]
