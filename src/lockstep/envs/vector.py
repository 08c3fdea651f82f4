"""The actor's vector env: Gymnasium's ``SyncVectorEnv`` in same-step autoreset, whose step keeps of the envs'
infos only what the actor sends.

Gymnasium's step batches every key of every env's info dict into arrays with masks, at every step (a MuJoCo
env reports six numbers a step: twelve small arrays made and filled in Python, about a quarter of Hopper's
step). The actor reads two things from them: the last observation of an episode that ended
(``infos["final_obs"]``, to bootstrap a truncation) and the statistics of the episodes that ended
(``infos["final_info"]["episode"]``, the envs' ``RecordEpisodeStatistics``). ``SameStepVectorEnv.step``
returns exactly those, in Gymnasium's layout, and the same observations, rewards and flags (tested against
``SyncVectorEnv``); everything else (reset, spaces, ``envs``, ``call``, render, close) is Gymnasium's.

``SameStepAsyncVectorEnv`` (``actors.vector: async``) is Gymnasium's ``AsyncVectorEnv`` in the same mode, each env
in a process of its own, for envs slow enough (milliseconds a step) that stepping them side by side pays for a
pipe round trip each; its step returns the same things (tested against ``SameStepVectorEnv``).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from copy import deepcopy
from typing import Any

import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv
from gymnasium.vector.async_vector_env import AsyncState
from gymnasium.vector.utils import concatenate, iterate

from lockstep.common.process import die_with_parent


class SameStepVectorEnv(SyncVectorEnv):
    """``SyncVectorEnv(env_fns, autoreset_mode=SAME_STEP)`` whose step's infos hold ``final_obs`` (an object
    array over the envs, set where an episode ended) and ``final_info`` with the ended episodes' ``episode``
    statistics and their mask ``_episode``; the other keys of the envs' infos are dropped."""

    def __init__(self, env_fns, copy: bool = True) -> None:
        super().__init__(env_fns, copy=copy, autoreset_mode=AutoresetMode.SAME_STEP)

    def step(self, actions) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        infos: dict[str, Any] = {}
        for i, (action, env) in enumerate(zip(iterate(self.action_space, actions), self.envs, strict=True)):
            obs, self._rewards[i], self._terminations[i], self._truncations[i], info = env.step(action)
            if self._terminations[i] or self._truncations[i]:
                self._ended(infos, i, obs, info)
                obs, _ = env.reset()
            self._env_obs[i] = obs
        self._observations = concatenate(self.single_observation_space, self._env_obs, self._observations)
        self._autoreset_envs = np.logical_or(self._terminations, self._truncations)
        return (deepcopy(self._observations) if self.copy else self._observations, np.copy(self._rewards),
                np.copy(self._terminations), np.copy(self._truncations), infos)

    def _ended(self, infos: dict[str, Any], i: int, obs: Any, info: dict[str, Any]) -> None:
        """File env ``i``'s last observation and episode statistics as ``SyncVectorEnv._add_info`` does."""
        if "final_obs" not in infos:
            infos["final_obs"] = np.full(self.num_envs, None, dtype=object)
        infos["final_obs"][i] = obs
        episode = info.get("episode")
        if not isinstance(episode, dict):
            return
        final = infos.setdefault("final_info", {})
        if "episode" not in final:
            final["episode"] = {key: np.zeros(self.num_envs, dtype=np.asarray(value).dtype)
                                for key, value in episode.items()}
            final["_episode"] = np.zeros(self.num_envs, dtype=bool)
        for key, value in episode.items():
            final["episode"][key][i] = value
        final["_episode"][i] = True


class EnvProcessDied(RuntimeError):
    """An env process of a ``SameStepAsyncVectorEnv`` ended (killed, crashed): the message names the env."""


class SameStepAsyncVectorEnv(AsyncVectorEnv):
    """``AsyncVectorEnv(env_fns, autoreset_mode=SAME_STEP)``, each env in a process of its own, whose step returns
    what ``SameStepVectorEnv.step`` returns (``final_obs`` and the ended episodes' ``final_info``; the envs' other
    info keys dropped), so that the actor cannot tell them apart but by the time a step takes.

    The processes are spawned (a forked child would share the actor's gRPC state, which does not survive fork)
    and end with the actor (``env_process``). One that dies raises ``EnvProcessDied`` naming it,
    and the other processes are ended; an env that raises in its process raises that error here, as a
    ``SameStepVectorEnv`` would. ``env_id`` names the envs in that message.
    """

    def __init__(self, env_fns, env_id: str) -> None:
        self.env_id = env_id
        super().__init__(env_fns, context="spawn", autoreset_mode=AutoresetMode.SAME_STEP)

    def reset(self, *, seed=None, options=None):
        with self._processes_alive():
            return super().reset(seed=seed, options=options)

    def step(self, actions) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        with self._processes_alive():
            obs, reward, terminated, truncated, infos = super().step(actions)
        kept: dict[str, Any] = {}
        if "final_obs" in infos:
            kept["final_obs"] = infos["final_obs"]
            final = infos["final_info"]
            if "episode" in final:
                kept["final_info"] = {"episode": final["episode"], "_episode": final["_episode"]}
        return obs, reward, terminated, truncated, kept

    @contextmanager
    def _processes_alive(self) -> Iterator[None]:
        """Turn a pipe that broke because its process ended into ``EnvProcessDied`` naming that env."""
        try:
            yield
        except (EOFError, BrokenPipeError, ConnectionResetError) as err:  # what a pipe to an ended process raises
            dead = self._dead_process()
            self._state = AsyncState.DEFAULT  # no call pending any more: the processes are ended, not waited for
            self.close(terminate=True)
            if dead is None:
                raise
            i, process = dead
            code = process.exitcode
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            raise EnvProcessDied(f"env {i} of {self.num_envs} ({self.env_id}) died: its process {process.pid} "
                                 f"ended ({how})") from err

    def _dead_process(self, wait_s: float = 2.0) -> tuple[int, Any] | None:
        """The first env process that has ended, waiting up to ``wait_s`` for the one whose pipe closed to be
        reaped (its pipe closes as it exits, a moment before its exit code can be read)."""
        deadline = time.monotonic() + wait_s
        while True:
            for i, process in enumerate(self.processes):
                if process.exitcode is not None:
                    return i, process
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)


def env_process(parent: int, make: Callable[[], Any]) -> Any:
    """An env factory run in a ``SameStepAsyncVectorEnv``'s process: ties the process to the actor's (``parent``,
    its pid), then makes the env. Picklable (a ``functools.partial`` of it), as spawning needs."""
    if os.getpid() != parent:  # Gymnasium also makes one env in the actor, to read the spaces
        die_with_parent(parent)
    return make()
