"""What a run reports: the metrics row of each iteration, the summary and the time split, from the counters
and clocks (``observe.counters``), the trainer's statistics and the backend's inference totals.

An evaluation while training (``learner/evaluation.py``) that finished since the previous row adds its
columns to the next one, and its figures to the progress status and the summary.

Counters are run totals (``summary.json``); each ``metrics.csv`` row holds their
increase over the iteration. Two step counts appear and are not the same:
``env_steps`` in the metrics and the summary counts transitions *trained on*;
``first_reached`` counts transitions *collected* (acted on and reported back) when
the episode that crossed the threshold ended, like a single-process loop's global step.
"""

from __future__ import annotations

import dataclasses
import math
import os
import resource
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lockstep.learner import team
from lockstep.learner.backends import InferenceStats
from lockstep.learner.evaluation import EvalResult, Evaluator
from lockstep.learner.trainer import Trainer, TrainStats
from lockstep.observe.counters import CARRIED, INCREASES, Clock, Counters
from lockstep.observe.metrics import (
    POLICY_COLUMNS,
    POLICY_COLUMNS_ADDED,
    POLICY_PREFIX,
    EpisodeTracker,
    MetricsWriter,
    lag_distribution,
    write_summary,
)
from lockstep.observe.progress import Status
from lockstep.observe.tracking import WandbRun

if TYPE_CHECKING:
    from lockstep.learner.opponents import OpponentPool


class Report:
    """Turns the trainer's, the backend's and the learner's counts into metrics rows and the summary."""

    def __init__(self, run_dir: Path, trainer: Trainer, episodes: EpisodeTracker, clock: Clock,
                 agents: int = 1, policies: tuple[str, ...] = ()) -> None:
        self.run_dir = run_dir
        self.trainer, self.episodes, self.clock = trainer, episodes, clock
        self.counters = Counters()
        self.inference = InferenceStats()  # the backend's totals, refreshed by ``observe``
        self._carried = dict.fromkeys(CARRIED, 0)  # a resumed run's inference counts before this process
        self.training_s = 0.0
        self.status = Status()
        self._last: dict[str, float] = {}  # the totals at the previous row
        self.metrics: MetricsWriter | None = None
        self.tracker: WandbRun | None = None  # --wandb
        self.evaluator: Evaluator | None = None  # run.eval_every
        self.opponents: OpponentPool | None = None  # a self-play run's: its oldest member is evaluated against
        # a multi-agent env's per-env episodes (``agents`` slots per env; ``learner.teams``)
        self.teams = EpisodeTracker(()) if agents > 1 else None
        # several policies (``learner.team``): each one's return per agent in each env episode
        self.policy_returns = {name: EpisodeTracker(()) for name in policies}

    def open(self, resume_after: int | None) -> None:
        extra = [f"{POLICY_PREFIX}{name}/{key}" for keys in (POLICY_COLUMNS, POLICY_COLUMNS_ADDED)
                 for name in self.policy_returns for key in keys]
        self.metrics = MetricsWriter(self.run_dir, resume_after=resume_after, extra=extra)
        config = self.trainer.config
        ranks = self.trainer.ranks
        if config.run.eval_every and (ranks is None or ranks.rank == 0):  # the ranks' parameters are identical
            self.evaluator = Evaluator(config, self.run_dir, resume=resume_after is not None)
        if config.run.wandb:
            project = os.environ.get("WANDB_PROJECT", config.run.wandb_project)
            self.tracker = WandbRun(self.run_dir, self.run_dir.name, project, dataclasses.asdict(config),
                                    resume=resume_after is not None)

    def close(self) -> None:
        if self.evaluator is not None:
            self.evaluator.close()
        if self.metrics is not None:
            self.metrics.close()

    def totals(self) -> dict[str, int]:
        """Every counter of the run, as summary.json and checkpoints hold them."""
        i = self.inference
        return {**vars(self.counters), "wasted_forward_passes": i.wasted_forward_passes,
                "rejected_rpcs": i.rejected_rpcs, "torn_reads": i.torn_reads, "torn_reads_used": i.torn_reads_used}

    def checkpoint_state(self, slot_counters: dict[int, int], config: dict) -> dict:
        """What a checkpoint holds: everything a resumed run continues from (taken between iterations).

        The metrics rows it claims are on disk first (``MetricsWriter.sync``), so that a crash right after
        the checkpoint cannot leave a metrics.csv without them."""
        if self.metrics is not None:
            self.metrics.sync()
        return {
            "trainer": self.trainer.state_dict(),
            "episodes": self.episodes.state_dict(),
            **({"teams": self.teams.state_dict()} if self.teams is not None else {}),
            **({"policy_returns": {name: t.state_dict() for name, t in self.policy_returns.items()}}
               if self.policy_returns else {}),
            "counters": self.totals(),
            "slot_counters": dict(slot_counters),
            "wall_s": self.clock.wall_s,
            "config": config,
        }

    def load_checkpoint_state(self, state: dict) -> dict[int, int]:
        """Continue from a checkpoint's state (``checkpoint_state``); return the actors' noise counters."""
        self.trainer.load_state_dict(state["trainer"])
        self.episodes.load_state_dict(state["episodes"])
        if self.teams is not None and "teams" in state:
            self.teams.load_state_dict(state["teams"])
        for name, tracker in self.policy_returns.items():
            tracker.load_state_dict(state["policy_returns"][name])
        self.restore(state["counters"])
        self.clock.offset = state["wall_s"]
        return {int(k): v for k, v in state["slot_counters"].items()}

    def restore(self, totals: dict[str, int]) -> None:
        """Continue a resumed run's totals: the first row after it counts from them, not from zero.

        What was collected but not trained when the checkpoint was taken (pipelined mode
        collects while it trains) is lost with the old process: it counts as dropped, in the
        first row after the resume, so that collected = trained + dropped still holds.
        """
        for key in vars(self.counters):
            setattr(self.counters, key, totals.get(key, 0))
        c = self.counters
        taken = self.trainer.samples_trained + self.trainer.samples_frozen
        c.dropped_transitions += max(0, c.transitions_collected - taken - c.dropped_transitions)
        self._carried = {k: totals.get(k, 0) for k in CARRIED}
        self.observe(InferenceStats())
        self._last = {**totals, "forward_passes": 0, "rows_inferred": 0}

    def observe(self, backend: InferenceStats) -> None:
        """Take the backend's totals for this process, on top of what a resumed run had counted."""
        self.inference = dataclasses.replace(backend, **{k: getattr(backend, k) + self._carried[k] for k in CARRIED})

    def trained(self, stats: TrainStats) -> None:
        self.counters.off_policy_samples += stats.off_policy_samples
        self.counters.skipped_updates += stats.update.skipped_steps
        self.training_s += stats.train_s

    def row(self, stats: TrainStats, collect_s: float, actors: int) -> dict[str, Any]:
        """Write iteration ``stats``'s row to metrics.csv (and TensorBoard); update the progress status.
        With evaluation while training: the evaluation that finished goes into the row, and the version just
        trained is handed over for evaluation when it is due (or the evaluation counted as skipped)."""
        evaluated = self._evaluate()
        totals = {**self.totals(), "forward_passes": self.inference.forward_passes,
                  "rows_inferred": self.inference.rows_inferred}
        increase = {k: v - self._last.get(k, 0) for k, v in totals.items()}
        self._last = totals
        ep = self.episodes.stats()
        trainer, wall = self.trainer, self.clock.wall_s
        passes = increase["forward_passes"]
        row = {
            "iteration": trainer.iteration,
            "policy_version": stats.version,
            "env_steps": trainer.env_steps,
            "wall_s": wall,
            "sps": trainer.env_steps / wall if wall > 0 else 0.0,
            **ep,
            **{k: increase[k] for k in INCREASES},
            "off_policy_samples": stats.off_policy_samples,
            "policy_lag_mean": stats.policy_lag_mean,
            "policy_lag_max": stats.policy_lag_max,
            **lag_distribution(stats.lag_counts, trainer.max_lag),
            "inference_batch_mean": increase["rows_inferred"] / passes if passes else math.nan,
            "collect_s": collect_s,
            "train_s": stats.train_s,
            "actors": actors,
            "lr": stats.lr,
            "policy_loss": stats.update.policy_loss,
            "value_loss": stats.update.value_loss,
            "entropy": stats.update.entropy,
            "approx_kl": stats.update.approx_kl,
            "clip_fraction": stats.update.clip_fraction,
            **_eval_columns(evaluated),
            **self._team_columns(),
            **self._game_columns(ep["episodes"]),
            "vtrace_truncated": stats.vtrace_truncated,  # ppo.vtrace's; None (an empty cell) without it
            **self._policy_columns(stats),
            # an action of several parts: TensorBoard and W&B only (metrics.csv's columns are the same for every env)
            **{f"entropy/{entry}": value for entry, value in stats.entropy_by_entry.items()},
        }
        self.metrics.write(row)
        if self.tracker is not None:
            self.tracker.log(row)
        self.status = Status(
            iteration=trainer.iteration, policy_version=trainer.version, env_steps=trainer.env_steps,
            sps=row["sps"], episode_return_mean=ep["episode_return_mean20"], episodes=ep["episodes"],
            actors=actors, started=True, **_eval_status(self.evaluator and self.evaluator.last),
        )
        return row

    def _team_columns(self) -> dict[str, Any]:
        """A multi-agent env's per-env episodes: how many finished, the mean return of the last 100 (their
        agents' returns summed); none (empty cells) for other envs."""
        if self.teams is None:
            return {}
        teams = self.teams.stats()
        return {"team_episodes": teams["episodes"], "team_return_mean": teams["episode_return_mean"]}

    def _game_columns(self, episodes: int) -> dict[str, Any]:
        """A self-play game's games finished: ``games``, the learning player's episodes and the games the opponents
        decided before it moved (``games_decided_before_move``, no episodes: ``envs.selfplay``); none for other
        envs. Run totals, as ``episodes`` is; the decided ones as the actors have reported them."""
        if self.opponents is None:
            return {}
        decided = self.counters.games_decided_before_move
        return {"games": episodes + decided, "games_decided_before_move": decided}

    def _policy_columns(self, stats: TrainStats) -> dict[str, Any]:
        """Several policies: each one's columns (``POLICY_COLUMNS``, ``POLICY_COLUMNS_ADDED``) under
        ``policy/NAME/``."""
        columns = {}
        for name, tracker in self.policy_returns.items():
            own = stats.policies[name]
            values = (own.version, own.samples, tracker.stats()["episode_return_mean"], own.update.policy_loss,
                      own.update.value_loss, own.update.entropy, own.update.approx_kl, own.update.clip_fraction,
                      own.lr, int(own.skipped))
            keys = POLICY_COLUMNS + POLICY_COLUMNS_ADDED
            columns |= {f"{POLICY_PREFIX}{name}/{key}": v for key, v in zip(keys, values, strict=True)}
        return columns

    def _evaluate(self) -> EvalResult | None:
        """The evaluation that finished since the last row; hand over the trainer's version if one is due."""
        if self.evaluator is None:
            return None
        evaluated = self.evaluator.collect()
        pool = self.opponents
        oldest = pool.pool[0] if pool is not None and pool.pool else None  # a frozen snapshot: read, never written
        if self.evaluator.due(self.trainer.iteration) and not self.evaluator.submit(self.trainer, oldest):
            self.counters.skipped_evaluations += 1
        return evaluated

    def _policy_summary(self) -> dict[str, Any]:
        """summary.json's ``policies``: each policy's agents, version, samples and return per agent."""
        described = team.summary(self.trainer)
        for name, tracker in self.policy_returns.items():
            mean = tracker.stats()["episode_return_mean"]
            described[name]["episode_return_mean"] = None if math.isnan(mean) else mean
        return described

    def time_split(self, codec_s: float) -> dict[str, float]:
        """Where the learner's wall time went: a cheap in-process account, not a profile.

        inference: forward passes (batcher or in-place); serialization: decoding steps and
        encoding actions; training: PPO updates; other: the rest of the wall time (gRPC, the
        gate, bookkeeping, waiting for actors). In pipelined mode training overlaps the others
        on its own thread, so the parts can add up to more than the wall time (other is then 0).
        """
        wall = self.clock.wall_s - self.clock.offset
        split = {"inference": self.inference.busy_s, "serialization": codec_s, "training": self.training_s}
        split["other"] = max(0.0, wall - sum(split.values()))
        return {k: round(v, 3) for k, v in split.items()}

    def summary(self, **run: Any) -> dict[str, Any]:
        """summary.json: ``run`` (env, seed, sync, device, checkpoint, ...) and the run's final figures."""
        ep = self.episodes.stats()
        trainer, wall, inf = self.trainer, self.clock.wall_s, self.inference
        summary = {
            **{k: run[k] for k in ("env", "seed", "sync")},
            "iterations": trainer.iteration,
            "policy_version": trainer.version,
            "env_steps": trainer.env_steps,
            "wall_s": round(wall, 3),
            # ended as it was asked (budget, time limit, target return), stopped before that, or failed
            "status": "failed" if run["error"] else "completed" if run.pop("completed") else "stopped",
            "time_limited": run["time_limited"],
            "sps": round(trainer.env_steps / wall, 1) if wall > 0 else 0.0,
            "learner_cpu_s": round(time.process_time() - self.clock.cpu_at_start, 3),  # since the first phase
            "episodes": ep["episodes"],
            "episode_return_mean": None if math.isnan(ep["episode_return_mean"]) else ep["episode_return_mean"],
            "first_reached": self.episodes.first_reached,
            **{k: None if isinstance(v, float) and math.isnan(v) else v for k, v in self._team_columns().items()},
            **self._game_columns(ep["episodes"]),  # (games_decided_before_move is also a counter, in every run's)
            **({"policies": self._policy_summary()} if self.policy_returns else {}),
            **self.totals(),
            "transitions_trained": trainer.samples_trained,  # by this learner (env_steps: by all, if several)
            **({"transitions_frozen": trainer.samples_frozen} if self.policy_returns else {}),  # acted, never trained
            "policy_lag_mean": trainer.lag_sum / trainer.samples_trained if trainer.samples_trained else 0.0,
            "policy_lag_max": trainer.lag_max,
            "policy_lag_counts": trainer.lag_counts.tolist(),  # the trained samples of each lag 0, 1, ...
            # ppo.vtrace: the run's fraction of the valid samples whose importance weight was truncated
            **({"vtrace_truncated": trainer.vtrace_truncated / max(trainer.vtrace_samples, 1)}
               if trainer.config.uses_vtrace() else {}),
            "forward_passes": inf.forward_passes,
            "inference_batch_mean": inf.rows_inferred / inf.forward_passes if inf.forward_passes else None,
            "learner_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "time_split_s": self.time_split(run.pop("codec_s")),
            "publish_release_ms": run["releases"],  # ReleaseLatency.summary()
            **{k: run[k] for k in ("checkpoint", "resumed_from", "device", "error")},
            **({"ranks": run["ranks"]} if run.get("ranks") else {}),
            **({"evaluation": self.evaluator.summary(self.counters.skipped_evaluations)} if self.evaluator else {}),
        }
        write_summary(self.run_dir / "summary.json", summary)
        if self.tracker is not None:
            self.tracker.finish(summary)
            self.tracker = None
        return summary


def _eval_columns(result: EvalResult | None) -> dict[str, Any]:
    """An evaluation's metrics.csv columns; none (empty cells) without one."""
    if result is None:
        return {}
    return {"eval_return_mean": result.return_mean, "eval_return_std": result.return_std,
            "eval_iteration": result.iteration, "eval_env_steps": result.env_steps,
            **{f"eval_{key}": value for key, value in result.outcomes.items()},
            **({"eval_team_return_mean": result.team_return_mean} if result.team_returns else {})}


def _eval_status(result: EvalResult | None) -> dict[str, Any]:
    """The newest evaluation, for the progress display."""
    return {} if result is None else {"eval_return_mean": result.return_mean, "eval_iteration": result.iteration}
