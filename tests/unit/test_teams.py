"""Per-env (team) returns of a multi-agent env, from the flags and rewards of its consecutive agent slots."""

from __future__ import annotations

import numpy as np
import pytest

from lockstep import envs
from lockstep.learner.teams import TeamReturns

DEPARTURES = "pettingzoo:lockstep.envs.departures"


def test_an_envs_episode_ends_when_all_its_agents_are_flagged_and_sums_every_agents_rewards():
    vec = envs.make_vector_env(DEPARTURES, 2)
    agents = envs.env_spec(DEPARTURES).agents
    assert agents == 3 and vec.num_envs == 6
    teams = TeamReturns(agents, vec.num_envs, from_reset=True)
    vec.reset(seed=[0, 1, 2, 3, 4, 5])
    rng = np.random.default_rng(0)
    agent_returns, team_returns = [], []
    for _ in range(20):  # two whole 10-step episodes of each env
        _, reward, terminated, truncated, info = vec.step(rng.integers(0, 2, vec.num_envs))
        if "episode" in info:
            agent_returns.extend(info["episode"]["r"][info["_episode"]].tolist())
        returns, lengths = teams.step(reward, terminated, truncated)
        assert (lengths == 10).all()
        team_returns.extend(returns.tolist())
    assert len(team_returns) == 2 * 2 and len(agent_returns) == 2 * 2 * 3
    # every env's agents finish in one env episode: each team return is its three agents' returns summed
    assert sum(team_returns) == pytest.approx(sum(agent_returns))


def test_a_connection_that_starts_mid_episode_counts_each_env_from_its_next_reset():
    teams = TeamReturns(2, 4, from_reset=False)
    flags = np.zeros(4, bool)
    returns, _ = teams.step(np.ones(4), np.array([True, True, False, False]), flags)
    assert returns.size == 0  # env 0 ended, but its start was not seen
    returns, lengths = teams.step(np.ones(4), np.array([True, True, True, True]), flags)
    assert returns.tolist() == [2.0] and lengths.tolist() == [1]  # env 0 whole; env 1 not
    with pytest.raises(ValueError, match="not whole envs of 3 agents"):
        TeamReturns(3, 4, from_reset=True)
