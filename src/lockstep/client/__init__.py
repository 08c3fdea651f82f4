"""The external client: a program that drives its own loop (a game engine, a robot controller, a service) and
cannot be wrapped as an env that an actor steps, trained on by a learner over the actor protocol.

    client = lockstep.client.connect("learner-host:50051", observation_space, action_space, token="SECRET")
    episode = client.start_episode()
    action = episode.act(obs)           # waits for the learner's answer, and while the policy trains
    episode.reward(r)                   # the reward of that action (any number of calls, summed)
    episode.end(obs, truncated=True)    # or episode.end() where the episode terminated
    client.close()

How episodes map onto the protocol (docs/external-client.md): the client is one actor connection of ``slots``
env slots; an episode holds one slot from ``start_episode`` to ``end``. Every slot steps together, as an
actor's vector env does: one Step carries every slot's observation, so ``act`` returns once *every* slot has
asked for its action (the last to ask sends the Step for all). With one slot (the default) that is every call;
with k slots the program runs k episodes at once, each in its own thread, and a slot whose episode has ended
holds the others until a new episode on it asks for an action. An episode's end (its flags, its last
observation if it was cut by time, its return and length) travels with the slot's next Step, that is with
the next episode's first ``act``: the actor protocol's same-step autoreset.

Strictly on-policy: ``act`` blocks while the learner trains the version the slot's T steps came from (the
admission gate holds the request), so a program that must answer within a deadline of its own should not run
against a strict learner. It imports no torch: numpy, Gymnasium's spaces and gRPC only, like the actor.
"""

from __future__ import annotations

import functools
import logging
import threading
import uuid
from typing import Any

import gymnasium as gym
import numpy as np

from lockstep import envs as envs_lib
from lockstep.common.backoff import Backoff
from lockstep.envs.spaces import slot_action
from lockstep.transport import PROTOCOL
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.grpc import security
from lockstep.transport.grpc.client import Connection, LearnerClosed, LearnerFailed, LearnerRefused, Misconfigured
from lockstep.transport.messages import StepData, space_to_proto

__all__ = ["Client", "Episode", "LearnerClosed", "LearnerFailed", "LearnerRefused", "connect"]

log = logging.getLogger("lockstep.client")


def connect(learner: str, observation_space: gym.Space, action_space: gym.Space, *, token: str | None = None,
            slots: int = 1, actor_id: int = 0, env_id: str = "external", connect_timeout: float = 60.0,
            retry_for_s: float = 300.0, tls_ca: str | None = None, tls_server_name: str | None = None) -> Client:
    """Say hello to the learner at ``learner`` (host:port) as actor ``actor_id`` with ``slots`` env slots.

    The spaces must be the learner's (its ``--env``'s; a learner that trains an external program takes them from
    a ``package.module:callable`` that returns an env declaring them): a mismatch is refused at once
    (``LearnerRefused``, INVALID_ARGUMENT, naming both). ``token``: the learner's, else ``$LOCKSTEP_TOKEN``, else
    the token a learner of this user on this host published. ``retry_for_s``: how long a lost connection is
    retried (a new run id each time) before ``act`` raises ``ConnectionError``."""
    return Client(learner, observation_space, action_space, token=token, slots=slots, actor_id=actor_id,
                  env_id=env_id, connect_timeout=connect_timeout, retry_for_s=retry_for_s, tls_ca=tls_ca,
                  tls_server_name=tls_server_name)


class Client:
    """One actor connection of ``slots`` env slots whose episodes the program starts, acts in, rewards and ends.

    Invariants: a slot holds at most one episode; a Step goes out only when every slot has an observation
    waiting for its action, and each slot's outcome (reward since its last action, episode end) goes out with
    it exactly once; after a reconnect the outcome of the lost connection is not sent again (its learner dropped
    the unroll it belonged to)."""

    def __init__(self, learner: str, observation_space: gym.Space, action_space: gym.Space, *,
                 token: str | None = None, slots: int = 1, actor_id: int = 0, env_id: str = "external",
                 connect_timeout: float = 60.0, retry_for_s: float = 300.0, tls_ca: str | None = None,
                 tls_server_name: str | None = None) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        self.obs_spec = envs_lib.SpaceSpec.from_space(observation_space)
        self.act_spec = envs_lib.action_spec(action_space)
        self.slots, self.actor_id, self.env_id = slots, actor_id, env_id
        self._learner, self._connect_timeout, self._retry_for_s = learner, connect_timeout, retry_for_s
        self._tls = {"tls_ca": tls_ca, "tls_server_name": tls_server_name}
        self._token = security.token_from(token) or functools.partial(security.local_token, learner)
        self._obs = np.zeros((slots, *self.obs_spec.shape), self.obs_spec.array_dtype)
        self._episodes: list[Episode | None] = [None] * slots
        self._asked: set[int] = set()  # slots whose observation waits for its action this round
        self._round = 0  # Steps answered so far: a waiting slot's action is ready when it moves on
        self._actions: Any = None  # the last answer, as the program takes it (``envs.env_actions``)
        self._error: BaseException | None = None  # what ended the client: every waiting ``act`` raises it
        self._cond = threading.Condition()
        self._closed = False
        self._forget()
        self._conn = self._open()
        self.version = -1  # the policy version of the last answer

    # -- what the program calls ------------------------------------------------------------------------------

    def start_episode(self, slot: int | None = None) -> Episode:
        """An episode on ``slot``, or on the first free slot; raises ``RuntimeError`` when that slot (or every
        slot) holds one. A program whose threads each keep their own slot runs the same episodes on the same
        slots whatever the timing, which a strict learner then trains on reproducibly."""
        with self._cond:
            if slot is not None:
                if not 0 <= slot < self.slots:
                    raise ValueError(f"slot {slot} is not one of the client's slots 0..{self.slots - 1}")
                if self._episodes[slot] is not None:
                    raise RuntimeError(f"slot {slot} holds an episode: end it first")
                self._episodes[slot] = episode = Episode(self, slot)
                return episode
            for free, held in enumerate(self._episodes):
                if held is None:
                    self._episodes[free] = episode = Episode(self, free)
                    return episode
        raise RuntimeError(f"all {self.slots} slot(s) hold an episode: end one first, or connect with more slots")

    def close(self) -> None:
        """Leave the learner: it drops the unroll the slots were filling. Waiting ``act`` calls raise."""
        self._closed = True  # first: a Step in flight fails at once, and is not retried (``_exchange``)
        self._conn.close()
        with self._cond:
            if self._error is None:
                self._error = ConnectionError("the client was closed")
            self._cond.notify_all()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the episodes' calls ---------------------------------------------------------------------------------

    def _act(self, slot: int, obs: Any) -> Any:
        record = self._record(obs, "observation")
        with self._cond:
            if self._error is not None:
                raise self._error
            self._obs[slot] = record
            self._asked.add(slot)
            mine = self._round
            if len(self._asked) == self.slots:
                try:
                    self._exchange()
                except BaseException as err:
                    self._error = err
                    raise
                finally:
                    self._cond.notify_all()
            while self._round == mine:
                if self._error is not None:
                    raise self._error
                self._cond.wait()
            return slot_action(self._actions, slot)

    def _reward(self, slot: int, reward: float) -> None:
        with self._cond:
            self._rewards[slot] += reward

    def _end(self, slot: int, final_obs: Any, truncated: bool, episode_return: float, length: int) -> None:
        record = None if final_obs is None or not truncated else self._record(final_obs, "final observation")
        with self._cond:
            self._terminated[slot], self._truncated[slot] = not truncated, truncated
            if truncated:
                self._final[slot] = record
            self._finished[slot] = (episode_return, length)
            self._episodes[slot] = None

    # -- the wire --------------------------------------------------------------------------------------------

    def _record(self, obs: Any, what: str) -> np.ndarray:
        """One observation as the learner takes it, checked against the observation space's shape."""
        spec = self.obs_spec
        if spec.tree:
            return envs_lib.stack_records([obs], spec)[0]
        value = np.asarray(obs, dtype=spec.dtype)
        if value.shape != spec.shape:
            raise ValueError(f"{what} of shape {value.shape} does not match the observation space's "
                             f"{spec.describe()}; pass one observation of shape {spec.shape}")
        return value

    def _forget(self) -> None:
        """No outcome to report: after an answer, and on a new connection."""
        k = self.slots
        self._rewards = np.zeros(k, np.float32)
        self._terminated, self._truncated = np.zeros(k, bool), np.zeros(k, bool)
        self._final: dict[int, np.ndarray] = {}
        self._finished: dict[int, tuple[float, int]] = {}

    def _step(self) -> StepData:
        final_index = np.array(sorted(self._final), np.int64)
        final_obs = np.zeros((len(final_index), *self.obs_spec.shape), self.obs_spec.array_dtype)
        for row, slot in enumerate(final_index):
            final_obs[row] = self._final[int(slot)]
        finished = sorted(self._finished.items())
        return StepData(self._obs.copy(), self._rewards, self._terminated, self._truncated, final_index, final_obs,
                        np.array([r for _, (r, _) in finished], np.float64),
                        np.array([n for _, (_, n) in finished], np.int64))

    def _exchange(self) -> None:
        """Send every slot's Step, take the actions; on a lost connection reconnect and send the observations
        again without the outcome (the learner dropped the unroll it belonged to)."""
        backoff = Backoff(base_s=0.5, cap_s=10.0, budget_s=self._retry_for_s)
        while True:
            try:
                actions, self.version = self._conn.act(self._step())
                break
            except (LearnerClosed, LearnerRefused, Misconfigured):
                raise
            except ConnectionError as err:
                if self._closed:
                    raise ConnectionError("the client was closed") from err
                log.warning("actor %d: %s; reconnecting", self.actor_id, err)
                self._conn.close()
                self._forget()
                if not backoff.wait():
                    raise ConnectionError(f"no learner at {self._learner} for {self._retry_for_s:.0f} s: {err}") \
                        from err
                if self._closed:  # while it waited: no new connection that nothing would close
                    raise ConnectionError("the client was closed") from err
                self._conn = self._open(backoff)
        self._actions = envs_lib.env_actions(actions, self.act_spec)
        self._forget()
        self._asked.clear()
        self._round += 1

    def _open(self, backoff: Backoff | None = None) -> Connection:
        """A connection with a new run id (retried while no learner answers, when ``backoff`` is given)."""
        hello = pb.Hello(protocol=PROTOCOL, actor_id=self.actor_id, run_id=uuid.uuid4().hex, num_envs=self.slots,
                         env_id=self.env_id, observation_space=space_to_proto(self.obs_spec),
                         action_space=space_to_proto(self.act_spec))
        while True:
            try:
                return Connection.open(self._learner, hello, connect_timeout=self._connect_timeout, token=self._token,
                                       **self._tls)
            except (LearnerRefused, Misconfigured):
                raise
            except ConnectionError:
                if backoff is None or not backoff.wait():
                    raise


class Episode:
    """One episode on one slot: ``act`` for each action, ``reward`` for what it earned, ``end`` once."""

    def __init__(self, client: Client, slot: int) -> None:
        self.client, self.slot = client, slot
        self.length = 0  # actions taken
        self.episode_return = 0.0  # rewards given
        self.ended = False

    def act(self, obs: Any) -> Any:
        """The action for ``obs`` (one observation of the observation space), as the action space takes it.

        Blocks until every slot of the client has asked (one Step carries them all) and the learner answered,
        which in strict mode includes waiting while it trains. Raises ``LearnerClosed`` when training is over,
        ``LearnerRefused`` when the learner refused the client for good, ``ConnectionError`` when no learner
        answered for the client's ``retry_for_s``."""
        if self.ended:
            raise RuntimeError(f"slot {self.slot}'s episode has ended; start a new one (client.start_episode())")
        action = self.client._act(self.slot, obs)
        self.length += 1
        return action

    def reward(self, reward: float) -> None:
        """Add ``reward`` to the reward of the last action (sent with the next Step)."""
        if self.ended or not self.length:
            raise RuntimeError("a reward belongs to an action: call episode.act first (and before episode.end)")
        reward = float(reward)
        self.episode_return += reward
        self.client._reward(self.slot, reward)

    def end(self, final_obs: Any = None, *, truncated: bool = False) -> None:
        """End the episode: terminated (a terminal state: nothing to bootstrap), or ``truncated`` (cut short, by a
        time limit or the program: ``final_obs``, the observation it ended in, is needed to bootstrap its value).
        Frees the slot; the end is sent with the slot's next Step."""
        if self.ended:
            raise RuntimeError(f"slot {self.slot}'s episode has already ended")
        if not self.length:
            raise RuntimeError("an episode ends after at least one action: call episode.act first")
        if truncated and final_obs is None:
            raise ValueError("a truncated episode needs final_obs, the observation it ended in: the learner "
                             "bootstraps its value from it")
        self.client._end(self.slot, final_obs, truncated, self.episode_return, self.length)
        self.ended = True
