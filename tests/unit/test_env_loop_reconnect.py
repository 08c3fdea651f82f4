"""``EnvLoop.forget_outcome`` after a reconnect: the first message on the new connection reports
no outcome of the previous step, finished episodes included, so the learner counts every episode
at most once (the message that carried them may already have been received)."""

from __future__ import annotations

import numpy as np

from lockstep.actor import EnvLoop
from lockstep.envs import SpaceSpec, env_seeds, make_vector_env
from lockstep.transport.messages import step_from_proto, step_message

K = 4


def _loop() -> tuple[EnvLoop, SpaceSpec]:
    vec = make_vector_env("CartPole-v1", K)
    loop = EnvLoop(vec, SpaceSpec.from_space(vec.single_action_space))
    loop.reset(env_seeds(1, 0, K))
    return loop, SpaceSpec.from_space(vec.single_observation_space)


def _step_until_an_episode_ends(loop: EnvLoop) -> None:
    for _ in range(200):  # always pushing left, a CartPole episode falls within a few dozen steps
        loop.step(np.zeros(K, np.int64))
        if len(loop.ep_return):
            return
    raise AssertionError("no CartPole episode ended in 200 steps")


def test_a_reconnect_does_not_report_finished_episodes_again():
    loop, obs_spec = _loop()
    try:
        _step_until_an_episode_ends(loop)
        # may have reached the learner before the break
        sent = step_from_proto(step_message(loop.outcome()), K, obs_spec)
        assert len(sent.episode_return) >= 1 and sent.terminated.any()

        loop.forget_outcome()
        again = step_from_proto(step_message(loop.outcome()), K, obs_spec)
        assert again.episode_return.size == 0 and again.episode_length.size == 0
        assert not again.terminated.any() and not again.truncated.any() and not again.reward.any()
        assert again.final_index.size == 0 and again.final_obs.shape == (0, 4)
        np.testing.assert_array_equal(again.obs, sent.obs)  # the environments keep their state

        # episodes that end after the reconnect are reported as usual
        _step_until_an_episode_ends(loop)
        assert len(step_from_proto(step_message(loop.outcome()), K, obs_spec).episode_return) >= 1
    finally:
        loop.vec.close()


def test_every_finished_episode_is_reported_once_across_reconnects():
    loop, obs_spec = _loop()
    try:
        reported = 0
        for step in range(300):
            loop.step(np.full(K, step % 2, np.int64) if step % 7 else np.zeros(K, np.int64))
            reported += len(step_from_proto(step_message(loop.outcome()), K, obs_spec).episode_return)
            if step % 5 == 0:  # a reconnect: the last message is sent again after forget_outcome
                loop.forget_outcome()
                reported += len(step_from_proto(step_message(loop.outcome()), K, obs_spec).episode_return)
        finished = int(loop.vec.episode_count)  # RecordEpisodeStatistics counts every finished episode
        assert finished > 0 and reported == finished
    finally:
        loop.vec.close()
