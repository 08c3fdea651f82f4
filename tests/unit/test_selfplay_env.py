"""The self-play vector env: one slot per game seen from its learning player, the seat alternating, the
opponents' plies played between learning steps and their rewards credited to the step they follow."""

from __future__ import annotations

import numpy as np
import pytest

from lockstep import envs
from lockstep.envs import folds, selfplay, turns

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


# -- games the opponent decides before the learning player moves (lockstep.envs.folds: a fold ends a game) ----

FOLDS = "lockstep.envs.folds"


def _folds(obs, waiting):  # an opponent that folds at once: a game it moves first in ends before the learner moves
    return np.full(len(waiting), folds.FOLD, np.int64)


def test_a_game_the_opponent_ends_on_its_first_move_is_no_episode_and_gives_the_step_before_it_nothing():
    vec = selfplay.SelfPlayVectorEnv(FOLDS, 2, _folds)
    vec.reset(seed=[1, 2])
    assert vec.learner == ["player_0", "player_0"]  # slot 1's first game (its seat player_1) was folded at once
    for step in range(1, 4):
        # slot 0 stays and wins when the opponent folds; slot 1 folds and loses. Each game ended in the step,
        # and the next (the learner's seat player_1) the opponent folded at once, before the learner moved
        obs, reward, terminated, truncated, info = vec.step(np.array([folds.STAY, folds.FOLD]))
        assert reward.tolist() == [1.0, -1.0]  # the step's own game's reward only: not the folded one's +1
        assert terminated.tolist() == [True, True] and not truncated.any()
        assert info["episode"]["r"].tolist() == [1.0, -1.0] and info["episode"]["l"].tolist() == [1, 1]
        assert vec.episode_count == 2 * step and vec.decided_before_move == 1 + 2 * step
        assert vec.learner == ["player_0", "player_0"]  # the learner's next game has begun, its move first
        ply = np.rint(obs["observation"][:, 2] * folds.PLIES).tolist()
        assert ply == [0, 0]


def test_random_games_give_every_episode_a_move_one_row_and_the_sum_of_its_steps_rewards():
    vec = selfplay.SelfPlayVectorEnv(FOLDS, 4, selfplay.RandomOpponent(seed=3))
    rng = np.random.default_rng(4)
    vec.reset(seed=[0, 1, 2, 3])
    running = np.zeros(4)  # the rewards of each slot's episode so far
    rows = 0
    for _ in range(300):
        _, reward, terminated, truncated, info = vec.step(rng.integers(2, size=4))
        running += reward
        done = terminated | truncated
        if done.any():
            assert info["_episode"].tolist() == done.tolist()
            assert (info["episode"]["l"][done] >= 1).all()  # no episode without a learning move
            np.testing.assert_allclose(info["episode"]["r"][done], running[done])  # rewards of its own steps only
            rows += int(done.sum())
        running[done] = 0.0
    assert rows == vec.episode_count  # one row per episode: none overwritten by a game ended in the same step
    assert vec.decided_before_move > 0.1 * (vec.episode_count + vec.decided_before_move)
    # every game begun is an episode, a game decided before the learner moved, or the one being played
    assert vec.episode_count + vec.decided_before_move == int(vec.games_played.sum()) - vec.num_envs


def test_the_opponents_requests_carry_each_decided_game_once():
    reported, moves = [], selfplay.RandomOpponent(seed=5)

    def opponent(obs, waiting):  # as the actor's opponents' connection does: take them with every request
        returns, plies = vec.take_decided()
        assert len(plies) <= vec.num_envs and (plies >= 1).all()
        reported.extend(returns.tolist())
        return moves(obs, waiting)

    vec = selfplay.SelfPlayVectorEnv(FOLDS, 3, opponent)
    vec.reset(seed=[0, 1, 2])
    for _ in range(100):
        vec.step(np.full(3, folds.STAY))
    returns, _ = vec.take_decided()  # those of the last requests' moves, not yet asked for
    reported.extend(returns.tolist())
    assert len(reported) == vec.decided_before_move > 0
    assert set(reported) == {1.0}  # the learner wins every game the opponent folded before it moved


def test_a_one_game_view_plays_only_the_games_the_learning_player_moves_in():
    game = selfplay.SelfPlayGame(FOLDS, opponent=_folds)
    game.reset(seed=0)
    for _ in range(4):
        _, reward, terminated, _, _ = game.step(folds.STAY)
        assert terminated and reward == 1.0  # the opponent folds the game the learner moved first in
        game.reset()
    assert game.vec.episode_count == 4 and game.vec.decided_before_move == 4


def test_a_reward_before_the_learning_players_first_move_comes_with_that_move(monkeypatch):
    step = folds.Folds.step

    def with_ante(self, action):  # the first mover pays the other seat 0.5 for staying on the first ply
        mover = self.agent_selection
        step(self, action)
        if self.ply == 1 and int(action) == folds.STAY:
            self.rewards = {seat: 0.0 if seat == mover else 0.5 for seat in folds.SEATS}

    monkeypatch.setattr(folds.Folds, "step", with_ante)
    stay = lambda obs, waiting: np.full(len(waiting), folds.STAY, np.int64)
    vec = selfplay.SelfPlayVectorEnv(FOLDS, 1, stay)
    vec.reset(seed=[0])  # the learner moves first: its game pays it nothing before it moves
    rewards = [vec.step(np.array([folds.STAY]))[1][0] for _ in range(2)]
    assert rewards == [0.0, 0.0]  # a tie; the next game's ante (the learner is player_1 there) is not this step's
    _, reward, terminated, _, info = vec.step(np.array([folds.FOLD]))
    assert reward[0] == 0.5 - 1.0 and terminated[0]  # the ante came with its first move, which folded
    assert info["episode"]["r"].tolist() == [-0.5] and info["episode"]["l"].tolist() == [1]
