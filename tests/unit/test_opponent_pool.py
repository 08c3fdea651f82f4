"""The self-play opponents' pool: who joins it, how each slot's opponent is drawn, and random legal moves."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lockstep.config import ModelConfig, SelfPlayConfig
from lockstep.envs import env_spec
from lockstep.envs.spaces import to_records
from lockstep.learner.inference import PolicySnapshot
from lockstep.learner.opponents import OpponentPool, RandomMoves
from lockstep.models import build_policy
from lockstep.observe.counters import Counters

TURNS = "pettingzoo:lockstep.envs.turns"


class _Versions:
    """The snapshot that serves the learning player, one per published version."""

    def __init__(self) -> None:
        self.spec = env_spec(TURNS, action_mask_key="action_mask")
        self.model = build_policy(self.spec.observation, self.spec.action, ModelConfig(hidden=[4]))
        self.now = self._snapshot(0)

    def _snapshot(self, version: int) -> PolicySnapshot:
        return PolicySnapshot(version, self.model, None, None, 10.0, torch.device("cpu"))

    def publish(self, version: int) -> None:
        self.now = self._snapshot(version)


def _pool(**settings) -> tuple[OpponentPool, _Versions]:
    versions = _Versions()
    pool = OpponentPool(SelfPlayConfig(**settings), 7, lambda: versions.now, Counters(), 0.001,
                        versions.spec.observation)
    return pool, versions


def test_every_snapshot_every_th_version_joins_and_the_pool_keeps_the_newest():
    pool, versions = _pool(opponents="pool", pool_size=3, snapshot_every=2)
    for version in range(1, 10):
        versions.publish(version)
        pool.published()
    assert [s.version for s in pool.pool] == [4, 6, 8]
    assert pool.oldest.version == 4


def test_draws_are_reproducible_per_actor_and_version_and_follow_latest_and_random():
    pool, versions = _pool(opponents="pool", pool_size=4, snapshot_every=1, latest=0.25, random=0.25)
    for version in range(1, 5):
        versions.publish(version)
        pool.published()
    drawn = pool.draw(member=0, num_envs=4000)
    assert [id(d) for d in drawn] == [id(d) for d in pool.draw(member=0, num_envs=4000)]
    assert [id(d) for d in drawn] != [id(d) for d in pool.draw(member=1, num_envs=4000)]
    share = {kind: np.mean([k(d) for d in drawn]) for kind, k in {
        "random": lambda d: d is pool.random,
        "current": lambda d: d is versions.now,
        "pool": lambda d: d is not pool.random and d is not versions.now}.items()}
    # random 1/4 of all; of the rest, the current version 1/4, the pool (which holds it too) 3/4
    assert share["random"] == pytest.approx(0.25, abs=0.03)
    assert share["current"] == pytest.approx(0.75 * (0.25 + 0.75 / 4), abs=0.03)
    self_play, _ = _pool(opponents="self")
    assert all(d is self_play.current() for d in self_play.draw(member=0, num_envs=50))


def test_random_moves_are_uniform_over_the_legal_columns_only():
    spec = env_spec("pettingzoo:pettingzoo.classic.connect_four_v3", action_mask_key="action_mask").observation
    moves = RandomMoves(spec, 0.5)
    mask = np.zeros((3000, 7), np.int8)
    mask[:, [1, 4, 6]] = 1
    obs = to_records({"observation": np.zeros((3000, 6, 7, 2), np.int8), "action_mask": mask}, spec)
    uniform = np.random.default_rng(0).random((3000, 1))
    (actions,) = moves.step(obs, uniform, moves.initial_state(3000))
    assert set(actions.tolist()) == {1, 4, 6}
    assert np.bincount(actions, minlength=7)[[1, 4, 6]] == pytest.approx([1000, 1000, 1000], abs=100)
    with pytest.raises(ValueError, match="needs an action mask"):
        RandomMoves(env_spec("CartPole-v1").observation, 0.5)
