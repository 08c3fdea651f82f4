"""``lockstep train``: one learner in this process and local actor processes on loopback."""

from __future__ import annotations

import logging
import multiprocessing as mp
import threading
import time
from pathlib import Path
from typing import Any

from lockstep.actor import ActorOptions, process_main
from lockstep.config import Config
from lockstep.learner import Learner
from lockstep.progress import Progress

log = logging.getLogger("lockstep.train")


def train(config: Config, run_dir: Path) -> dict[str, Any]:
    """Train to the step budget; every process started here is gone when this returns."""
    learner = Learner(config, run_dir)
    outcome: dict[str, Any] = {}

    def serve() -> None:
        try:
            outcome["summary"] = learner.serve()
        except BaseException as err:  # noqa: BLE001 - reported by the caller's thread
            outcome["error"] = err

    thread = threading.Thread(target=serve, name="lockstep-learner")
    thread.start()
    actors: list[mp.process.BaseProcess] = []
    try:
        port = learner.wait_ready(timeout=60)
        ctx = mp.get_context("spawn")  # gRPC does not survive fork
        level = logging.getLogger().getEffectiveLevel()
        for i in range(config.env.actors):
            opts = ActorOptions(learner=f"127.0.0.1:{port}", env=config.env.id,
                                num_envs=config.env.envs_per_actor, actor_id=i)
            proc = ctx.Process(target=process_main, args=(opts, level), name=f"lockstep-actor-{i}", daemon=True)
            proc.start()
            actors.append(proc)
        log.info("run directory %s; %d actor(s) x %d env(s) on port %d",
                 run_dir, config.env.actors, config.env.envs_per_actor, port)
        with Progress(config, enabled=config.run.progress) as progress:
            while thread.is_alive():
                thread.join(timeout=0.25)
                progress.update(learner.status)
                if not learner.status.started and actors and all(not p.is_alive() for p in actors):
                    raise RuntimeError("every actor process exited before training started; see the log above")
    except KeyboardInterrupt:
        log.warning("interrupted: stopping the learner and the actors")
        raise
    finally:
        learner.stop()
        thread.join()
        _stop_processes(actors)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["summary"]


def _stop_processes(procs: list[mp.process.BaseProcess], grace_s: float = 5.0) -> None:
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
