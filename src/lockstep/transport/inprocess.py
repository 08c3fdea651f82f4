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

import logging
import uuid
from collections.abc import AsyncIterator

from lockstep import envs as envs_lib
from lockstep.actor import EnvLoop
from lockstep.transport import PROTOCOL
from lockstep.transport.connection import CodecClock, send_connection
from lockstep.transport.messages import HelloInfo, StepData, check_step
from lockstep.transport.protocol import ActorHandler, RefusalLog, Refused, Reply, Welcome

log = logging.getLogger("lockstep.actor")


class InProcessFraming:
    """One actor's vector env as a ``connection.Framing``: the hello describes the env, a step is the env
    loop's outcome, a reply steps the envs, and a refusal is raised (as ``Refused``) to whoever runs it."""

    def __init__(self, env_id: str, num_envs: int, actor_id: int, obs_keys: tuple[str, ...] = (),
                 env_kwargs: dict | None = None) -> None:
        self.peer = f"actor {actor_id} (in process)"
        self._vec = envs_lib.make_vector_env(env_id, num_envs, env_kwargs)
        self.env_id, self.num_envs, self.actor_id = env_id, self._vec.num_envs, actor_id  # slots: one per agent
        self._obs_spec = envs_lib.SpaceSpec.from_space(self._vec.single_observation_space, obs_keys)
        self._act_spec = envs_lib.action_spec(self._vec.single_action_space)
        self._loop = EnvLoop(self._vec, self._act_spec, self._obs_spec)

    async def hello(self) -> HelloInfo:
        return HelloInfo(protocol=PROTOCOL, actor_id=self.actor_id, run_id=uuid.uuid4().hex, num_envs=self.num_envs,
                         env_id=self.env_id, observation=self._obs_spec, action=self._act_spec)

    def welcome(self, hello: HelloInfo, welcome: Welcome) -> None:
        self._loop.reset(envs_lib.env_seeds(welcome.seed, self.actor_id, self.num_envs))

    @property
    async def incoming(self) -> AsyncIterator[StepData]:
        while True:
            yield self._loop.outcome()

    def decode(self, data: StepData, hello: HelloInfo) -> StepData:
        return check_step(data, hello.num_envs, hello.observation)

    def reply(self, reply: Reply) -> Reply:
        return reply

    def over(self) -> None:
        return None

    async def send(self, message: Reply | None) -> None:
        if message is not None and message.actions is not None:  # None: an in-place strategy's "send it again"
            self._loop.step(message.actions)

    async def refuse(self, code: str, message: str) -> None:
        raise Refused(code, message)

    def close(self) -> None:
        self._vec.close()


async def serve_env_loop(handler: ActorHandler, env_id: str, num_envs: int, actor_id: int,
                         refusals: RefusalLog, obs_keys: tuple[str, ...] = (), env_kwargs: dict | None = None) -> None:
    """Run one in-process actor until training is over; raises ``Refused``, or what its env raised."""
    await send_connection(InProcessFraming(env_id, num_envs, actor_id, obs_keys, env_kwargs), handler, refusals,
                          CodecClock())
