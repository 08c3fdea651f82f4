"""``lockstep bench sync``: the same workload once per synchronization strategy, in one invocation.

Every strategy runs the real learner, real actor processes over loopback gRPC and
real PPO; only the synchronization differs: ``sync.strategy`` (strict, pipelined), or a
reference design put into the learner as its parts (``lockstep_bench.reference``). A
per-strategy time limit keeps the designs that spin from taking the whole benchmark; a
row that hit it says so.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lockstep import config as config_lib
from lockstep_bench import cell, hooks, reference
from lockstep_bench.runs import Knobs

log = logging.getLogger("lockstep_bench")

KEYS = ["strategy", "env_steps_per_s", "learner_cpu_s_per_1k_steps", "wasted_forward_passes", "rejected_rpcs",
        "off_policy_samples", "torn_reads", "torn_reads_used", "lag_mean", "lag_max", "stalls", "final_return",
        "env_steps", "wall_s", "time_limited"]


@dataclass
class Workload:
    env: str = "CartPole-v1"
    actors: int = 4
    envs_per_actor: int = 8
    steps_per_env: int = 32
    iterations: int = 60
    seed: int = 1
    time_limit_s: float = 60.0
    adversarial: bool = False
    jitter_ms: float = 2.0  # adversarial delays, up to this, in inference, training and the strategies' guards
    inference_threads: int = 2  # adversarial: fewer than actors

    def knobs(self, strategy: str) -> Knobs:
        """The learner's benchmark parts for ``strategy``: adversarial delays, or none; a reference design and
        the threads of its forward passes."""
        if strategy not in reference.DESIGNS:
            return Knobs(jitter_ms=self.jitter_ms if self.adversarial else 0.0)
        threads = min(self.inference_threads, max(1, self.actors - 1)) if self.adversarial else Knobs.inference_threads
        return Knobs(jitter_ms=self.jitter_ms if self.adversarial else 0.0, design=strategy,
                     inference_threads=threads)

    @classmethod
    def quick(cls, adversarial: bool = False) -> Workload:
        return cls(actors=4, envs_per_actor=4, steps_per_env=32, iterations=25, time_limit_s=10.0,
                   adversarial=adversarial)

    def config(self, strategy: str, run_dir: Path) -> config_lib.Config:
        config = config_lib.Config()
        config.env.id = self.env
        config.actors.count = self.actors
        config.actors.envs_per_actor = self.envs_per_actor
        config.ppo.steps_per_env = self.steps_per_env
        config.ppo.total_steps = self.iterations * self.actors * self.envs_per_actor * self.steps_per_env
        config.ppo.lr = 1e-3
        config.run.seed = self.seed
        config.run.progress = False
        config.run.time_limit_s = self.time_limit_s
        config.run.run_dir = str(run_dir)
        config.run.name = run_dir.name
        config.sync.strategy = "strict" if strategy in reference.DESIGNS else strategy  # a design: its parts'
        config.sync.stall_s = 5.0
        return config


def row_from_summary(strategy: str, summary: dict[str, Any]) -> dict[str, Any]:
    steps = summary["env_steps"]
    return {
        "strategy": strategy,
        "env_steps_per_s": summary["sps"],
        "learner_cpu_s_per_1k_steps": round(1000 * summary["learner_cpu_s"] / steps, 4) if steps else None,
        "wasted_forward_passes": summary["wasted_forward_passes"],
        "rejected_rpcs": summary["rejected_rpcs"],
        "off_policy_samples": summary["off_policy_samples"],
        "torn_reads": summary["torn_reads"],
        "torn_reads_used": summary["torn_reads_used"],
        "lag_mean": round(summary["policy_lag_mean"], 4),
        "lag_max": summary["policy_lag_max"],
        "stalls": summary["stalls"],
        "final_return": None if summary["episode_return_mean"] is None else round(summary["episode_return_mean"], 1),
        "env_steps": steps,
        "wall_s": summary["wall_s"],
        "time_limited": summary["time_limited"],
    }


def run(workload: Workload, out: Path, strategies: list[str] | None = None) -> list[dict[str, Any]]:
    from lockstep.launch.local import train

    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in strategies or list(reference.NAMES):
        log.info("bench sync: %s", name)
        config = workload.config(name, out / "runs" / name)
        summary = train(config, Path(config.run.run_dir), parts=hooks.parts(workload.knobs(name)))
        rows.append(row_from_summary(name, summary))
    (out / "sync.json").write_text(json.dumps(rows, indent=2) + "\n")
    (out / "sync.md").write_text(markdown(rows, workload))
    return rows


def markdown(rows: list[dict[str, Any]], workload: Workload) -> str:
    head = ["strategy", "env steps/s", "learner CPU s / 1k steps", "wasted passes", "rejected RPCs",
            "off-policy samples", "torn reads", "torn reads used", "lag mean", "lag max", "stalls", "final return"]
    keys = KEYS[:12]
    lines = [
        "# lockstep bench sync\n",
        f"{workload.env}, {workload.actors} actors x {workload.envs_per_actor} envs, T = {workload.steps_per_env}, "
        f"{workload.iterations} iterations, seed {workload.seed}, time limit {workload.time_limit_s:g} s per strategy"
        + (f", adversarial (delays up to {workload.jitter_ms:g} ms, {workload.inference_threads} inference threads)"
           if workload.adversarial else "") + f"; {os.cpu_count()} CPU cores.\n",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for row in rows:
        cells = [cell(row[k]) for k in keys]
        if row["time_limited"]:
            cells[0] += " (time limit)"
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("A strategy marked *(time limit)* did not finish its iterations within the limit; its "
                 "figures cover the steps it did train (`env_steps` in sync.json). Torn reads: forward passes "
                 "during which the optimizer wrote parameters; *used*: those whose actions went to an actor.")
    return "\n".join(lines) + "\n"
