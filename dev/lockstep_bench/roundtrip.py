"""The round-trip micro-benchmark: one env per message, so every message is one round trip.

For each transport, ``lockstep train`` with one actor process of one env, collecting only
(``python -m lockstep_bench.train --collect-only``: batches are checked and counted, never trained), so the learner's
CPU goes to receiving a step, the session and the gate, one forward pass and the reply.

    round trips/s        env steps per second over the run (one per message)
    learner µs/message   the learner process's CPU seconds from the first actor's connection / messages
                         (``learner_cpu_s`` in summary.json: start-up and imports are not counted)
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from lockstep import config as config_lib
from lockstep_bench import cell, runs

TRANSPORTS = ("inprocess", "shm", "grpc")
KEYS = ["transport", "round_trips_per_s", "learner_cpu_us_per_message", "messages", "wall_s", "loadavg_1m",
        "error"]


def build_config(messages: int, time_limit_s: float) -> config_lib.Config:
    config = config_lib.Config()
    config.env.id, config.actors.count, config.actors.envs_per_actor = "CartPole-v1", 1, 1
    config.ppo.steps_per_env = 512
    config.ppo.total_steps = max(512, messages // 512 * 512)
    config.run.progress = False
    config.run.thresholds = []
    config.run.time_limit_s = time_limit_s
    config.learner.max_wait_ms = 0.0  # one actor: nothing to wait for
    config.learner.device = "cpu"
    return config


def run(out: Path, messages: int = 20_480, time_limit_s: float = 20.0,
        transports: tuple[str, ...] = TRANSPORTS) -> list[dict[str, Any]]:
    """One collection run per transport; return a row per transport (also written to roundtrip.json)."""
    out.mkdir(parents=True, exist_ok=True)
    config_path = out / "roundtrip.yaml"
    config_lib.save(build_config(messages, time_limit_s), config_path)
    rows = []
    for transport in transports:
        run_dir = out / "runs" / transport
        shutil.rmtree(run_dir, ignore_errors=True)
        print(f"[roundtrip] {transport}: running ...", flush=True)
        load_1m = round(os.getloadavg()[0], 2)
        run = runs.train(config_path, run_dir, out / f"roundtrip-{transport}.log", 3 * time_limit_s + 60,
                         ("--transport", transport), runs.Knobs(collect_only=True))
        row: dict[str, Any] = {k: None for k in KEYS} | {"transport": transport, "loadavg_1m": load_1m}
        if run.error:
            row["error"] = run.error
        else:
            summary = run.run.summary()
            steps = summary["env_steps"]
            row.update(round_trips_per_s=summary["sps"], messages=steps, wall_s=summary["wall_s"],
                       learner_cpu_us_per_message=round(1e6 * summary["learner_cpu_s"] / steps, 1) if steps else None)
        print(f"[roundtrip] {transport}: {row['round_trips_per_s']} round trips/s, "
              f"{row['learner_cpu_us_per_message']} µs learner CPU per message", flush=True)
        rows.append(row)
    (out / "roundtrip.json").write_text(json.dumps(rows, indent=2) + "\n")
    return rows


def markdown(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["## Round trips (1 env per message, collection only)", "",
             "| transport | round trips/s | learner µs CPU / message | messages | wall s | load 1m |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        name = r["transport"] + (" (FAILED)" if r["error"] else "")
        lines.append(f"| {name} | {cell(r['round_trips_per_s'])} | {cell(r['learner_cpu_us_per_message'])} | "
                     f"{cell(r['messages'])} | {cell(r['wall_s'])} | {cell(r['loadavg_1m'])} |")
    return lines + ["", "One actor process with one env: every env step is one message and one reply. Learner CPU "
                    "counts from the first actor's connection, so start-up is not in it."]
