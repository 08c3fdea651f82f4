"""In-process actors: each actor's env loop a task on the learner's event loop (``actor.inprocess``),
started through ``Learner.run_on_loop`` and restarted as the ``RestartPolicy`` says when its env raises.

A failed env loop ends its session like a dead actor process (its unfinished unroll is dropped and
counted); one the learner refused, one whose learner failed, or one that finished, is not restarted. The
learner cancels the loops still running when it stops serving.
"""

from __future__ import annotations

import concurrent.futures
import logging
from typing import TYPE_CHECKING

from lockstep.actor.inprocess import serve_env_loop
from lockstep.launch.restart import FAILED, FINISHED, LEARNER_FAILED, REFUSED, RestartPolicy, Supervisor
from lockstep.transport.protocol import INTERNAL, RefusalLog, Refused

if TYPE_CHECKING:
    from lockstep.learner.wiring import Learner

log = logging.getLogger("lockstep.actor")

Future = concurrent.futures.Future


class InProcessActors(Supervisor[Future]):
    """Actors ``actor_ids`` with ``num_envs`` envs of ``env_id`` each, run on the learner's event loop."""

    def __init__(self, env_id: str, num_envs: int, actor_ids: list[int], policy: RestartPolicy,
                 obs_keys: tuple[str, ...] = (), env_kwargs: dict | None = None) -> None:
        super().__init__(actor_ids, policy)
        self.env_id, self.num_envs, self.obs_keys, self.env_kwargs = env_id, num_envs, obs_keys, env_kwargs
        self._learner: Learner | None = None
        self._refusals = RefusalLog(log)

    def start(self, learner: Learner) -> None:
        self._learner = learner
        super().start(learner)
        log.info("%d actor(s) x %d env(s) of %s inside the learner process", len(self.actors), self.num_envs,
                 self.env_id)

    def _spawn(self, actor_id: int) -> Future:
        return self._learner.run_on_loop(self._run(actor_id))

    async def _run(self, actor_id: int) -> int:
        """One env loop to its end; its exit code, as an actor process's."""
        try:
            await serve_env_loop(self._learner.sessions, self.env_id, self.num_envs, actor_id, self._refusals,
                                 self.obs_keys, self.env_kwargs)
            return FINISHED
        except Refused as err:
            if err.code == INTERNAL:  # the learner failed, and logged why
                return LEARNER_FAILED
            log.error("actor %d (in process): the learner refused it: %s", actor_id, err)
            return REFUSED
        except Exception:  # an env that raises must not take the learner down
            log.exception("actor %d (in process) failed", actor_id)
            return FAILED

    def _exit_code(self, handle: Future) -> int | None:
        if not handle.done():
            return None
        return FINISHED if handle.cancelled() else handle.result()  # cancelled: the learner stopped serving

    def _cause(self, code: int) -> str:
        return "(in process) failed"

    def _end(self, handles: list[Future], grace_s: float) -> None:
        concurrent.futures.wait(handles, timeout=grace_s)
        for future in handles:
            future.cancel()
