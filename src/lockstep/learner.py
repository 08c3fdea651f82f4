"""The learner: the one place that wires transport, gate, inference, rollout store and trainer together.

Threads
    event loop   gRPC server, actor sessions, the gate's admissions, the batcher's
                 forward passes. Held requests are awaited futures here.
    trainer      trains closed phases in order and publishes the next version.
    inference    reference strategies only: a small pool that runs their
                 per-request forward passes (and their spin loops) off the loop.

With snapshot strategies (strict, pipelined) publishing version v+1 is: swap the
snapshot reference, then ``gate.publish(v+1)``, so every request admitted for
v+1 is served by snapshot v+1. Reference strategies instead guard one model that
the trainer updates in place (see ``sync/reference.py``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import random
import resource
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import torch

from lockstep import checkpoint, noise, sync
from lockstep.actor import action_dtype
from lockstep.audit import AuditWriter
from lockstep.config import Config, save as save_config
from lockstep.envs import EnvSpec, env_spec
from lockstep.inference import Batcher, InferenceResult, PolicySnapshot
from lockstep.metrics import EpisodeTracker, MetricsWriter, write_summary
from lockstep.rollout import Batch, Unroll, assemble
from lockstep.sync import Admission, ClosedPhase
from lockstep.trainer import Trainer
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport import security
from lockstep.transport.messages import HelloInfo, StepData
from lockstep.transport.server import HandshakeError, LearnerServer, Reply

log = logging.getLogger("lockstep.learner")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"--device {name} was asked for, but torch sees no CUDA device; use --device auto or cpu")
    return torch.device(name)


@dataclass
class Status:
    """What the progress display shows."""

    iteration: int = 0
    policy_version: int = 0
    env_steps: int = 0
    sps: float = 0.0
    episode_return_mean: float = math.nan
    episodes: int = 0
    actors: int = 0
    started: bool = False
    finished: bool = False


@dataclass
class Counters:
    """Totals over the run (summary.json); metrics.csv has each iteration's increase."""

    wasted_forward_passes: int = 0
    rejected_rpcs: int = 0
    torn_reads: int = 0  # forward passes that read parameters mid-update, used or thrown away
    torn_reads_used: int = 0  # ... of which the result was sent to an actor
    stalls: int = 0
    dropped_transitions: int = 0  # collected, then discarded: unfinished unrolls of actors that left
    off_policy_samples: int = 0
    transitions_collected: int = 0  # every action recorded; = trained + dropped at the end of a run


class Jitter:
    """Random delays up to ``max_ms`` (adversarial testing); free when ``max_ms`` is 0."""

    def __init__(self, max_ms: float, seed: int) -> None:
        self.max_s = max_ms / 1000.0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def seconds(self) -> float:
        if not self.max_s:
            return 0.0
        with self._lock:
            return self._rng.uniform(0.0, self.max_s)

    def __call__(self) -> None:
        delay = self.seconds()
        if delay:
            time.sleep(delay)


class ParameterStamps:
    """Detects torn reads of parameters that the optimizer updates in place.

    The optimizer's pre- and post-step hooks advance a sequence number (odd while
    it writes). Every parameter is written by each step, so a forward pass during
    which the number was odd or changed read parameters of two versions.
    """

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.sequence = 0
        optimizer.register_step_pre_hook(self._advance)
        optimizer.register_step_post_hook(self._advance)

    def _advance(self, *_: Any) -> None:
        self.sequence += 1

    def torn(self, before: int, after: int) -> bool:
        return bool(before & 1) or before != after


class Learner:
    def __init__(self, config: Config, run_dir: Path, token: str | None = None, resume: bool = False) -> None:
        config.validate()
        security.check_listen(config.learner.listen, token)
        if bool(config.learner.tls_cert) != bool(config.learner.tls_key):
            raise security.SecurityError("TLS needs both --tls-cert and --tls-key")
        self.token = token  # never written to the run directory
        self.config = config
        self.run_dir = run_dir
        self.spec: EnvSpec = env_spec(config.env.id)
        self.device = resolve_device(config.learner.device)
        torch.set_num_threads(config.learner.torch_threads)
        self.strategy = sync.strategy(config.sync.strategy, config.sync.max_lag)
        self.jitter = Jitter(config.sync.jitter_ms, config.run.seed)
        self.trainer = Trainer(config, self.spec, self.device, max_lag=self.strategy.max_lag)
        self.counters = Counters()
        self.episodes = EpisodeTracker(config.run.thresholds)
        self._slot_counters: dict[int, int] = {}  # actor id -> steps taken, the noise counter of its slots
        self._wall_offset = 0.0  # wall seconds of the run before a resume
        self._collected_steps = 0
        self.resumed_from: Path | None = self._restore() if resume else None
        self.gate = self.strategy.gate(config.ppo.steps_per_env, config.min_actors,
                                       start_version=self.trainer.version, cutoff=config.sync.phase_cutoff,
                                       min_unroll=config.sync.min_unroll)
        self.reference = self.strategy.reference(pause=self.jitter)
        self.audit = AuditWriter(run_dir / "audit", config, fresh=not resume) if config.run.audit else None
        if self.reference is None:
            self._snapshot: PolicySnapshot = self._new_snapshot()
            self.batcher = Batcher(lambda: self._snapshot, config.learner.max_batch,
                                   config.learner.max_wait_ms / 1000.0, self._expected_requests)
        else:
            self.stamps = ParameterStamps(self.trainer.optimizer)
            self._pool = ThreadPoolExecutor(config.sync.inference_threads, thread_name_prefix="lockstep-infer")
            self.batcher = None
            self._forward_passes = self._rows_inferred = 0
            self._write_audit_policy()
        self.status = Status()
        self.port: int | None = None
        self.error: BaseException | None = None
        self.finished = False
        self._sessions: dict[int, _Session] = {}
        self._retired_runs: set[str] = set()  # run ids of streams that ended: a replayed hello is refused
        self._completed: dict[int, dict[int, Unroll]] = {}  # phase -> member -> complete unroll
        self._waiters: set[asyncio.Future] = set()
        # Closed phases, oldest first. Bounded by construction: the gate lets at most
        # max_lag + 1 phases close ahead of training (reference strategies: unbounded).
        self._phases: queue.Queue = queue.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._t0: float | None = None
        self._last_close = 0.0
        self._last_checkpoint = time.monotonic()
        self._last_passes = self._last_rows = 0
        self._last_counters: dict[str, int] = {}
        self._training_s = 0.0
        self._inference_s = 0.0
        self._final_wall_s: float | None = None
        self._server: LearnerServer | None = None
        self._cpu0 = time.process_time()

    # -- running --------------------------------------------------------------------

    def serve(self) -> dict[str, Any]:
        """Run until the step budget is spent (or ``stop()``); return the summary."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(self.config, self.run_dir / "config.yaml")
        self.metrics = MetricsWriter(self.run_dir,
                                     resume_after=self.trainer.iteration if self.resumed_from else None)
        if self.reference is not None:
            log.warning("sync strategy %s is a reference design kept for comparison: it does not keep PPO "
                        "on-policy and can read half-updated parameters; use strict or pipelined to train",
                        self.strategy.name)
        trainer = threading.Thread(target=self._train_loop, name="lockstep-trainer", daemon=True)
        try:
            asyncio.run(self._serve(trainer))
        finally:
            self._phases.put(None)
            if trainer.is_alive():
                trainer.join()
            if self.reference is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
            self.metrics.close()
        summary = self._write_final()
        if self.error is not None:
            raise self.error
        return summary

    def wait_ready(self, timeout: float | None = None) -> int:
        """Block until the server listens; return its port."""
        if not self._ready.wait(timeout):
            raise TimeoutError("the learner did not start listening in time")
        if self.port is None:
            raise RuntimeError(f"the learner failed to start: {self.error}")
        return self.port

    def stop(self) -> None:
        """Ask a running learner to finish (thread-safe)."""
        loop = self._loop
        if loop is not None and self._stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._stop.set)
            except RuntimeError:  # the loop closed in the meantime: nothing left to stop
                pass

    async def _serve(self, trainer: threading.Thread) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        cfg = self.config.learner
        server = self._server = LearnerServer(self, cfg.listen, token=self.token,
                               tls=(cfg.tls_cert, cfg.tls_key) if cfg.tls_cert else None,
                               max_message_bytes=cfg.max_message_mb * 1024 * 1024, sanitize=cfg.sanitize)
        try:
            self.port = await server.start()
        except Exception as err:
            self.error = err
            self._ready.set()
            raise
        log.info("learner listening on port %d, waiting for %d actor(s); sync %s",
                 self.port, self.config.min_actors, self.strategy.name)
        self._ready.set()
        trainer.start()
        watchdog = asyncio.create_task(self._watchdog())
        try:
            await self._stop.wait()
        finally:
            watchdog.cancel()
            self._finish()
            await server.stop(grace=2.0)

    def _finish(self) -> None:
        """On the loop: end every stream. Held requests are answered with 'training is over'."""
        self.finished = True
        self.status.finished = True
        for future in list(self._waiters):
            if not future.done():
                future.set_result(None)

    async def _watchdog(self) -> None:
        """Log, once per phase, which actors a phase waits for when it collects too long."""
        stall_s = self.config.sync.stall_s
        warned_phase = -1
        while True:
            await asyncio.sleep(min(1.0, stall_s / 2))
            if self._t0 is None:
                continue
            phase = self.gate.oldest_open
            if time.perf_counter() - self._last_close > stall_s and warned_phase != phase:
                warned_phase = phase
                waiting = ", ".join(f"actor {m} ({self._sessions[m].num_envs} slots)"
                                    for m in self.gate.waiting_for() if m in self._sessions)
                log.warning("phase %d has collected for more than %.0f s; waiting for %s",
                            phase, stall_s, waiting or "actors to connect")

    # -- actor handshake (transport.server.ActorHandler) --------------------------------

    def connect(self, hello: HelloInfo) -> tuple["_Session", pb.Welcome]:
        problems = []
        for what, ours, theirs in (("observation space", self.spec.observation, hello.observation),
                                   ("action space", self.spec.action, hello.action)):
            diff = ours.mismatch(theirs)
            if diff:
                problems.append(f"{what} {diff} for {self.config.env.id}")
        if problems:
            raise HandshakeError(grpc.StatusCode.INVALID_ARGUMENT,
                                 f"actor {hello.actor_id} ({hello.env_id}): " + "; ".join(problems))
        if hello.num_envs < 1:
            raise HandshakeError(grpc.StatusCode.INVALID_ARGUMENT, f"actor {hello.actor_id}: num_envs must be >= 1")
        if hello.run_id in self._retired_runs:
            raise HandshakeError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"actor {hello.actor_id}: run id {hello.run_id} has ended and cannot rejoin; "
                                 "a restarted actor says hello with a new run id")
        if hello.actor_id in self._sessions:
            raise HandshakeError(grpc.StatusCode.ALREADY_EXISTS,
                                 f"actor id {hello.actor_id} is already connected; give each actor a distinct --actor-id")
        if self.finished:
            raise HandshakeError(grpc.StatusCode.UNAVAILABLE, "training is over")
        session = _Session(self, hello)
        self._sessions[hello.actor_id] = session
        self.gate.join(hello.actor_id, weight=hello.num_envs)
        self.status.actors = len(self._sessions)
        if self._t0 is None and self.gate.started:
            self._t0 = self._last_close = time.perf_counter()
            self.status.started = True
        log.info("actor %d joined with %d env(s) (run %s)", hello.actor_id, hello.num_envs, hello.run_id[:8])
        return session, pb.Welcome(seed=self.config.run.seed, learner_run=self.run_dir.name)

    def _disconnect(self, session: "_Session") -> None:
        if self._sessions.get(session.member) is not session:
            return
        del self._sessions[session.member]
        self._retired_runs.add(session.run_id)
        self.status.actors = len(self._sessions)
        _, closed = self.gate.leave(session.member)
        dropped = session.drop_unfinished()
        self._phases_closed(closed)
        if not self.finished:
            log.info("actor %d left; %d transition(s) of its unfinished unroll dropped", session.member, dropped)

    def _expected_requests(self) -> int:
        return max(1, len(self._sessions) - self.gate.held_count())

    @property
    def wall_s(self) -> float:
        """Seconds of training in this run, across resumes."""
        return self._wall_offset + (0.0 if self._t0 is None else time.perf_counter() - self._t0)

    # -- inference ------------------------------------------------------------------------

    def _new_snapshot(self) -> PolicySnapshot:
        snapshot = self.trainer.snapshot()
        if self.audit is not None:
            self.audit.policy(snapshot.version, snapshot.model.state_dict(), snapshot.obs_mean, snapshot.obs_var)
        return snapshot

    def _write_audit_policy(self) -> None:
        if self.audit is not None:
            rms = self.trainer.obs_rms
            self.audit.policy(self.trainer.version, self.trainer.model.state_dict(),
                              None if rms is None else rms.mean, None if rms is None else rms.var)

    async def _infer(self, member: int, obs: np.ndarray, keys: np.ndarray,
                     counters: np.ndarray) -> InferenceResult | None:
        delay = self.jitter.seconds()
        if delay:
            await asyncio.sleep(delay)
        if self.reference is None:
            return await self.batcher.infer(obs, keys, counters)
        return await self._loop.run_in_executor(self._pool, self._infer_in_place, member, obs, keys, counters)

    def _infer_in_place(self, member: int, obs: np.ndarray, keys: np.ndarray,
                        counters: np.ndarray) -> InferenceResult | None:
        """Reference strategies: one forward pass on the live model, guarded by the strategy."""
        trainer = self.trainer

        def forward() -> InferenceResult:
            start = time.perf_counter()
            version, before = trainer.version, self.stamps.sequence
            with torch.no_grad():
                x = trainer.normalizer()(torch.as_tensor(np.array(obs), device=self.device))
                u = torch.as_tensor(noise.uniform(keys, counters, trainer.model.noise_width),
                                    dtype=torch.float32, device=self.device)
                action, logprob, value = trainer.model.sample(x, u.clamp_(1e-12, 1 - 1e-7), between=self.jitter)
            result = InferenceResult(action.cpu().numpy(), logprob.cpu().numpy(), value.cpu().numpy(), version)
            result.torn = self.stamps.torn(before, self.stamps.sequence)
            if result.torn:
                self.counters.torn_reads += 1
            self._forward_passes += 1
            self._rows_inferred += len(obs)
            self._inference_s += time.perf_counter() - start
            return result

        result = self.reference.infer(member, forward)
        if result is not None and result.torn:
            self.counters.torn_reads_used += 1
        return result

    # -- phases ---------------------------------------------------------------------------

    def _unroll_completed(self, phase: int, unroll: Unroll) -> None:
        self._completed.setdefault(phase, {})[unroll.member] = unroll

    def _phases_closed(self, closed: tuple[ClosedPhase, ...]) -> None:
        now = time.perf_counter()
        for phase in closed:
            unrolls = self._completed.pop(phase.phase, {})
            batch = assemble(phase.phase, [unrolls[m] for m in phase.members]) if phase.members else None
            self._phases.put((phase.phase, batch, now - self._last_close))
            self._last_close = now

    def _train_loop(self) -> None:
        try:
            while True:
                item = self._phases.get()
                if item is None or self.finished:
                    return
                phase, batch, collect_s = item
                if phase != self.trainer.version:
                    raise RuntimeError(f"phase {phase} arrived for training at version {self.trainer.version}")
                self.jitter()
                stats = self._train(batch)
                if collect_s > self.config.sync.stall_s:
                    self.counters.stalls += 1
                if self.audit is not None and batch is not None:
                    self.audit.batch(self.trainer.iteration, phase, self.strategy.name, batch)
                self._save_periodic_checkpoint()
                done = self._done()
                if not done:
                    if self.reference is None:
                        self._snapshot = self._new_snapshot()
                    else:
                        self._write_audit_policy()
                    self.jitter()
                    self.gate.publish(self.trainer.version)
                if stats is not None:
                    self._log_iteration(stats, collect_s)
                if done:
                    self._final_wall_s = self.wall_s  # training time, without shutdown and the final checkpoint
                    self._loop.call_soon_threadsafe(self._stop.set)
                    return
        except BaseException as err:  # noqa: BLE001 - any trainer failure must stop the learner, not hang it
            log.exception("training failed")
            self.error = err
            self._loop.call_soon_threadsafe(self._stop.set)

    def _train(self, batch: Batch | None):
        if batch is None:  # every actor left the phase before completing it: nothing to train
            log.info("phase %d closed empty; publishing version %d unchanged", self.trainer.version,
                     self.trainer.version + 1)
            self.trainer.skip()
            return None
        if self.config.run.collect_only:
            stats = self.trainer.count_only(batch)
        elif self.reference is None:
            stats = self.trainer.train(batch)
        else:
            stats = self.reference.train(lambda: self.trainer.train(batch))
        self.counters.off_policy_samples += stats.off_policy_samples
        self._training_s += stats.train_s
        return stats

    def _done(self) -> bool:
        if self.trainer.env_steps >= self.config.ppo.total_steps:
            return True
        limit = self.config.run.time_limit_s
        if limit is not None and self.wall_s >= limit:
            return True
        target = self.config.run.stop_at_return
        return target is not None and self.episodes.stats()["episode_return_mean20"] >= target

    def _save_periodic_checkpoint(self) -> None:
        run = self.config.run
        by_count = run.checkpoint_every and self.trainer.iteration % run.checkpoint_every == 0
        by_time = run.checkpoint_minutes and time.monotonic() - self._last_checkpoint >= 60 * run.checkpoint_minutes
        if by_count or by_time:
            directory = self.run_dir / "checkpoints"
            checkpoint.save(self._checkpoint_state(), checkpoint.periodic_path(directory, self.trainer.iteration))
            checkpoint.prune(directory, run.keep_checkpoints)
            self._last_checkpoint = time.monotonic()

    def _checkpoint_state(self) -> dict:
        """Everything a resumed run continues from. Taken between iterations, on the trainer thread."""
        return {
            "trainer": self.trainer.state_dict(),
            "episodes": self.episodes.state_dict(),
            "counters": self._sync_counters(),
            "collected_steps": self._collected_steps,
            "slot_counters": dict(self._slot_counters),
            "wall_s": self.wall_s,
            "config": self.config,
        }

    def _restore(self) -> Path:
        found = checkpoint.newest(self.run_dir / "checkpoints")
        if found is None:
            raise FileNotFoundError(f"nothing to resume: no checkpoint in {self.run_dir / 'checkpoints'}")
        path, state = found
        self.trainer.load_state_dict(state["trainer"])
        self.episodes.load_state_dict(state["episodes"])
        for key, value in state["counters"].items():
            setattr(self.counters, key, value)
        self._collected_steps = state["collected_steps"]
        self._slot_counters = dict(state["slot_counters"])
        self._wall_offset = state["wall_s"]
        log.info("resuming from %s: iteration %d, version %d, %d env steps",
                 path, self.trainer.iteration, self.trainer.version, self.trainer.env_steps)
        return path

    def _inference_totals(self) -> tuple[int, int]:
        if self.batcher is not None:
            return self.batcher.forward_passes, self.batcher.rows_inferred
        return self._forward_passes, self._rows_inferred

    def _sync_counters(self) -> dict[str, int]:
        c = self.counters
        if self.reference is not None:
            c.wasted_forward_passes = self.reference.wasted_forward_passes
            c.rejected_rpcs = self.reference.rejected_rpcs
        return dict(vars(c))

    def _counter_increase(self) -> dict[str, int]:
        totals = self._sync_counters()
        increase = {k: v - self._last_counters.get(k, 0) for k, v in totals.items()}
        self._last_counters = totals
        return increase

    def _discard_untrained(self) -> None:
        """At the end of a run: collected transitions that will never be trained count as dropped."""
        for unrolls in self._completed.values():
            for unroll in unrolls.values():
                self.counters.dropped_transitions += unroll.steps_acted * unroll.obs.shape[1]
        self._completed.clear()
        while True:
            try:
                item = self._phases.get_nowait()
            except queue.Empty:
                break
            if item is not None and item[1] is not None:
                self.counters.dropped_transitions += item[1].size
    def _log_iteration(self, stats, collect_s: float) -> None:
        ep = self.episodes.stats()
        wall = self.wall_s
        passes, rows = self._inference_totals()
        inferred_passes, inferred_rows = passes - self._last_passes, rows - self._last_rows
        self._last_passes, self._last_rows = passes, rows
        row = {
            "iteration": self.trainer.iteration,
            "policy_version": stats.version,
            "env_steps": self.trainer.env_steps,
            "wall_s": wall,
            "sps": self.trainer.env_steps / wall if wall > 0 else 0.0,
            **ep,
            **self._counter_increase(),
            "off_policy_samples": stats.off_policy_samples,
            "policy_lag_mean": stats.policy_lag_mean,
            "policy_lag_max": stats.policy_lag_max,
            "inference_batch_mean": inferred_rows / inferred_passes if inferred_passes else math.nan,
            "collect_s": collect_s,
            "train_s": stats.train_s,
            "actors": len(self._sessions),
            "lr": stats.lr,
            "policy_loss": stats.update.policy_loss,
            "value_loss": stats.update.value_loss,
            "entropy": stats.update.entropy,
            "approx_kl": stats.update.approx_kl,
            "clip_fraction": stats.update.clip_fraction,
        }
        self.metrics.write(row)
        self.status = Status(
            iteration=self.trainer.iteration, policy_version=self.trainer.version, env_steps=self.trainer.env_steps,
            sps=row["sps"], episode_return_mean=ep["episode_return_mean20"], episodes=ep["episodes"],
            actors=len(self._sessions), started=True, finished=self.status.finished,
        )

    def _time_split(self) -> dict[str, float]:
        """Where the learner's wall time went: a cheap in-process account, not a profile.

        inference: forward passes (batcher or in-place); serialization: decoding steps and
        encoding actions; training: PPO updates; other: the rest of the wall time (gRPC, the
        gate, bookkeeping, waiting for actors). In pipelined mode training overlaps the others
        on its own thread, so the parts can add up to more than the wall time (other is then 0).
        """
        inference = self.batcher.busy_s if self.batcher is not None else self._inference_s
        codec = self._server.codec_s if self._server is not None else 0.0
        wall = (self._final_wall_s if self._final_wall_s is not None else self.wall_s) - self._wall_offset
        split = {"inference": inference, "serialization": codec, "training": self._training_s}
        split["other"] = max(0.0, wall - sum(split.values()))
        return {k: round(v, 3) for k, v in split.items()}

    def _write_final(self) -> dict[str, Any]:
        self._discard_untrained()
        final = self.run_dir / "checkpoints" / "final.pt"
        checkpoint.save(self._checkpoint_state(), final)
        ep = self.episodes.stats()
        passes, rows = self._inference_totals()
        wall = self._final_wall_s if self._final_wall_s is not None else self.wall_s
        summary = {
            "env": self.config.env.id,
            "seed": self.config.run.seed,
            "sync": self.strategy.name,
            "iterations": self.trainer.iteration,
            "policy_version": self.trainer.version,
            "env_steps": self.trainer.env_steps,
            "wall_s": round(wall, 3),
            "time_limited": self.trainer.env_steps < self.config.ppo.total_steps and self.error is None,
            "sps": round(self.trainer.env_steps / wall, 1) if wall > 0 else 0.0,
            "learner_cpu_s": round(time.process_time() - self._cpu0, 3),
            "episodes": ep["episodes"],
            "episode_return_mean": None if math.isnan(ep["episode_return_mean"]) else ep["episode_return_mean"],
            "first_reached": self.episodes.first_reached,
            **self._sync_counters(),
            "transitions_trained": self.trainer.env_steps,
            "policy_lag_mean": self.trainer.lag_sum / self.trainer.env_steps if self.trainer.env_steps else 0.0,
            "policy_lag_max": self.trainer.lag_max,
            "forward_passes": passes,
            "inference_batch_mean": rows / passes if passes else None,
            "learner_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "time_split_s": self._time_split(),
            "checkpoint": str(final.relative_to(self.run_dir)),
            "resumed_from": None if self.resumed_from is None else str(self.resumed_from.relative_to(self.run_dir)),
            "device": str(self.device),
            "error": None if self.error is None else repr(self.error),
        }
        write_summary(self.run_dir / "summary.json", summary)
        return summary


class _Session:
    """One actor's stream: records what its envs did and asks the gate and inference for actions."""

    def __init__(self, learner: Learner, hello: HelloInfo) -> None:
        self.learner = learner
        self.member = hello.actor_id
        self.run_id = hello.run_id
        self.num_envs = hello.num_envs
        self.keys = noise.slot_keys(learner.config.run.seed, hello.actor_id, hello.num_envs)
        self.counter = learner._slot_counters.get(hello.actor_id, 0)  # continues across reconnects and resumes
        self.first_counter = self.counter
        self.unroll: Unroll | None = None
        self.last_step: int | None = None  # step of the unroll the last action was recorded at
        self.pending: tuple[Admission, np.ndarray] | None = None  # admitted, not yet answered (a retry)
        spec = learner.spec
        self._shapes = (spec.observation.shape, np.dtype(spec.observation.dtype),
                        spec.action.shape, action_dtype(spec.action))
        self._closed = False

    async def step(self, data: StepData) -> Reply | None:
        learner = self.learner
        if learner.finished:
            return None
        if self.pending is None:
            admission = await self._admit(data)
            if admission is None:
                return None
            counters = np.full(self.num_envs, self.counter, np.uint64)
            self.counter += 1
            learner._slot_counters[self.member] = self.counter
            self.pending = (admission, counters)
        admission, counters = self.pending
        out = await learner._infer(self.member, data.obs, self.keys, counters)
        if out is None:  # a reference strategy answered "no action": the actor sends this step again
            return Reply(None, learner.trainer.version)
        self.pending = None
        if admission.step == 0:
            self.unroll = Unroll(self.member, self.num_envs, learner.config.ppo.steps_per_env, *self._shapes)
        self.unroll.record_action(admission.step, data.obs, out.actions, out.logprobs, out.values, out.version)
        learner.counters.transitions_collected += self.num_envs
        self.last_step = admission.step
        return Reply(out.actions, out.version)

    async def _admit(self, data: StepData) -> Admission | None:
        """Record the outcome of the previous action, then ask the gate (waiting while held)."""
        learner = self.learner
        if self.last_step is not None:
            self.unroll.record_outcome(self.last_step, data.reward, data.terminated, data.truncated,
                                       data.final_index, data.final_obs)
        if self.counter > self.first_counter:
            learner._collected_steps += self.num_envs
        learner.episodes.add(data.episode_return, data.episode_length, learner._collected_steps, learner.wall_s)

        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def release(admission: Admission) -> None:
            loop.call_soon_threadsafe(_resolve, future, admission)

        result = learner.gate.request(self.member, release)
        if result.completed is not None:
            self.unroll.finish(data.obs)
            learner._unroll_completed(result.completed, self.unroll)
            self.unroll, self.last_step = None, None
        learner._phases_closed(result.closed)
        if result.admission is not None:
            return result.admission
        learner._waiters.add(future)
        try:
            return await future
        finally:
            learner._waiters.discard(future)

    def drop_unfinished(self) -> int:
        """Discard the unroll this actor had not finished; return the transitions dropped."""
        dropped = 0 if self.unroll is None else self.unroll.steps_acted * self.num_envs
        self.learner.counters.dropped_transitions += dropped
        self.unroll, self.last_step = None, None
        return dropped

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.learner._disconnect(self)


def _resolve(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)
