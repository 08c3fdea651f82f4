"""``lockstep bench vector``: env steps/s of an env that takes milliseconds a step (``lockstep.envs.tasks:Slow``),
the same number of envs stepped three ways:

    1 x N sync     one actor steps its N envs one after the other (``actors.vector: sync``): one core
    1 x N async    one actor, each env in a process of its own (``actors.vector: async``): one message a step
    N x 1 sync     N actors of one env each: N processes too, and N messages a step

once with envs that sleep through their milliseconds (a simulator or device the env waits on) and once with envs
that compute through them (``busy``: each step holds a core). ``lockstep train`` runs each, collecting only (batches
counted, never trained: ``lockstep_bench.train --collect-only``), over shared memory. The rate is the steady one:
env steps from the end of the first phase to the end of the last, over the seconds between (actor start-up, env
processes included, is not in it). The load average beside each row is the machine's as the run started.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from lockstep import config as config_lib
from lockstep_bench import cell, runs

ENV_ID = "lockstep.envs.tasks:Slow"
KEYS = ["work", "layout", "actors", "envs_per_actor", "vector", "env_steps_per_s", "env_steps", "seconds",
        "loadavg_1m", "error"]


def layouts(envs: int) -> list[tuple[str, int, int, str]]:
    """(name, actors, envs per actor, actors.vector) of the three ways to step ``envs`` envs."""
    return [(f"1 x {envs} sync", 1, envs, "sync"), (f"1 x {envs} async", 1, envs, "async"),
            (f"{envs} x 1 sync", envs, 1, "sync")]


def build_config(actors: int, envs_per_actor: int, vector: str, step_ms: float, busy: bool, phases: int,
                 steps_per_env: int) -> config_lib.Config:
    config = config_lib.Config()
    config.env.id, config.env.kwargs = ENV_ID, {"step_ms": step_ms, "busy": busy}
    config.actors.count, config.actors.envs_per_actor, config.actors.vector = actors, envs_per_actor, vector
    config.actors.transport = "shm"
    config.ppo.steps_per_env = steps_per_env
    config.ppo.total_steps = phases * actors * envs_per_actor * steps_per_env
    config.run.progress = False
    config.run.thresholds = []
    config.learner.device = "cpu"
    return config


def run(out: Path, envs: int = 8, step_ms: float = 2.0, phases: int = 12, steps_per_env: int = 32,
        timeout_s: float = 300.0) -> list[dict[str, Any]]:
    """One collection run per work kind and layout; a row each (also written to vector.json)."""
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for work in ("sleep", "busy"):
        for name, actors, per_actor, vector in layouts(envs):
            label = f"{work}-{actors}x{per_actor}-{vector}"
            config_path, run_dir = out / f"{label}.yaml", out / "runs" / label
            config_lib.save(build_config(actors, per_actor, vector, step_ms, work == "busy", phases, steps_per_env),
                            config_path)
            shutil.rmtree(run_dir, ignore_errors=True)
            print(f"[vector] {work}, {name}: running ...", flush=True)
            row: dict[str, Any] = {k: None for k in KEYS} | {
                "work": work, "layout": name, "actors": actors, "envs_per_actor": per_actor, "vector": vector,
                "loadavg_1m": round(os.getloadavg()[0], 2)}
            done = runs.train(config_path, run_dir, out / f"{label}.log", timeout_s, (),
                              runs.Knobs(collect_only=True))
            rows.append(row)
            metrics = [] if done.error else done.run.metrics()
            if done.error or len(metrics) < 2:
                row["error"] = done.error or f"fewer than 2 phases in {run_dir}"
                continue
            first, last = metrics[0], metrics[-1]
            steps = int(last["env_steps"]) - int(first["env_steps"])
            seconds = float(last["wall_s"]) - float(first["wall_s"])
            row.update(env_steps=steps, seconds=round(seconds, 2), env_steps_per_s=round(steps / seconds))
            print(f"[vector] {work}, {name}: {row['env_steps_per_s']} env steps/s", flush=True)
    (out / "vector.json").write_text(json.dumps(rows, indent=2) + "\n")
    return rows


def markdown(rows: list[dict[str, Any]], envs: int, step_ms: float, phases: int) -> list[str]:
    sync = {r["work"]: r["env_steps_per_s"] for r in rows if r["layout"] == f"1 x {envs} sync"}
    lines = [f"## {envs} envs of {step_ms:g} ms a step ({ENV_ID}), collection only; {os.cpu_count()} cores", "",
             f"`lockstep bench vector --envs {envs} --step-ms {step_ms:g} --phases {phases} --out DIR`", "",
             "| env step | actors x envs | env steps/s | x 1-actor sync | steps | seconds | load 1m |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        base, rate = sync.get(r["work"]), r["env_steps_per_s"]
        ratio = round(rate / base, 2) if rate and base else None
        name = r["layout"] + (f" (FAILED: {r['error']})" if r["error"] else "")
        lines.append(f"| {r['work']} | {name} | {cell(rate)} | {cell(ratio)} | {cell(r['env_steps'])} | "
                     f"{cell(r['seconds'])} | {cell(r['loadavg_1m'])} |")
    return lines + ["", f"The most a step can give: {envs} envs at {step_ms:g} ms are "
                        f"{round(envs * 1000 / step_ms):,} env steps/s side by side, {round(1000 / step_ms):,} one "
                        "after the other; envs that compute share the cores."]
