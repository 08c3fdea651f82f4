"""In-process actors: an actor's env loop as a task on the learner's own event loop.

The same-host option for cheap environments at a handful of envs per actor, where even
a shared-memory round trip (a process wake-up on each side) costs more than the env
step itself. Each actor speaks the same session protocol as a remote one (hello checks,
steps validated by ``messages.check_step``, the gate, the version stamps), with no
serialization and no other process: stepping is on the event loop's thread, between
the forward passes it waits for. Slow environments belong in actor processes.

An actor task that fails (its environment raised) ends its session like a dead actor
process (its unfinished unroll is dropped and counted) and is restarted after a backoff,
at most ``max_restarts`` times.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from lockstep import envs as envs_lib
from lockstep.actor import EnvLoop
from lockstep.common.backoff import Backoff
from lockstep.transport import PROTOCOL
from lockstep.transport.messages import HelloInfo, check_step
from lockstep.transport.protocol import ActorHandler, Refused

log = logging.getLogger("lockstep.actor")


class InProcessActors:
    """Actors ``actor_ids`` with ``num_envs`` envs of ``env_id`` each, run as tasks of the current event loop."""

    def __init__(self, handler: ActorHandler, env_id: str, num_envs: int, actor_ids: list[int],
                 max_restarts: int = 10) -> None:
        self.handler, self.env_id, self.num_envs = handler, env_id, num_envs
        self.actor_ids, self.max_restarts = actor_ids, max_restarts
        self.restarts = 0
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._supervise(a), name=f"lockstep-actor-{a}") for a in self.actor_ids]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _supervise(self, actor_id: int) -> None:
        backoff = Backoff(base_s=1.0, cap_s=30.0, jitter=False)
        while True:
            try:
                await self._run(actor_id)
                return  # training is over
            except Refused as err:
                log.error("actor %d (in process): the learner refused it: %s", actor_id, err)
                return
            except Exception:  # an env that raises must not take the learner down
                if self.restarts >= self.max_restarts:
                    log.exception("actor %d (in process) failed and has used the run's %d restarts",
                                  actor_id, self.max_restarts)
                    return
                self.restarts += 1
                delay = backoff.delay()
                log.exception("actor %d (in process) failed; restarting in %.1f s", actor_id, delay)
                await asyncio.sleep(delay)

    async def _run(self, actor_id: int) -> None:
        vec = envs_lib.make_vector_env(self.env_id, self.num_envs)
        session = None
        try:
            obs_spec = envs_lib.SpaceSpec.from_space(vec.single_observation_space)
            act_spec = envs_lib.SpaceSpec.from_space(vec.single_action_space)
            hello = HelloInfo(protocol=PROTOCOL, actor_id=actor_id, run_id=uuid.uuid4().hex, num_envs=self.num_envs,
                              env_id=self.env_id, observation=obs_spec, action=act_spec)
            session, welcome = self.handler.connect(hello)
            loop = EnvLoop(vec, act_spec)
            loop.reset(envs_lib.env_seeds(welcome.seed, actor_id, self.num_envs))
            while True:
                data = check_step(loop.outcome(), self.num_envs, obs_spec)
                reply = await session.step(data)
                if reply is None:
                    return
                if reply.actions is not None:  # None: an in-place strategy's "no action, send it again"
                    loop.step(reply.actions)
        finally:
            if session is not None:
                session.close()
            vec.close()
