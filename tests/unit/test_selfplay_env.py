"""The self-play vector env: one slot per game seen from its learning player, the seat alternating, the
opponents' plies played between learning steps and their rewards credited to the step they follow."""

from __future__ import annotations

import numpy as np
import pytest

from lockstep import envs
from lockstep.envs import selfplay, turns

TURNS = "lockstep.envs.turns"


def _zeros(obs, waiting):  # an opponent that always plays 0: the learning player wins by playing 1
    return np.zeros(len(waiting), np.int64)


def test_a_turn_based_id_is_a_self_play_game_and_a_parallel_one_is_not():
    assert selfplay.is_turn_based(TURNS) and not selfplay.is_turn_based("lockstep.envs.departures")
    assert isinstance(envs.make_vector_env(f"pettingzoo:{TURNS}", 2), selfplay.SelfPlayVectorEnv)


def test_the_learning_seat_alternates_and_a_second_seat_sees_the_opponents_first_move():
    vec = selfplay.SelfPlayVectorEnv(TURNS, 2, _zeros)
    obs, _ = vec.reset(seed=[1, 2])
    assert vec.learner == ["player_0", "player_1"]
    ply = np.rint(obs["observation"][:, 2] * turns.PLIES).tolist()
    assert ply == [0, 1]  # slot 1's opponent moved first
    for _ in range(turns.PLIES // 2):
        obs, reward, terminated, truncated, info = vec.step(np.ones(2, np.int64))
    assert terminated.tolist() == [True, True] and not truncated.any()
    assert reward.tolist() == [1.0, 1.0]  # four 1s against four 0s, credited at the last learning step
    assert info["episode"]["r"].tolist() == [1.0, 1.0] and info["episode"]["l"].tolist() == [4, 4]
    assert vec.learner == ["player_1", "player_0"]  # the next games, seats swapped, already begun
    assert vec.opponent_moves == 2 * (turns.PLIES // 2) + 1  # and slot 0's new opponent has moved first


def test_a_loss_arrives_with_the_opponents_last_move():
    vec = selfplay.SelfPlayVectorEnv(TURNS, 1, lambda obs, waiting: np.ones(len(waiting), np.int64))
    vec.reset(seed=[0])  # the learning player is seat 0: seat 1 moves last
    rewards = [vec.step(np.zeros(1, np.int64))[1][0] for _ in range(turns.PLIES // 2)]
    assert rewards == [0.0, 0.0, 0.0, -1.0]


def test_seats_with_different_spaces_are_refused_by_name(monkeypatch):
    import gymnasium as gym

    original = turns.Turns.action_space
    monkeypatch.setattr(turns.Turns, "action_space",
                        lambda self, agent: gym.spaces.Discrete(3) if agent == "player_1" else original(self, agent))
    with pytest.raises(ValueError, match="seat player_1 observes .* self-play needs every seat in the same spaces"):
        selfplay.SelfPlayVectorEnv(TURNS, 1)
