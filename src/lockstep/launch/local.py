"""``lockstep train``: one learner in this process and its actors, started and restarted by the launcher
that ``actors.launcher`` and ``actors.transport`` name (``launch/__init__.py``): local actor processes on
loopback, in-process env loops, or Ray actors.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Any

from lockstep.actor import ActorOptions
from lockstep.common.device import resolve_device
from lockstep.config import Config
from lockstep.launch import Launcher
from lockstep.launch.inprocess import InProcessActors
from lockstep.launch.processes import ActorProcesses
from lockstep.launch.ray import RayActors
from lockstep.launch.restart import RestartPolicy
from lockstep.learner.distributed import Ranks, ranks_run
from lockstep.learner.parts import DEFAULT_PARTS, Parts
from lockstep.learner.wiring import Learner
from lockstep.observe.metrics import write_summary
from lockstep.observe.progress import Progress
from lockstep.transport.grpc import security

log = logging.getLogger("lockstep.train")


def launcher(config: Config, run_dir: Path, token: str | None) -> Launcher:
    """The launcher of ``lockstep train``'s own actors. Ray actors always use gRPC (they may run on other
    hosts); a missing Ray fails here, before the learner is built."""
    env, actors = config.env, config.actors
    policy = RestartPolicy(actors.restarts)
    if actors.launcher == "ray":
        return RayActors(config, run_dir, token, policy)
    if config.actors.transport == "inprocess":
        return InProcessActors(env.id, actors.envs_per_actor, list(range(actors.count)), policy)
    tls = config.learner.tls_cert or None
    options = [ActorOptions(learner="", env=env.id, envs_per_actor=actors.envs_per_actor, actor_id=i, token=token,
                            tls_ca=tls, tls_server_name="localhost" if tls else None) for i in range(actors.count)]
    return ActorProcesses(options, policy,
                          address=lambda learner: _local_actor_address(config, learner.port, learner.local_address))


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
    security.check_listen(config.learner.listen, token)  # off loopback, actors elsewhere must be told the token
    generated = not token
    token = token or security.new_token()  # a token always (security.py), never written to the run directory
    actors = launcher(config, run_dir, token) if local_actors else None
    learner = Learner(config, run_dir, token=token, resume=resume, ranks=ranks, parts=parts)
    outcome: dict[str, Any] = {}

    def serve() -> None:
        try:
            outcome["summary"] = learner.serve()
        except BaseException as err:
            outcome["error"] = err

    thread = threading.Thread(target=serve, name="lockstep-learner")
    interrupted = threading.Event()

    def on_signal(signum, _frame) -> None:
        # Stop in order from the main loop rather than raising wherever the signal lands
        # (a KeyboardInterrupt inside a join or a waitpid can leave nothing to clean up with).
        if interrupted.is_set():
            raise KeyboardInterrupt  # a second Ctrl-C: stop waiting
        interrupted.set()
        log.warning("%s: stopping the learner and the actors", signal.Signals(signum).name)
        learner.stop()

    # the port whose token file this run writes: a fixed one's before listening, so that no actor started
    # at the same time as the learner connects before the token is there to read
    published = int(config.learner.listen.rsplit(":", 1)[1]) if generated and not local_actors else None
    where = security.publish_token(published, token) if published else ""
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if actors is not None:
            actors.prepare()
        thread.start()
        port = learner.wait_ready(timeout=60)
        if actors is not None:
            log.info("run directory %s", run_dir)
            actors.start(learner)  # it logs where the actors run
        else:
            host = config.learner.listen.rsplit(":", 1)[0]
            log.info("run directory %s; start actors with: lockstep actor --learner %s:%d --env %s --actor-id N",
                     run_dir, host, port, config.env.id)
            if generated:
                published, where = port, where or security.publish_token(port, token)
                log.info("no token given: this run's token is in %s; other actors need it with --token or $%s",
                         where, security.TOKEN_ENV)
            if learner.local_address:
                log.info("actors on this host can use shared memory instead: --learner %s", learner.local_address)
        with Progress(config, enabled=config.run.progress) as progress:
            while thread.is_alive():
                thread.join(timeout=0.25)
                progress.update(learner.status)
                if actors is not None:
                    actors.check(training=not learner.status.finished)
                    if not learner.status.started and actors.all_exited():
                        raise RuntimeError("every actor exited before training started; see the log above")
    finally:
        learner.stop()
        if thread.is_alive():
            thread.join()
        if published:
            security.unpublish_token(published)
        if actors is not None:
            actors.stop()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    if interrupted.is_set():
        raise KeyboardInterrupt
    if "error" in outcome:
        raise outcome["error"]
    summary = outcome["summary"]
    if actors is not None:
        summary["actor_restarts"] = actors.restarts
        write_summary(run_dir / "summary.json", summary)
    if ranks is not None:  # every rank finished its run: leave the process group together
        ranks.close()
    return summary
