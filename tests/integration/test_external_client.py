"""A program that drives its own loop trains through ``lockstep.client`` against a real learner.

The program is no Gymnasium env: a plain loop of a control task (bring a point to a target on a line and hold it
there) that starts episodes, asks for actions, rewards them and ends them, cut by time (truncated, with the
final observation) or by leaving the track (terminated). Four episodes run at once in four threads, each thread
keeping its slot, so the client's slots step together. The learner is strict and audited: the program's return
climbs far above a random policy's and every sample was produced by the version that trained on it.
"""

from __future__ import annotations

import functools
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

from lockstep import client as client_lib
from lockstep.tools import audit

HORIZON = 30  # actions per episode before it is cut (truncated)
MOVE, NEAR, OFF_TRACK = 0.1, 0.15, 2.5
SLOTS, T, VERSIONS = 4, 32, 40


class Declared(gym.Env):
    """The program's spaces, for the learner (``--env test_external_client:Declared``): it reads them only."""

    observation_space = gym.spaces.Box(-OFF_TRACK, OFF_TRACK, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)


def hold_the_target(episode_factory, seed: int, returns: list[float], choose=None) -> None:
    """Episodes until training is over: the observation is the gap to the target, action 1 moves right and 0 left;
    a reward of 1 for each action that ends near the target, -1 and the end for one that leaves the track."""
    rng = np.random.default_rng(seed)
    while True:
        episode = episode_factory()
        position, target = rng.uniform(-1, 1), rng.uniform(-1, 1)
        for _ in range(HORIZON):
            gap = np.array([target - position], np.float32)
            try:
                action = episode.act(gap) if choose is None else choose(rng)
            except client_lib.LearnerClosed:
                return
            position += MOVE if action == 1 else -MOVE
            if abs(target - position) > OFF_TRACK:
                episode.reward(-1.0)
                episode.end()
                break
            episode.reward(1.0 if abs(target - position) < NEAR else 0.0)
        else:
            episode.end(np.array([target - position], np.float32), truncated=True)
        returns.append(episode.episode_return)
        if choose is not None and len(returns) >= 200:
            return


class _Random:
    """An episode that acts at random, for the baseline: what ``hold_the_target`` scores without a learner."""

    def __init__(self) -> None:
        self.episode_return, self.length = 0.0, 0

    def reward(self, reward: float) -> None:
        self.episode_return += reward

    def end(self, *args, **kwargs) -> None:
        pass


@pytest.mark.slow
def test_a_program_driving_its_own_loop_trains_strictly_and_the_audit_passes(running_learner, run_dir):
    baseline: list[float] = []
    hold_the_target(_Random, 0, baseline, choose=lambda rng: int(rng.integers(2)))
    learner = running_learner({"env.id": "test_external_client:Declared", "learner.min_actors": 1,
                               "run.thresholds": [], "run.audit": True, "learner.device": "cpu",
                               "ppo.steps_per_env": T, "ppo.total_steps": SLOTS * T * VERSIONS, "ppo.lr": 3e-3,
                               "ppo.epochs": 6, "ppo.minibatches": 1, "ppo.ent_coef": 0.0})
    client = client_lib.connect(learner.address, Declared.observation_space, Declared.action_space,
                                slots=SLOTS, token=None)
    returns: list[list[float]] = [[] for _ in range(SLOTS)]
    threads = [threading.Thread(target=hold_the_target,
                                args=(functools.partial(client.start_episode, slot), slot, returns[slot]))
               for slot in range(SLOTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    client.close()
    assert not any(thread.is_alive() for thread in threads)
    summary = learner.wait_finished(timeout=60)
    assert summary["env_steps"] == SLOTS * T * VERSIONS
    random_mean = float(np.mean(baseline))
    assert summary["episode_return_mean"] > random_mean + 10, (summary["episode_return_mean"], random_mean)
    assert audit.main(str(run_dir.path)) == 0


def test_the_client_is_refused_spaces_that_are_not_the_learners_and_misuse_is_named(running_learner):
    learner = running_learner({"learner.min_actors": 1})  # CartPole-v1
    cartpole = gym.make("CartPole-v1")
    with pytest.raises(client_lib.LearnerRefused, match="observation space .* differ"):
        client_lib.connect(learner.address, gym.spaces.Box(-4.8, 4.8, (4,), np.float32), cartpole.action_space)
    with client_lib.connect(learner.address, cartpole.observation_space, cartpole.action_space) as client:
        episode = client.start_episode()
        with pytest.raises(RuntimeError, match="all 1 slot"):
            client.start_episode()
        with pytest.raises(RuntimeError, match="call episode.act first"):
            episode.reward(1.0)
        with pytest.raises(ValueError, match="shape \\(3,\\) does not match"):
            episode.act(np.zeros(3))
        action = episode.act(cartpole.reset(seed=0)[0])
        assert action in (0, 1)
        with pytest.raises(ValueError, match="needs final_obs"):
            episode.end(truncated=True)
        episode.end()
        with pytest.raises(RuntimeError, match="has ended"):
            episode.act(np.zeros(4))


def test_an_act_waiting_for_the_other_slots_raises_when_the_client_closes(running_learner):
    learner = running_learner({"learner.min_actors": 1})  # CartPole-v1
    cartpole = gym.make("CartPole-v1")
    client = client_lib.connect(learner.address, cartpole.observation_space, cartpole.action_space, slots=2)
    episode, raised = client.start_episode(), []

    def act() -> None:
        try:
            episode.act(cartpole.reset(seed=0)[0])
        except ConnectionError as err:
            raised.append(err)

    waiting = threading.Thread(target=act)
    waiting.start()
    waiting.join(timeout=1)
    assert waiting.is_alive()  # slot 1 has not asked: no Step goes out
    client.close()
    waiting.join(timeout=30)
    assert not waiting.is_alive() and "closed" in str(raised[0])


def test_a_client_evicted_for_a_slow_first_action_reconnects_inside_act(running_learner):
    learner = running_learner({"learner.min_actors": 1, "sync.first_step_deadline_s": 0.5,
                               "sync.step_deadline_min_s": 0.5, "ppo.steps_per_env": 4})
    cartpole = gym.make("CartPole-v1")
    with client_lib.connect(learner.address, cartpole.observation_space, cartpole.action_space) as client:
        episode = client.start_episode()
        deadline = time.monotonic() + 60
        while learner.learner.report.counters.evicted_actors == 0 and time.monotonic() < deadline:
            time.sleep(0.1)  # the program thinks for longer than the learner waits for its first step
        assert learner.learner.report.counters.evicted_actors == 1
        obs = cartpole.reset(seed=0)[0]
        for _ in range(6):  # past the first phase of 4 steps: the new connection trains
            action = episode.act(obs)
            obs, reward, *_ = cartpole.step(int(action))
            episode.reward(reward)
        assert client.version == 1
