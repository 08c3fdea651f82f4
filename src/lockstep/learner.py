"""The learner: the one place that wires transport, gate, batcher, rollout store and trainer together.

Threads
    event loop   gRPC server, actor sessions, the gate's admissions, the batcher's
                 forward passes. Held requests are awaited futures here.
    trainer      takes closed phases from a queue (capacity 1: strict mode never
                 has more than one), trains, and publishes the next version.

Publishing version v+1 is: swap the snapshot reference, then ``gate.publish``,
so every request released into phase v+1 is served by snapshot v+1.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import torch

from lockstep import checkpoint, noise
from lockstep.actor import action_dtype
from lockstep.config import Config, save as save_config
from lockstep.envs import EnvSpec, env_spec
from lockstep.inference import Batcher, PolicySnapshot
from lockstep.metrics import EpisodeTracker, MetricsWriter, write_summary
from lockstep.rollout import Unroll, assemble
from lockstep.sync import Admission, ClosedPhase, StrictGate
from lockstep.trainer import Trainer
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.messages import HelloInfo, StepData
from lockstep.transport.server import HandshakeError, LearnerServer

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


class Learner:
    def __init__(self, config: Config, run_dir: Path) -> None:
        config.validate()
        self.config = config
        self.run_dir = run_dir
        self.spec: EnvSpec = env_spec(config.env.id)
        self.device = resolve_device(config.learner.device)
        torch.set_num_threads(config.learner.torch_threads)
        self.trainer = Trainer(config, self.spec, self.device)
        self._snapshot: PolicySnapshot = self.trainer.snapshot()
        self.gate = StrictGate(config.ppo.steps_per_env, config.min_actors)
        self.batcher = Batcher(lambda: self._snapshot, config.learner.max_batch,
                               config.learner.max_wait_ms / 1000.0, self._expected_requests)
        self.episodes = EpisodeTracker(config.run.thresholds)
        self.status = Status()
        self.port: int | None = None
        self.error: BaseException | None = None
        self._sessions: dict[int, _Session] = {}
        self._completed: dict[int, dict[int, Unroll]] = {}  # version -> member -> complete unroll
        self._waiters: set[asyncio.Future] = set()
        self._phases: queue.Queue = queue.Queue(maxsize=1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self.finished = False
        self._t0: float | None = None
        self._phase_started = 0.0
        self._collected_steps = 0
        self._dropped = 0
        self._last_passes = self._last_rows = 0

    # -- running --------------------------------------------------------------------

    def serve(self) -> dict[str, Any]:
        """Run until the step budget is spent (or ``stop()``); return the summary."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(self.config, self.run_dir / "config.yaml")
        self.metrics = MetricsWriter(self.run_dir)
        trainer = threading.Thread(target=self._train_loop, name="lockstep-trainer", daemon=True)
        try:
            asyncio.run(self._serve(trainer))
        finally:
            self._wake_trainer()
            if trainer.is_alive():
                trainer.join()
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
        server = LearnerServer(self, self.config.learner.listen)
        try:
            self.port = await server.start()
        except Exception as err:
            self.error = err
            self._ready.set()
            raise
        log.info("learner listening on port %d, waiting for %d actor(s)", self.port, self.config.min_actors)
        self._ready.set()
        trainer.start()
        try:
            await self._stop.wait()
        finally:
            self._finish()
            await server.stop(grace=2.0)

    def _finish(self) -> None:
        """On the loop: end every stream. Held requests are answered with 'training is over'."""
        self.finished = True
        self.status.finished = True
        for future in list(self._waiters):
            if not future.done():
                future.set_result(None)

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
        if hello.actor_id in self._sessions:
            raise HandshakeError(grpc.StatusCode.ALREADY_EXISTS,
                                 f"actor id {hello.actor_id} is already connected; give each actor a distinct --actor-id")
        if self.finished:
            raise HandshakeError(grpc.StatusCode.UNAVAILABLE, "training is over")
        session = _Session(self, hello)
        self._sessions[hello.actor_id] = session
        self.gate.join(hello.actor_id)
        self.status.actors = len(self._sessions)
        if self._t0 is None and self.gate.version is not None:
            self._t0 = self._phase_started = time.perf_counter()
            self.status.started = True
        log.info("actor %d joined with %d env(s) (run %s)", hello.actor_id, hello.num_envs, hello.run_id[:8])
        return session, pb.Welcome(seed=self.config.run.seed, learner_run=self.run_dir.name)

    def _disconnect(self, session: "_Session") -> None:
        if self._sessions.get(session.member) is not session:
            return
        del self._sessions[session.member]
        self.status.actors = len(self._sessions)
        dropped, closed = self.gate.leave(session.member)
        self._dropped += dropped * session.num_envs
        if closed is not None:
            self._phase_closed(closed)
        if not self.finished:
            log.info("actor %d left; %d transition(s) of its unfinished unroll dropped",
                     session.member, dropped * session.num_envs)

    def _expected_requests(self) -> int:
        return max(1, len(self._sessions) - self.gate.held_count())

    @property
    def wall_s(self) -> float:
        return 0.0 if self._t0 is None else time.perf_counter() - self._t0

    # -- phases ---------------------------------------------------------------------------

    def _unroll_completed(self, version: int, unroll: Unroll) -> None:
        self._completed.setdefault(version, {})[unroll.member] = unroll

    def _phase_closed(self, closed: ClosedPhase) -> None:
        unrolls = self._completed.pop(closed.version)
        batch = assemble(closed.version, [unrolls[m] for m in closed.members])
        self._phases.put_nowait((batch, time.perf_counter() - self._phase_started))

    def _train_loop(self) -> None:
        try:
            while True:
                item = self._phases.get()
                if item is None or self.finished:
                    return
                batch, collect_s = item
                dropped, self._dropped = self._dropped, 0
                stats = self.trainer.train(batch)
                self._publish_checkpoint()
                done = self._done()
                if not done:
                    self._snapshot = self.trainer.snapshot()
                    self._phase_started = time.perf_counter()
                    self.gate.publish(self.trainer.version)
                self._log_iteration(stats, collect_s, dropped)
                if done:
                    self._loop.call_soon_threadsafe(self._stop.set)
                    return
        except BaseException as err:  # noqa: BLE001 - any trainer failure must stop the learner, not hang it
            log.exception("training failed")
            self.error = err
            self._loop.call_soon_threadsafe(self._stop.set)

    def _wake_trainer(self) -> None:
        """Make the trainer's next ``get`` return None, dropping a batch it will not train."""
        while True:
            try:
                self._phases.put_nowait(None)
                return
            except queue.Full:
                try:
                    self._phases.get_nowait()
                except queue.Empty:
                    pass

    def _done(self) -> bool:
        if self.trainer.env_steps >= self.config.ppo.total_steps:
            return True
        target = self.config.run.stop_at_return
        return target is not None and self.episodes.stats()["episode_return_mean20"] >= target

    def _publish_checkpoint(self) -> None:
        every = self.config.run.checkpoint_every
        if every and self.trainer.iteration % every == 0:
            checkpoint.save(self._checkpoint_state(), self.run_dir / "checkpoints" / f"iter_{self.trainer.iteration:06d}.pt")

    def _checkpoint_state(self) -> dict:
        return {"trainer": self.trainer.state_dict(), "config": self.config}

    def _log_iteration(self, stats, collect_s: float, dropped: int) -> None:
        ep = self.episodes.stats()
        wall = self.wall_s
        passes, rows = self.batcher.forward_passes, self.batcher.rows_inferred
        inferred_passes, inferred_rows = passes - self._last_passes, rows - self._last_rows
        self._last_passes, self._last_rows = passes, rows
        row = {
            "iteration": self.trainer.iteration,
            "policy_version": stats.version,
            "env_steps": self.trainer.env_steps,
            "wall_s": wall,
            "sps": self.trainer.env_steps / wall if wall > 0 else 0.0,
            **ep,
            "off_policy_samples": stats.off_policy_samples,
            "policy_lag_mean": stats.policy_lag_mean,
            "policy_lag_max": stats.policy_lag_max,
            "inference_batch_mean": inferred_rows / inferred_passes if inferred_passes else math.nan,
            "collect_s": collect_s,
            "train_s": stats.train_s,
            "dropped_transitions": dropped,
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

    def _write_final(self) -> dict[str, Any]:
        final = self.run_dir / "checkpoints" / "final.pt"
        checkpoint.save(self._checkpoint_state(), final)
        ep = self.episodes.stats()
        summary = {
            "env": self.config.env.id,
            "seed": self.config.run.seed,
            "iterations": self.trainer.iteration,
            "policy_version": self.trainer.version,
            "env_steps": self.trainer.env_steps,
            "wall_s": round(self.wall_s, 3),
            "sps": round(self.trainer.env_steps / self.wall_s, 1) if self.wall_s > 0 else 0.0,
            "episodes": ep["episodes"],
            "episode_return_mean": None if math.isnan(ep["episode_return_mean"]) else ep["episode_return_mean"],
            "first_reached": self.episodes.first_reached,
            "checkpoint": str(final.relative_to(self.run_dir)),
            "device": str(self.device),
            "error": None if self.error is None else repr(self.error),
        }
        write_summary(self.run_dir / "summary.json", summary)
        return summary


class _Session:
    """One actor's stream: records what its envs did and asks the gate and the batcher for actions."""

    def __init__(self, learner: Learner, hello: HelloInfo) -> None:
        self.learner = learner
        self.member = hello.actor_id
        self.num_envs = hello.num_envs
        self.keys = noise.slot_keys(learner.config.run.seed, hello.actor_id, hello.num_envs)
        self.counter = 0
        self.unroll: Unroll | None = None
        self.last_step: int | None = None  # step of the unroll the last action was recorded at
        spec = learner.spec
        self._shapes = (spec.observation.shape, np.dtype(spec.observation.dtype),
                        spec.action.shape, action_dtype(spec.action))
        self._closed = False

    async def step(self, data: StepData) -> tuple[np.ndarray, int] | None:
        learner = self.learner
        if learner.finished:
            return None
        if self.last_step is not None:
            self.unroll.record_outcome(self.last_step, data.reward, data.terminated, data.truncated,
                                       data.final_index, data.final_obs)
        if self.counter > 0:
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
        if result.closed is not None:
            learner._phase_closed(result.closed)
        admission = result.admission
        if admission is None:
            learner._waiters.add(future)
            try:
                admission = await future
            finally:
                learner._waiters.discard(future)
            if admission is None:
                return None
        if admission.step == 0:
            self.unroll = Unroll(self.member, self.num_envs, learner.config.ppo.steps_per_env, *self._shapes)
        counters = np.full(self.num_envs, self.counter, np.uint64)
        self.counter += 1
        out = await learner.batcher.infer(data.obs, self.keys, counters)
        self.unroll.record_action(admission.step, data.obs, out.actions, out.logprobs, out.values, out.version)
        self.last_step = admission.step
        return out.actions, out.version

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.learner._disconnect(self)


def _resolve(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)
