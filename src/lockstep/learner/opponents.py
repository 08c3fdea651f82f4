"""Self-play opponents: the policies that play the opponents' moves of turn-based games, served on the learner.

A self-play actor (``envs.selfplay``) opens a second connection whose hello says ``role: opponent``; each of
its steps asks for the opponents' moves of its slots: the observation [k, *obs] of whoever moves in each slot,
and ``terminated`` [k] marking the slots whose opponent is to move (the other rows keep the shape and their
answers are ignored); its finished episodes are the games its opponents decided before the learning player
moved in them (``envs.selfplay``: the learning player's return and the plies of each), which are no episodes
of the learning player's and are only counted (``games_decided_before_move``). An ``OpponentSession`` answers
with actions sampled from each slot's opponent snapshot: no gate, no unroll, nothing recorded, never held for
a phase (so a strict run cannot deadlock on it), and no step deadline (it is no member of any phase: an actor
between its learning steps owes it nothing).

Who the opponent is (``selfplay.opponents``):

- ``self``: the snapshot that serves the learning player (the current version).
- ``pool``: frozen past snapshots. Version 0 and then every ``selfplay.snapshot_every``-th version join the
  pool, which keeps the newest ``selfplay.pool_size``. For every slot of an actor, at the first opponent request
  of each new version, the opponent is drawn: the current version with probability ``selfplay.latest``, else
  uniformly from the pool (reproducible from the run seed, the actor id and the version). A slot keeps its
  opponent for the whole version: all its games in one phase meet the same opponents.
- either way, with probability ``selfplay.random`` (drawn after the above), ``RandomMoves``: uniformly random
  legal moves, from the slot's noise and the action mask, no forward pass. A pool of ever stronger versions
  can lead the policy away from what beats simple play; random opponents in the mix keep it there.

Snapshots are the immutable ``PolicySnapshot``s the snapshot backend publishes, kept on the learner's device.
The requests of every connected opponent session are gathered (up to ``learner.max_wait_ms``, or until each
has one waiting) and answered with one forward pass per snapshot over all their rows (``inference.act``).
Opponents keep no recurrent state: self-play needs a feedforward policy.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from lockstep.algo import noise
from lockstep.config import Config, SelfPlayConfig
from lockstep.envs import EnvSpec, SpaceSpec, selfplay
from lockstep.learner.backends import InferenceBackend
from lockstep.learner.inference import PolicySnapshot
from lockstep.observe.counters import Counters
from lockstep.transport.messages import HelloInfo, StepData, check_action_mask
from lockstep.transport.protocol import Reply

log = logging.getLogger(__name__)

_OPPONENT_STREAM = 1 << 40  # noise keys of opponent moves: a stream apart from every learning slot's


class OpponentPool:
    """The current snapshot and the frozen pool; draws each slot's opponent and batches the opponents' passes."""

    def __init__(self, config: SelfPlayConfig, seed: int, current: Callable[[], PolicySnapshot], counters: Counters,
                 max_wait_s: float, observation: SpaceSpec) -> None:
        if current().state_size:
            raise ValueError("self-play needs a feedforward policy (model.lstm_size 0): the opponents keep no "
                             "recurrent state between their moves")
        self.config, self.seed, self.counters, self.max_wait_s = config, seed, counters, max_wait_s
        self.current = current  # the snapshot that serves the learning player now
        self.observation = observation  # the learner's spec: it knows the action mask
        self.pool: list[PolicySnapshot] = []  # oldest first, at most config.pool_size
        self.random = RandomMoves(observation, config.random)
        self.sessions: set[OpponentSession] = set()
        self._queue: list[_Request] = []
        self._flush: asyncio.Task | None = None
        self._arrived = asyncio.Event()
        self.published()

    @property
    def oldest(self) -> PolicySnapshot:
        """The oldest pool member (``self``: the current version)."""
        return self.pool[0] if self.pool else self.current()

    def published(self) -> None:
        """A new version serves the learning player: it joins the pool if it is due (``selfplay.snapshot_every``)."""
        snapshot = self.current()
        if self.config.opponents != "pool" or snapshot.version % self.config.snapshot_every:
            return
        if not self.pool or self.pool[-1].version < snapshot.version:
            self.pool = [*self.pool, snapshot][-self.config.pool_size:]

    def draw(self, member: int, num_envs: int) -> list[PolicySnapshot | RandomMoves]:
        """The opponent of each of actor ``member``'s ``num_envs`` slots for the current version (module docstring)."""
        current = self.current()
        rng = np.random.default_rng([self.seed, member, current.version])
        if self.config.opponents == "self" or not self.pool:
            drawn: list[PolicySnapshot | RandomMoves] = [current] * num_envs
        else:
            latest = rng.random(num_envs) < self.config.latest
            picks = rng.integers(len(self.pool), size=num_envs)
            drawn = [current if newest else self.pool[j] for newest, j in zip(latest, picks)]
        if self.config.random > 0:
            drawn = [self.random if r else d for r, d in zip(rng.random(num_envs) < self.config.random, drawn)]
        return drawn

    def finish(self) -> None:
        """Training is over: every opponent connection's next step is answered with that."""
        for session in self.sessions:
            session.finished = True

    def connect(self, hello: HelloInfo) -> OpponentSession:
        session = OpponentSession(self, hello)
        self.sessions.add(session)
        log.info("actor %d opened its opponents' connection (run %s)", hello.actor_id, hello.run_id[:8])
        return session

    async def moves(self, session: OpponentSession, obs: np.ndarray) -> np.ndarray:
        """Actions [k] for ``session``'s request, from one pass per snapshot over every gathered request."""
        request = _Request(session, obs, session.snapshots(), asyncio.get_running_loop().create_future())
        self._queue.append(request)
        self._arrived.set()
        if self._flush is None or self._flush.done():
            self._flush = asyncio.create_task(self._gather_and_answer())
        return await request.future

    async def _gather_and_answer(self) -> None:
        try:
            async with asyncio.timeout(self.max_wait_s):
                while len(self._queue) < len(self.sessions):
                    self._arrived.clear()
                    await self._arrived.wait()
        except TimeoutError:
            pass
        queue, self._queue = self._queue, []
        try:
            answers = self._answer(queue)
        except Exception as err:  # every waiting request learns of it, not only the first
            for request in queue:
                request.future.done() or request.future.set_exception(err)
            return
        for request, actions in zip(queue, answers):
            request.future.done() or request.future.set_result(actions)

    def _answer(self, queue: list[_Request]) -> list[np.ndarray]:
        """One pass per snapshot over the rows of ``queue`` that it plays; actions [k] per request."""
        rows: dict[int, list[tuple[int, int]]] = {}  # id(snapshot) -> (request, slot) pairs
        snapshots: dict[int, PolicySnapshot] = {}
        for r, request in enumerate(queue):
            for slot, snapshot in enumerate(request.snapshots):
                rows.setdefault(id(snapshot), []).append((r, slot))
                snapshots[id(snapshot)] = snapshot
        answers = [None] * len(queue)
        for key, pairs in rows.items():
            snapshot = snapshots[key]
            obs = np.concatenate([queue[r].obs[slot:slot + 1] for r, slot in pairs])  # [B, *obs]
            keys = np.concatenate([queue[r].session.keys[slot:slot + 1] for r, slot in pairs])
            counters = np.array([queue[r].session.counter for r, _ in pairs], np.uint64)
            uniform = noise.uniform(keys, counters, snapshot.noise_width)
            actions = snapshot.step(obs, uniform, snapshot.initial_state(len(pairs)))[0]  # [B, *act]
            for (r, slot), action in zip(pairs, actions):
                if answers[r] is None:
                    answers[r] = np.empty((len(queue[r].obs), *actions.shape[1:]), actions.dtype)
                answers[r][slot] = action
        for request in queue:
            request.session.counter += 1
        return answers


def for_run(config: Config, spec: EnvSpec, backend: InferenceBackend, counters: Counters) -> OpponentPool | None:
    """The opponents of a self-play run (env id ``pettingzoo:MODULE`` of a turn-based game), else None."""
    if not selfplay.is_game(config.env.id):
        return None
    current = getattr(backend, "current", None)
    if current is None:
        raise ValueError(f"self-play ({config.env.id}) needs a backend that publishes snapshots (strict, "
                         "pipelined or async): the opponents play them, and this one updates the model in place")
    return OpponentPool(config.selfplay, config.run.seed, current, counters, config.learner.max_wait_ms / 1000.0,
                        spec.observation)


class RandomMoves:
    """The opponent that plays uniformly random legal moves (``selfplay.random``), answered like a snapshot:
    ``step(obs [B], uniform [B, 1], state)`` -> (actions [B],), the ``u``-th legal move of each row's mask."""

    version = -1  # no version of the policy
    noise_width = 1
    state_size = 0

    def __init__(self, observation: SpaceSpec, share: float) -> None:
        if share > 0 and not observation.mask:
            raise ValueError("selfplay.random plays random legal moves: it needs an action mask in the observation "
                             "(env.action_mask_key)")
        self.mask = observation.mask

    def initial_state(self, slots: int) -> np.ndarray:
        return np.zeros((slots, 0), np.float32)

    def step(self, obs: np.ndarray, uniform: np.ndarray, state: np.ndarray) -> tuple[np.ndarray]:
        legal = np.asarray(obs[self.mask], bool).reshape(len(obs), -1)  # [B, n]
        count = legal.sum(axis=1)  # [B], at least 1 (``check_action_mask``)
        pick = np.minimum((uniform[:, 0] * count).astype(np.int64), count - 1)  # [B]
        return ((np.cumsum(legal, axis=1) > pick[:, None]).argmax(axis=1),)  # the pick-th legal column


@dataclass
class _Request:
    session: OpponentSession
    obs: np.ndarray  # [k, *obs]
    snapshots: list[PolicySnapshot]  # [k]: each slot's opponent
    future: asyncio.Future


class OpponentSession:
    """One self-play actor's opponents' connection (module docstring): inference only, nothing recorded."""

    def __init__(self, pool: OpponentPool, hello: HelloInfo) -> None:
        self.pool, self.member, self.num_envs = pool, hello.actor_id, hello.num_envs
        self.keys = noise.slot_keys(pool.seed, _OPPONENT_STREAM + hello.actor_id, hello.num_envs)  # [k] uint64
        self.counter = 0  # requests answered: the noise counter of the next
        self.owed_since: float | None = None  # stamped by the connection loop; no deadline reads it
        self.evicted: str | None = None
        self.finished = False
        self._drawn: tuple[int, list[PolicySnapshot]] | None = None  # (version, each slot's opponent)

    def snapshots(self) -> list[PolicySnapshot]:
        version = self.pool.current().version
        if self._drawn is None or self._drawn[0] != version:
            self._drawn = version, self.pool.draw(self.member, self.num_envs)
        return self._drawn[1]

    async def step(self, data: StepData) -> Reply | None:
        if self.finished:
            return None
        waiting = np.asarray(data.terminated, bool)  # [k]: the slots whose opponent is to move
        check_action_mask(data.obs, self.pool.observation)
        actions = await self.pool.moves(self, data.obs)
        self.pool.counters.opponent_moves += int(waiting.sum())
        self.pool.counters.games_decided_before_move += len(data.episode_length)
        return Reply(actions, self.pool.current().version)

    def close(self) -> None:
        self.pool.sessions.discard(self)
