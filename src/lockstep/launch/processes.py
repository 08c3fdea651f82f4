"""Actor processes on this host: spawned (never forked: gRPC does not survive fork) and restarted as the
``RestartPolicy`` says. The launcher of ``lockstep train``'s local actors unless they run in process."""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from lockstep.actor import ActorOptions
from lockstep.launch import actor_process
from lockstep.launch.restart import RestartPolicy, Supervisor

if TYPE_CHECKING:
    from lockstep.learner.wiring import Learner

log = logging.getLogger("lockstep.train")

Process = mp.process.BaseProcess


class ActorProcesses(Supervisor[Process]):
    """One process per ``ActorOptions``. With ``address``, each connects where ``address(learner)`` says
    (known once the learner listens); without, where its options say."""

    def __init__(self, options: list[ActorOptions], policy: RestartPolicy,
                 address: Callable[[Learner], str] | None = None) -> None:
        super().__init__([o.actor_id for o in options], policy)
        self._ctx = mp.get_context("spawn")
        self._level = logging.getLogger().getEffectiveLevel()
        self._options = {o.actor_id: o for o in options}
        self._address = address

    def start(self, learner: Learner | None = None) -> None:
        if self._address is not None:
            address = self._address(learner)
            self._options = {i: replace(o, learner=address) for i, o in self._options.items()}
        super().start(learner)
        first = next(iter(self._options.values()), None)
        if first is not None:
            log.info("%d actor process(es) x %d env(s) at %s", len(self._options), first.envs_per_actor, first.learner)

    def pids(self) -> list[int]:
        return [a.handle.pid for a in self.actors if a.handle is not None and a.handle.is_alive()]

    def _spawn(self, actor_id: int) -> Process:
        # plain values, so that the child ties itself to this process before it imports anything heavy
        options = dataclasses.asdict(self._options[actor_id])
        process = self._ctx.Process(target=actor_process.main, args=(options, self._level, os.getpid()),
                                    name=f"lockstep-actor-{actor_id}", daemon=True)
        process.start()
        return process

    def _exit_code(self, handle: Process) -> int | None:
        return None if handle.is_alive() else handle.exitcode

    def _cause(self, code: int) -> str:
        return f"died (exit code {code})"

    def _end(self, handles: list[Process], grace_s: float) -> None:
        deadline = time.monotonic() + grace_s
        for proc in handles:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for proc in handles:
            if proc.is_alive():
                proc.terminate()
        for proc in handles:
            proc.join(timeout=2.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
