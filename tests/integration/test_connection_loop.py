"""One connection loop (``transport.connection.serve_connection``) behind every framing: the same malformed
step is refused with the same code and the same message over gRPC, shared memory and in process."""

from __future__ import annotations

import logging
import sys

import numpy as np
import pytest
from protocol import hello

from lockstep.actor.inprocess import serve_env_loop
from lockstep.transport.grpc.client import Connection, LearnerRefused
from lockstep.transport.messages import StepData
from lockstep.transport.protocol import RefusalLog, Refused
from lockstep.transport.shm.client import LocalConnection

NUM_ENVS, ACTOR = 2, 7

NAN_ENV = '''
import gymnasium as gym
import numpy as np


class NaNObservations(gym.ObservationWrapper):
    def observation(self, observation):
        return np.full_like(observation, np.nan)


def make(**kwargs):
    return NaNObservations(gym.make("CartPole-v1", **kwargs))
'''


@pytest.fixture
def learner(running_learner):
    # one actor: a step that is not refused is answered at once, so a broken check fails, not hangs
    return running_learner()


def _nan_step() -> StepData:
    """A step of CartPole observations that are all NaN, as the NaN env sends its first one."""
    k = NUM_ENVS
    return StepData(obs=np.full((k, 4), np.nan, np.float32), reward=np.zeros(k, np.float32),
                    terminated=np.zeros(k, bool), truncated=np.zeros(k, bool), final_index=np.zeros(0, np.int64),
                    final_obs=np.zeros((0, 4), np.float32), episode_return=np.zeros(0, np.float64),
                    episode_length=np.zeros(0, np.int64))


def _refusal(connection) -> tuple[str, str]:
    try:
        with pytest.raises(LearnerRefused) as err:
            connection.act(_nan_step())
    finally:
        connection.close()
    return err.value.code, err.value.message


def test_one_malformed_step_is_refused_alike_over_grpc_shared_memory_and_in_process(learner, tmp_path, monkeypatch):
    over_grpc = _refusal(Connection(learner.address, hello(ACTOR, NUM_ENVS), connect_timeout=10))
    over_shm = _refusal(LocalConnection(learner.local_address, hello(ACTOR, NUM_ENVS), connect_timeout=10))

    (tmp_path / "nanenv.py").write_text(NAN_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("nanenv", None)
    run = learner.learner.run_on_loop(serve_env_loop(learner.learner.sessions, "nanenv:make", NUM_ENVS, ACTOR,
                                                     RefusalLog(logging.getLogger("lockstep.test"))))
    with pytest.raises(Refused) as err:
        run.result(timeout=30)
    in_process = err.value.code, str(err.value)

    assert over_grpc[0] == "INVALID_ARGUMENT" and over_grpc[1].startswith(f"actor {ACTOR}: step.observation: 8 non-")
    assert over_grpc == over_shm == in_process
