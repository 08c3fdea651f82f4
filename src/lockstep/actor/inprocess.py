"""The in-process transport: an actor's env loop on the learner's own event loop, with no wire at all.

The same-host option for cheap environments at a handful of envs per actor, where even
a shared-memory round trip (a process wake-up on each side) costs more than the env
step itself. The actor speaks the same session protocol as a remote one, through the same
connection loop (``connection.serve_connection``; ``InProcessFraming`` is its framing, made
of direct calls): hello checks, steps validated by ``messages.check_step``, the gate, the
version stamps. Stepping is on the event loop's thread, between the forward passes it waits
for; slow environments belong in actor processes.

Who starts these actors, and restarts one whose env raised: ``launch.inprocess``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from lockstep import envs as envs_lib
from lockstep.actor import EnvLoop, opponent_request
from lockstep.envs.selfplay import Plies
from lockstep.transport import PROTOCOL
from lockstep.transport.connection import CodecClock, send_connection
from lockstep.transport.messages import OPPONENT, HelloInfo, StepData, check_step
from lockstep.transport.protocol import ActorHandler, RefusalLog, Refused, Reply, Welcome

log = logging.getLogger("lockstep.actor")


class InProcessFraming:
    """One actor's vector env as a ``connection.Framing``: the hello describes the env, a step is the env
    loop's outcome, a reply steps the envs, and a refusal is raised (as ``Refused``) to whoever runs it."""

    def __init__(self, env_id: str, num_envs: int, actor_id: int, obs_keys: tuple[str, ...] = (),
                 env_kwargs: dict | None = None, handler: ActorHandler | None = None,
                 refusals: RefusalLog | None = None) -> None:
        self.peer = f"actor {actor_id} (in process)"
        self._vec = envs_lib.make_vector_env(env_id, num_envs, env_kwargs)
        self.env_id, self.num_envs, self.actor_id = env_id, self._vec.num_envs, actor_id  # slots: one per agent
        self._obs_spec = envs_lib.SpaceSpec.from_space(self._vec.single_observation_space, obs_keys)
        self._act_spec = envs_lib.action_spec(self._vec.single_action_space)
        self._loop = EnvLoop(self._vec, self._act_spec, self._obs_spec)
        self._seeds: list[int] = []
        # a self-play game: its opponents' moves come over a second connection (``OpponentChannel``)
        self._opponents = (OpponentChannel(self._vec, self.hello_info(), self._obs_spec, handler, refusals)
                           if isinstance(self._vec, envs_lib.selfplay.SelfPlayVectorEnv) else None)

    def hello_info(self) -> HelloInfo:
        return HelloInfo(protocol=PROTOCOL, actor_id=self.actor_id, run_id=uuid.uuid4().hex, num_envs=self.num_envs,
                         env_id=self.env_id, observation=self._obs_spec, action=self._act_spec,
                         agent_policies=envs_lib.pettingzoo.agent_policies(self._vec))

    async def hello(self) -> HelloInfo:
        return self.hello_info()

    def welcome(self, hello: HelloInfo, welcome: Welcome) -> None:
        self._seeds = envs_lib.env_seeds(welcome.seed, self.actor_id, self.num_envs)
        if self._opponents is None:
            self._loop.reset(self._seeds)

    @property
    async def incoming(self) -> AsyncIterator[StepData]:
        if self._opponents is not None:  # the reset of a game whose learning seat moves second plays the opponent
            obs, _ = await self._opponents.play(self._vec.resetting(self._seeds))
            self._loop.reset_to(obs)
        while True:
            yield self._loop.outcome()

    def decode(self, data: StepData, hello: HelloInfo) -> StepData:
        return check_step(data, hello.num_envs, hello.observation)

    def reply(self, reply: Reply) -> Reply:
        return reply

    def over(self) -> None:
        return None

    async def send(self, message: Reply | None) -> None:
        if message is None or message.actions is None:  # None: an in-place strategy's "send it again"
            return
        if self._opponents is None:
            self._loop.step(message.actions)
        else:
            self._loop.record(await self._opponents.play(self._vec.stepping(self._loop.env_actions(message.actions))))

    async def refuse(self, code: str, message: str) -> None:
        raise Refused(code, message)

    def close(self) -> None:
        if self._opponents is not None:
            self._opponents.close()
        self._vec.close()


class OpponentChannel:
    """A self-play actor's opponents' connection in process: a framing of its own, served like any connection
    (``serve_connection``: the hello with ``role: opponent``, steps checked, replies), on a task of its own."""

    def __init__(self, vec, hello: HelloInfo, obs_spec: envs_lib.SpaceSpec, handler: ActorHandler,
                 refusals: RefusalLog) -> None:
        self.peer = f"actor {hello.actor_id} (in process, opponents)"
        self._hello = dataclasses.replace(hello, role=OPPONENT)
        self._vec, self._obs_spec, self._handler, self._refusals = vec, obs_spec, handler, refusals
        self._requests: asyncio.Queue[StepData] = asyncio.Queue()
        self._answer: asyncio.Future | None = None
        self._task: asyncio.Task | None = None

    async def play(self, plies: Plies) -> Any:
        """Run ``plies`` (``SelfPlayVectorEnv.stepping`` or ``resetting``), awaiting each opponent move."""
        if self._task is None:
            self._task = asyncio.create_task(send_connection(self, self._handler, self._refusals, CodecClock()))
        try:
            request = next(plies)
            while True:
                self._answer = asyncio.get_running_loop().create_future()
                self._requests.put_nowait(opponent_request(*request, self._obs_spec, self._vec.take_decided()))
                request = plies.send(await self._answer)
        except StopIteration as done:
            return done.value

    # -- the opponents' connection, as a ``connection.Framing`` --------------------------------------

    async def hello(self) -> HelloInfo:
        return self._hello

    def welcome(self, hello: HelloInfo, welcome: Welcome) -> None:
        pass

    @property
    async def incoming(self) -> AsyncIterator[StepData]:
        while True:
            yield await self._requests.get()

    def decode(self, data: StepData, hello: HelloInfo) -> StepData:
        return check_step(data, hello.num_envs, hello.observation)

    def reply(self, reply: Reply) -> Reply:
        return reply

    def over(self) -> None:
        return None  # training is over: the learning connection ends the env loop

    async def send(self, message: Reply | None) -> None:
        if message is not None:  # None: the welcome, which needs no answer here
            self._answer.set_result(message.actions)

    async def refuse(self, code: str, message: str) -> None:
        if self._answer is not None and not self._answer.done():
            self._answer.set_exception(Refused(code, message))

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()


async def serve_env_loop(handler: ActorHandler, env_id: str, num_envs: int, actor_id: int,
                         refusals: RefusalLog, obs_keys: tuple[str, ...] = (), env_kwargs: dict | None = None) -> None:
    """Run one in-process actor until training is over; raises ``Refused``, or what its env raised."""
    framing = InProcessFraming(env_id, num_envs, actor_id, obs_keys, env_kwargs, handler, refusals)
    await send_connection(framing, handler, refusals, CodecClock())
