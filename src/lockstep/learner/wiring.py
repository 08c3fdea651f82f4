"""The learner: the one place that wires transport, sessions, backend, rollout store and trainer together.

Threads
    event loop   the gRPC and same-host servers (one Sessions for both), every actor session, the
                 gate's admissions and the backend's inference. Held requests are awaited futures here.
                 In-process env loops run here too, started by their launcher (``run_on_loop``).
    trainer      trains closed phases in order, writes the row and the checkpoint, publishes the next version.
    inference    a backend's own, if it has any (the benchmarks' reference designs run their passes on a pool).

Publishing v+1 is always ``backend.publish()`` (a snapshot backend swaps its snapshot), then ``gate.publish(v+1)``
(through ``sessions.publish``, which times the release): every request admitted for v+1 is served by v+1.
The learner never asks which strategy it runs.
What may be put in from outside (the benchmarks' parts) is ``learner.parts``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import torch

from lockstep import sync
from lockstep.config import Config
from lockstep.config import save as save_config
from lockstep.envs import env_spec
from lockstep.learner import RunFailed, event_loop, opponents, team
from lockstep.learner.checkpoint import Checkpointer
from lockstep.learner.device import prepare_device
from lockstep.learner.distributed import Ranks
from lockstep.learner.parts import DEFAULT_PARTS, Parts
from lockstep.learner.report import Report
from lockstep.learner.rollout import PhaseStore, TrainingPhase
from lockstep.learner.session import Sessions, StallRule
from lockstep.observe.counters import Clock
from lockstep.observe.metrics import EpisodeTracker
from lockstep.observe.progress import Status
from lockstep.transport.grpc import security
from lockstep.transport.grpc.server import LearnerServer
from lockstep.transport.messages import StepBounds
from lockstep.transport.protocol import Welcome
from lockstep.transport.shm import server as shm

log = logging.getLogger("lockstep.learner.wiring")


class Learner:
    def __init__(self, config: Config, run_dir: Path, token: str | None = None, resume: bool = False,
                 ranks: Ranks | None = None, parts: Parts = DEFAULT_PARTS) -> None:
        config.validate()
        security.check_server(config.learner.listen, token, config.learner.tls_cert, config.learner.tls_key)
        self.config, self.run_dir, self.token = config, run_dir, token  # the token is never written to the run dir
        self.spec = env_spec(config.env.id, config.env.obs_keys, config.env.action_mask_key, config.vector_kwargs())
        self.device = prepare_device(config.learner.device, config.learner.deterministic)
        torch.set_num_threads(config.learner.torch_threads)
        self.strategy = parts.strategy or sync.strategy(config.sync.strategy, config.sync.max_lag)
        self.ranks = ranks  # several learners training one policy (torch.distributed): distributed.py
        parts = team.parts(parts) if self.spec.policies else parts  # several policies: learner/team.py
        self.trainer = parts.trainer(config, self.spec, self.device, max_lag=self.strategy.max_lag, ranks=ranks)
        self.clock, self.episodes = Clock(), EpisodeTracker(config.return_thresholds())
        self.report = Report(run_dir, self.trainer, self.episodes, self.clock, self.spec.agents, self.spec.policies)
        run = config.run
        self.checkpointer = Checkpointer(run_dir / "checkpoints", run.checkpoint_every, run.checkpoint_minutes,
                                         run.keep_checkpoints)
        slot_counters = {}
        self.resumed_from: Path | None = None
        if resume:
            self.resumed_from, state = (ranks.newest_common(self.checkpointer, dataclasses.asdict(config)) if ranks
                                        else self.checkpointer.newest(dataclasses.asdict(config)))
            slot_counters = self.report.load_checkpoint_state(state)
            log.info("resuming from %s: iteration %d, version %d", self.resumed_from, self.trainer.iteration,
                     self.trainer.version)
        self.gate = self.strategy.gate(config.ppo.steps_per_env, config.min_actors, start_version=self.trainer.version,
                                       cutoff=config.sync.phase_cutoff, min_unroll=config.sync.min_unroll,
                                       close_empty=ranks is not None)  # the other ranks wait for this one's update
        self.audit = parts.audit(run_dir / "audit", config, self.trainer, not resume) if run.audit else None
        self.phases = PhaseStore()
        self.backend = parts.backend(self.trainer, config, lambda: self.sessions.expected_requests(), self.audit)
        if parts.wrap_backend is not None:
            self.backend = parts.wrap_backend(self.backend, self.trainer)
        self.sessions = Sessions(self.spec, Welcome(run.seed, run_dir.name), config.ppo.steps_per_env, self.gate,
                                 self.backend, self.phases, self.report.counters, self.episodes, self.clock)
        self.sessions.slot_counters.update(slot_counters)
        self.sessions.opponents = opponents.for_run(config, self.spec, self.backend, self.report.counters)
        self.report.opponents, self.sessions.teams = self.sessions.opponents, self.report.teams  # both use them
        self.sessions.policy_returns = self.report.policy_returns
        self.sessions.on_failure = lambda error: self.stop(error=error)  # the learner's own code failed
        self.port, self.local_address, self.error = None, None, None  # gRPC port; unix:/path (or None); failure
        self._servers: list[LearnerServer | shm.LocalServer] = []  # their codec_s goes into the time split
        self._loop: asyncio.AbstractEventLoop | None = None
        self._asked, self._completed = False, False  # stop() was called; the run ended by its own rule: _decide
        self._trainer = threading.Thread(target=self._train_loop, name="lockstep-trainer", daemon=True)
        self._ready, self._stop = threading.Event(), threading.Event()  # listening; serving ends
        self._guests: set[asyncio.Task] = set()  # what run_on_loop runs; cancelled when serving ends

    @property
    def status(self) -> Status:
        """What the progress display shows; ``finished``: training is over (budget spent or stopped)."""
        return dataclasses.replace(self.report.status, actors=len(self.sessions.actor_ids),
                                   started=self.clock.started, finished=self.sessions.finished)

    # -- running --------------------------------------------------------------------

    def serve(self) -> dict[str, Any]:
        """Run until the step budget is spent (or ``stop()``); return the summary, or raise ``RunFailed``."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(self.config, self.run_dir / "config.yaml")
        self.report.open(resume_after=self.trainer.iteration if self.resumed_from else None)
        try:
            event_loop.runner(self.config.learner.event_loop)(self._serve(self._trainer))
        finally:
            self.phases.stop()
            if self._trainer.is_alive():
                self._trainer.join()
            self.backend.close()
            self.report.close()
        summary = self._write_final()
        if self.error is not None:
            raise RunFailed(self.error) from self.error
        return summary

    def wait_ready(self, timeout: float | None = None) -> int:
        """Block until the server listens; return its port."""
        if not self._ready.wait(timeout):
            raise TimeoutError("the learner did not start listening in time")
        if self.port is None:
            raise RuntimeError(f"the learner failed to start: {self.error}")
        return self.port

    def run_on_loop(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future:
        """Run ``coro`` on the learner's event loop (thread-safe, after ``wait_ready``); cancelled when serving ends."""
        return asyncio.run_coroutine_threadsafe(self._guest(coro), self._loop)

    async def _guest(self, coro: Coroutine[Any, Any, Any]) -> Any:
        self._guests.add(task := asyncio.current_task())
        task.add_done_callback(self._guests.discard)
        return await coro

    def stop(self, at_once: bool = False, error: BaseException | None = None) -> None:
        """Ask the learner to finish (thread-safe, also before it serves); several learners: see ``_decide``.
        ``error``: the run failed (``Sessions.fail``; or every actor gone): it ends at once, with no ``final.pt``."""
        self._asked, self.error = True, self.error or error
        if self.ranks is None or at_once or error is not None or not self._trainer.is_alive():
            self._stop.set()

    async def _serve(self, trainer: threading.Thread) -> None:
        self._loop = asyncio.get_running_loop()
        cfg = self.config.learner
        limits = cfg.server_limits() | {"bounds": StepBounds(cfg.max_observation, cfg.max_reward, cfg.sanitize)}
        server, local = self._servers = [LearnerServer(self.sessions, cfg.listen, token=self.token, **limits,
                                                       tls=(cfg.tls_cert, cfg.tls_key) if cfg.tls_cert else None),
                                         shm.LocalServer(self.sessions, **limits)]  # actors on this host
        try:  # local.start(): None (and a warning) where this host has no unix sockets
            self.port, self.local_address = await server.start(), await local.start()
        except Exception as err:
            self.error = err
            self._ready.set()
            raise
        log.info("learner listening on port %d and %s, waiting for %d member(s) (actors x splits); sync %s",
                 self.port, self.local_address or "no unix socket", self.config.min_actors, self.strategy.name)
        self._ready.set()
        trainer.start()
        watchdog = asyncio.create_task(self.sessions.watchdog(self.config.sync))
        try:
            await asyncio.to_thread(self._stop.wait)  # no poll; stop() may come from any thread, or come first
        finally:
            self._stop.set()  # (if cancelled: the waiting thread ends too)
            for task in (guests := {watchdog, *self._guests}):  # before the sessions finish
                task.cancel()
            await asyncio.gather(*guests, return_exceptions=True)
            self.sessions.finish()
            await asyncio.gather(server.stop(grace=2.0), local.stop(grace=2.0))

    # -- training ---------------------------------------------------------------------

    def _train_loop(self) -> None:
        item, trained = None, self.trainer.samples_trained
        try:
            while (item := self.phases.next()) is not None and not self.sessions.finished:
                if self._train_one(item):
                    self.clock.stop()  # training time, without shutdown and the final checkpoint
                    return self._stop.set()
                trained = self.trainer.samples_trained
        except BaseException as err:
            self.sessions.fail(err, "training")  # logged there; the actors are told so
        if item is not None and item.batch is not None and self.trainer.samples_trained == trained:
            self.report.counters.dropped_transitions += item.batch.size  # stopped from outside, or failed: untrained

    def _train_one(self, item: TrainingPhase) -> bool:
        """Train one closed phase, record it, publish the next version; True when the run is done."""
        trainer = self.trainer
        if item.phase != trainer.version:
            raise RuntimeError(f"phase {item.phase} arrived for training at version {trainer.version}")
        stats = None
        if item.batch is None and self.ranks is None:  # every actor left the phase before completing it
            log.info("phase %d closed empty; publishing version %d unchanged", trainer.version, trainer.version + 1)
            trainer.skip()
        else:  # (several learners: an empty phase still takes part in the update, with no samples)
            batch = item.batch
            stats = self.backend.train(lambda: trainer.train_empty() if batch is None else trainer.train(batch))
            self.report.trained(stats)
            if self.audit is not None and item.batch is not None:
                self.audit.batch(trainer.iteration, item.phase, self.strategy, item.batch)
        if StallRule.of(self.config.sync).stalled(item.collect_s, item.recent_s):  # the rule the watchdog warns by
            self.report.counters.stalls += 1
        self.report.observe(self.backend.stats())
        if stats is not None:  # the row first: a checkpoint never claims an iteration metrics.csv lacks
            self.report.row(stats, item.collect_s, len(self.sessions.actor_ids))
        done, checkpoint_due = self._decide()
        if checkpoint_due:
            self.checkpointer.save_periodic(self._checkpoint_state(), trainer.iteration)
        if not done:
            self.backend.publish()
            self.sessions.publish(trainer.version)
        return done

    def _decide(self) -> tuple[bool, bool]:
        """(done: budget, time, target or stop(); a checkpoint is due): several learners agree (distributed.py)."""
        run = self.config.run
        self._completed = (self.trainer.env_steps >= self.config.ppo.total_steps
                           or (run.time_limit_s is not None and self.clock.wall_s >= run.time_limit_s)
                           or (run.stop_at_return is not None and self.episodes.reached(run.stop_at_return)))
        done, due = self._asked or self._completed, self.checkpointer.due(self.trainer.iteration)
        return (done, due) if self.ranks is None else self.ranks.agree(done, due)

    # -- checkpoints and the end of a run ----------------------------------------------

    def _checkpoint_state(self) -> dict:
        """Everything a resumed run continues from. Taken between iterations, on the trainer thread."""
        return self.report.checkpoint_state(self.sessions.slot_counters, dataclasses.asdict(self.config))

    def _write_final(self) -> dict[str, Any]:
        self.report.counters.dropped_transitions += self.phases.discard()  # collected, never to be trained
        self.report.observe(self.backend.stats())
        # No final.pt after a failure: an update it broke off may have stepped the model partly (reliability.md)
        final = None if self.error else self.checkpointer.save_final(self._checkpoint_state())
        return self.report.summary(
            env=self.config.env.id, seed=self.config.run.seed, sync=self.strategy.name, completed=self._completed,
            time_limited=self.trainer.env_steps < self.config.ppo.total_steps and self.error is None,
            codec_s=sum(server.codec_s for server in self._servers), releases=self.sessions.releases.summary(),
            checkpoint=final and str(final.relative_to(self.run_dir)), device=str(self.device),
            resumed_from=self.resumed_from and str(self.resumed_from.relative_to(self.run_dir)),
            error=self.error and repr(self.error), ranks=self.ranks and self.ranks.describe(),
        )
