"""Per-env (team) returns of a PettingZoo parallel env, from the steps the learner receives.

An actor's ``k`` slots are ``k / agents`` envs of ``agents`` consecutive slots each (``envs.pettingzoo``). An
env's episode ends in the step where every one of its slots is flagged (terminated or truncated): an agent
that left earlier is flagged at every step until then, and the env resets in that same step. Its team
return is the sum of all its agents' rewards over the episode, as the actor sent them (before reward
normalization); its length, the env's steps.

With several policies (``learner.team``) each policy's return per agent is kept as well: the sum of its
agents' rewards (``groups``: each agent's policy) over its number of agents.

A connection that starts mid-episode (an actor that reconnected) has not seen its envs' first steps: each
env is counted from its next reset on, so that every team return is of a whole episode.
"""

from __future__ import annotations

import numpy as np


class TeamReturns:
    """One connection's envs: running sums of their agents' rewards, and their finished episodes."""

    def __init__(self, agents: int, slots: int, from_reset: bool, groups: tuple[int, ...] = ()) -> None:
        if agents < 1 or slots % agents:
            raise ValueError(f"{slots} slots are not whole envs of {agents} agents")
        self.agents = agents
        envs = slots // agents
        # [agents, G] one-hot of each agent's group (one group of every agent without ``groups``)
        self.groups = np.eye(max(groups, default=0) + 1)[list(groups)] if groups else np.ones((agents, 1))
        self.shares = np.zeros((envs, self.groups.shape[1]), np.float64)  # [envs, G] each group's sum so far
        self.last_per_agent = np.zeros((0, self.groups.shape[1]), np.float64)  # [e, G] of the envs that just ended
        self.returns = np.zeros(envs, np.float64)  # [envs] the episode so far
        self.lengths = np.zeros(envs, np.int64)  # [envs]
        self.whole = np.full(envs, from_reset)  # [envs] the episode so far was seen from its first step

    def step(self, reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Add one step's rewards [k] and flags [k]; the returns and lengths [e] of the envs whose episode ended
        in it (and was seen whole), in env order."""
        shape = (-1, self.agents)
        rewards = np.asarray(reward, np.float64).reshape(shape)  # [envs, agents]
        self.returns += rewards.sum(axis=1)
        self.shares += rewards @ self.groups
        self.lengths += 1
        ended = (np.asarray(terminated) | np.asarray(truncated)).reshape(shape).all(axis=1)  # [envs]
        counted = ended & self.whole
        finished = self.returns[counted].copy(), self.lengths[counted].copy()
        self.last_per_agent = self.shares[counted] / self.groups.sum(axis=0)  # [e, G] a group's sum / its agents
        self.returns[ended], self.lengths[ended], self.whole[ended] = 0.0, 0, True
        self.shares[ended] = 0.0
        return finished
