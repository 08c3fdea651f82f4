"""``lockstep train``: one learner in this process and its actors, started by the launcher ``actors.launcher``
names: local actor processes on loopback (here), or Ray actors (``launchers/ray.py``).

Local actors are supervised: one that dies (not one that finished, nor one the
learner refused) is restarted after a backoff, up to ``actors.restarts`` times.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lockstep.actor import ActorOptions, process_main
from lockstep.common.backoff import Backoff
from lockstep.common.device import resolve_device
from lockstep.config import Config
from lockstep.launch import Launcher
from lockstep.launch.ray import RayActors
from lockstep.learner.distributed import Ranks, ranks_run
from lockstep.learner.parts import DEFAULT_PARTS, Parts
from lockstep.learner.wiring import Learner
from lockstep.observe.metrics import write_summary
from lockstep.observe.progress import Progress

log = logging.getLogger("lockstep.train")

FINISHED, REFUSED = 0, 2  # actor exit codes that a restart cannot help


@dataclass
class _Supervised:
    options: ActorOptions
    backoff: Backoff
    process: mp.process.BaseProcess | None = None
    restarts: int = 0
    restart_at: float | None = None  # when a dead actor is due to be restarted


class ActorSupervisor:
    """Starts local actor processes (spawned, never forked: gRPC does not survive fork) and restarts dead ones."""

    def __init__(self, options: list[ActorOptions], max_restarts: int, backoff_s: float = 1.0,
                 max_backoff_s: float = 30.0) -> None:
        self._ctx = mp.get_context("spawn")
        self._level = logging.getLogger().getEffectiveLevel()
        self.actors = [_Supervised(o, Backoff(backoff_s, max_backoff_s, jitter=False)) for o in options]
        self.max_restarts = max_restarts
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s

    @property
    def restarts(self) -> int:
        return sum(a.restarts for a in self.actors)

    def start(self) -> None:
        for actor in self.actors:
            self._spawn(actor)

    def _spawn(self, actor: _Supervised) -> None:
        actor.process = self._ctx.Process(target=process_main, args=(actor.options, self._level),
                                          name=f"lockstep-actor-{actor.options.actor_id}", daemon=True)
        actor.process.start()

    def pids(self) -> list[int]:
        return [a.process.pid for a in self.actors if a.process is not None and a.process.is_alive()]

    def all_exited(self) -> bool:
        return all(a.process is None or not a.process.is_alive() for a in self.actors) and not any(
            a.restart_at is not None for a in self.actors)

    def check(self, training: bool) -> None:
        """Restart actors that died while training runs."""
        now = time.monotonic()
        for actor in self.actors:
            proc = actor.process
            if actor.restart_at is not None:
                if now >= actor.restart_at:
                    actor.restart_at = None
                    actor.restarts += 1
                    log.warning("restarting actor %d (restart %d of at most %d)",
                                actor.options.actor_id, actor.restarts, self.max_restarts)
                    self._spawn(actor)
                continue
            if proc is None or proc.is_alive() or not training:
                continue
            code = proc.exitcode
            if code in (FINISHED, REFUSED):
                continue
            if actor.restarts >= self.max_restarts:
                if actor.process is not None:
                    log.error("actor %d died (exit code %s) and has used its %d restarts; not restarting",
                              actor.options.actor_id, code, self.max_restarts)
                    actor.process = None
                continue
            delay = actor.backoff.delay()
            log.warning("actor %d died (exit code %s); restarting in %.1f s", actor.options.actor_id, code, delay)
            actor.restart_at = now + delay

    def stop(self, grace_s: float = 5.0) -> None:
        procs = [a.process for a in self.actors if a.process is not None]
        for a in self.actors:
            a.restart_at = None
        deadline = time.monotonic() + grace_s
        for proc in procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join(timeout=2.0)
            if proc.is_alive():
                proc.kill()
                proc.join()


def _local_actor_address(config: Config, port: int, local_address: str | None) -> str:
    """Where ``lockstep train``'s own actors connect: ``actors.transport`` decides, gRPC when there is no choice."""
    if config.actors.transport == "shm":
        if local_address:
            return local_address
        log.warning("actors.transport is shm, but this host has no same-host transport; local actors use gRPC")
    return f"127.0.0.1:{port}"


def train(config: Config, run_dir: Path, token: str | None = None, resume: bool = False,
          local_actors: bool = True, parts: Parts = DEFAULT_PARTS) -> dict[str, Any]:
    """Train to the step budget; every process started here is gone when this returns.

    With ``local_actors=False`` (``lockstep learner``) no actor is started: actors connect from
    elsewhere. SIGINT and SIGTERM stop the run in order either way. ``parts``: see ``learner.parts``.
    """
    ranks = Ranks.from_env(resolve_device(config.learner.device))  # under torchrun: one of several learners
    if ranks is not None:
        run_dir, config.run.seed = ranks_run(ranks, run_dir, config.run.seed)
        config.run.run_dir = str(run_dir)
    # Ray actors always use gRPC (they may run on other hosts); a missing Ray fails here, before the learner starts.
    ray_actors = RayActors(config, run_dir, token) if local_actors and config.actors.launcher == "ray" else None
    in_process = local_actors and ray_actors is None and config.actors.transport == "inprocess"
    learner = Learner(config, run_dir, token=token, resume=resume, in_process_actors=in_process, ranks=ranks,
                      parts=parts)
    if ray_actors is not None:
        ray_actors.connect()  # before the learner's gRPC server starts: Ray forks
    outcome: dict[str, Any] = {}

    def serve() -> None:
        try:
            outcome["summary"] = learner.serve()
        except BaseException as err:
            outcome["error"] = err

    thread = threading.Thread(target=serve, name="lockstep-learner")
    thread.start()
    supervisor: Launcher | None = None
    interrupted = threading.Event()

    def on_signal(signum, _frame) -> None:
        # Stop in order from the main loop rather than raising wherever the signal lands
        # (a KeyboardInterrupt inside a join or a waitpid can leave nothing to clean up with).
        if interrupted.is_set():
            raise KeyboardInterrupt  # a second Ctrl-C: stop waiting
        interrupted.set()
        log.warning("%s: stopping the learner and the actors", signal.Signals(signum).name)
        learner.stop()

    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        port = learner.wait_ready(timeout=60)
        if in_process:
            log.info("run directory %s; %d actor(s) x %d env(s) inside the learner process",
                     run_dir, config.actors.count, config.actors.envs_per_actor)
        elif ray_actors is not None:
            supervisor = ray_actors
            ray_actors.start(port)
        elif local_actors:
            address = _local_actor_address(config, port, learner.local_address)
            tls = config.learner.tls_cert or None
            supervisor = ActorSupervisor(
                [ActorOptions(learner=address, env=config.env.id, envs_per_actor=config.actors.envs_per_actor,
                              actor_id=i, token=token, tls_ca=tls, tls_server_name="localhost" if tls else None)
                 for i in range(config.actors.count)],
                max_restarts=config.actors.restarts)
            supervisor.start()
            log.info("run directory %s; %d actor(s) x %d env(s) at %s",
                     run_dir, config.actors.count, config.actors.envs_per_actor, address)
        else:
            host = config.learner.listen.rsplit(":", 1)[0]
            log.info("run directory %s; start actors with: lockstep actor --learner %s:%d --env %s --actor-id N",
                     run_dir, host, port, config.env.id)
            if learner.local_address:
                log.info("actors on this host can use shared memory instead: --learner %s", learner.local_address)
        with Progress(config, enabled=config.run.progress) as progress:
            while thread.is_alive():
                thread.join(timeout=0.25)
                progress.update(learner.status)
                if supervisor is not None:
                    supervisor.check(training=not learner.status.finished)
                    if not learner.status.started and supervisor.all_exited():
                        raise RuntimeError("every actor process exited before training started; see the log above")
    finally:
        learner.stop()
        thread.join()
        if supervisor is not None:
            supervisor.stop()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if interrupted.is_set():
        raise KeyboardInterrupt
    if "error" in outcome:
        raise outcome["error"]
    summary = outcome["summary"]
    if supervisor is not None:
        summary["actor_restarts"] = supervisor.restarts
        write_summary(run_dir / "summary.json", summary)
    if ranks is not None:  # every rank finished its run: leave the process group together
        ranks.close()
    return summary
