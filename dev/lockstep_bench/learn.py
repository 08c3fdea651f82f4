"""``lockstep bench learn``: wall-clock seconds and env steps to a return threshold, distributed against in-process.

For each seed, two runs of the same resolved config, one right after the other (seed 1
distributed, seed 1 in-process, seed 2 distributed, ...), so that whatever else the machine
is doing hits both alike:

    distributed  ``lockstep train --config CONFIG --seed S``: the learner and its actor
                 processes, over the transport the config chooses (``actors.transport``,
                 which ``--transport`` overrides)
    in-process   ``python -m lockstep_bench.baseline CONFIG OUT --set run.seed=S``: the same
                 PPO, env loop and action noise in one process (``dev/lockstep_bench/baseline.py``)

Each run is a fresh process that stops once the running mean return (the mean of the last
20 episodes, ``EpisodeTracker.reached``) reaches the *threshold*: the config's
``run.stop_at_return``, or else the environment's ``reward_threshold`` (CartPole-v1: 475).
Seconds to the threshold are ``first_reached[...]["wall_s"]`` of each run, counted from the
start of training (process start-up, imports and env creation excluded; ``process_s`` has
the whole process). The results go to ``OUT/learn.json`` and ``OUT/learn.md``.

``lockstep bench learn --suite NAME`` asks another question, the return a preset reaches at its
whole budget across seeds, against CleanRL's published figures: ``dev/lockstep_bench/suites.py``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lockstep import config as config_lib
from lockstep.envs import reward_threshold
from lockstep.observe.run_dir import RunDir
from lockstep_bench import cell
from lockstep_bench.runs import command, run_process, tail

MODES = ("distributed", "in-process")
RUN_KEYS = ["seed", "mode", "reached", "seconds_to_threshold", "env_steps_to_threshold", "final_return",
            "final_return_mean100", "env_steps", "wall_s", "process_s", "loadavg_1m", "command", "error"]
DEFAULT_TIME_LIMIT_S = 120.0  # run.time_limit_s of each run when the config sets none


@dataclass
class LearnOptions:
    """What ``lockstep bench learn`` runs: a config (a preset name or a YAML path), its seeds, and overrides."""

    source: str = config_lib.DEFAULT_PRESET  # preset name or YAML path
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5])
    overrides: list[str] = field(default_factory=list)  # KEY=VALUE, as ``--set``
    transport: str | None = None  # actors.transport of the distributed runs; None: the config's
    time_limit_s: float | None = None  # each run's cap when the config has no run.time_limit_s


def threshold_of(config: config_lib.Config) -> tuple[float, str]:
    """The return both runs train to and where it comes from: ``run.stop_at_return``, else the env's
    ``reward_threshold``; a ConfigError when there is neither."""
    if config.run.stop_at_return is not None:
        return float(config.run.stop_at_return), "run.stop_at_return"
    solved = reward_threshold(config.env.id)
    if solved is None:
        raise config_lib.ConfigError(
            f"{config.env.id} has no reward_threshold in its Gymnasium registration and the config sets no "
            "run.stop_at_return: give one, e.g. --set run.stop_at_return=200")
    return solved, f"reward_threshold of {config.env.id}"


def build_config(options: LearnOptions) -> tuple[config_lib.Config, float, str]:
    """The config both runs of every seed use (seed aside), the threshold, and where the threshold comes from."""
    config = config_lib.load(options.source)
    config_lib.apply_sets(config, options.overrides)
    if options.transport is not None:
        config_lib.set_value(config, "actors.transport", options.transport)
    threshold, source = threshold_of(config)
    config.run.stop_at_return = threshold
    thresholds = config.return_thresholds()
    config.run.thresholds = sorted(set(thresholds) | {threshold})
    if config.run.time_limit_s is None:
        config.run.time_limit_s = options.time_limit_s or DEFAULT_TIME_LIMIT_S
    config.run.progress = False
    config.validate()
    return config, threshold, source


def _command(mode: str, config_path: Path, seed: int, run_path: Path) -> list[str]:
    if mode == "distributed":
        return command(["--config", str(config_path), "--seed", str(seed), "--run-dir", str(run_path),
                        "--name", run_path.name])
    return [sys.executable, "-m", "lockstep_bench.baseline", str(config_path), str(run_path),
            "--set", f"run.seed={seed}"]


def _final_mean20(run_dir: Path) -> float | None:
    """The last ``episode_return_mean20`` in a run's metrics.csv (the mean of its last 20 episodes)."""
    rows = RunDir(run_dir).metrics()
    return rows[-1].get("episode_return_mean20") if rows else None


def _record(mode: str, seed: int, key: str, run_path: Path, rc: int | None, process_s: float, timeout_s: float,
            log_path: Path) -> dict[str, Any]:
    """One run's row from its result file (distributed: summary.json and metrics.csv; in-process: its JSON)."""
    result_path = run_path / "summary.json" if mode == "distributed" else run_path
    row: dict[str, Any] = {k: None for k in RUN_KEYS}
    row.update(seed=seed, mode=mode, reached=False, process_s=round(process_s, 2))
    if rc is None:
        row["error"] = f"killed after {timeout_s:g} s; see {log_path}"
        return row
    if rc != 0:
        row["error"] = f"exit code {rc}: {tail(log_path)}"
        return row
    if not result_path.is_file():
        row["error"] = f"no {result_path.name} written; see {log_path}"
        return row
    result = json.loads(result_path.read_text())
    crossing = result["first_reached"].get(key)
    if mode == "distributed":
        final = _final_mean20(run_path)
        if result.get("error"):
            row["error"] = f"learner error: {result['error']}"
    else:
        final = result["curve"][-1][2] if result["curve"] else None
    row.update(
        reached=crossing is not None,
        seconds_to_threshold=None if crossing is None else crossing["wall_s"],
        env_steps_to_threshold=None if crossing is None else crossing["env_steps"],
        final_return=None if final is None else round(final, 2),
        final_return_mean100=result["episode_return_mean"],
        env_steps=result["env_steps"],
        wall_s=result["wall_s"],
    )
    return row


def _median(values: list[float | None]) -> float | None:
    """The median, with a run that never reached the threshold counted as infinitely slow; None if that is the
    median."""
    median = statistics.median([math.inf if v is None else v for v in values]) if values else math.inf
    return None if math.isinf(median) else median


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode: seeds reached, median seconds and env steps to the threshold; and distributed / in-process."""
    out: dict[str, Any] = {}
    for mode in MODES:
        rows = [r for r in runs if r["mode"] == mode]
        out[mode] = {
            "runs": len(rows),
            "reached": sum(bool(r["reached"]) for r in rows),
            "median_seconds_to_threshold": _median([r["seconds_to_threshold"] for r in rows]),
            "median_env_steps_to_threshold": _median([r["env_steps_to_threshold"] for r in rows]),
        }
    for what in ("seconds", "env_steps"):
        dist = out["distributed"][f"median_{what}_to_threshold"]
        proc = out["in-process"][f"median_{what}_to_threshold"]
        out[f"ratio_{what}"] = round(dist / proc, 3) if dist is not None and proc else None
    return out


def run(options: LearnOptions, out: Path, command: str) -> dict[str, Any]:
    """Run every seed in both modes, interleaved; write OUT/learn.json and OUT/learn.md; return the report."""
    import torch

    config, threshold, threshold_source = build_config(options)
    key = f"{threshold:g}"
    out.mkdir(parents=True, exist_ok=True)
    config_path = out / "config.yaml"
    config_lib.save(config, config_path)
    runs_dir = out / "runs"
    runs_dir.mkdir(exist_ok=True)
    timeout_s = 3 * config.run.time_limit_s + 120  # start-up, the last iteration past the cap, shutdown
    began = time.perf_counter()
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    runs: list[dict[str, Any]] = []
    for seed in options.seeds:
        for mode in MODES:
            name = f"s{seed}-{'distributed' if mode == 'distributed' else 'in-process'}"
            run_path = runs_dir / (name if mode == "distributed" else f"{name}.json")
            shutil.rmtree(run_path, ignore_errors=True)  # this benchmark's own run of an earlier invocation
            if run_path.is_file():
                run_path.unlink()
            log_path = runs_dir / f"{name}.log"
            cmd = _command(mode, config_path, seed, run_path)
            print(f"[learn] seed {seed} {mode}: running to {key} ...", flush=True)
            loadavg = round(os.getloadavg()[0], 2)  # others' work on this machine skews the seconds
            rc, process_s = run_process(cmd, log_path, timeout_s)
            row = _record(mode, seed, key, run_path, rc, process_s, timeout_s, log_path)
            row["loadavg_1m"] = loadavg
            row["command"] = " ".join(cmd)
            runs.append(row)
            if row["error"]:
                print(f"[learn] seed {seed} {mode}: FAILED: {row['error']}", flush=True)
            elif row["reached"]:
                print(f"[learn] seed {seed} {mode}: {key} after {row['seconds_to_threshold']:.1f} s, "
                      f"{row['env_steps_to_threshold']:,} env steps; process {process_s:.1f} s", flush=True)
            else:
                print(f"[learn] seed {seed} {mode}: did not reach {key} in {row['env_steps']:,} env steps; "
                      f"final return {row['final_return']}", flush=True)
    report = {
        "command": command,
        "config": options.source,
        "env": config.env.id,
        "threshold": threshold,
        "threshold_source": threshold_source,
        "transport": config.actors.transport,
        "seeds": list(options.seeds),
        "summary": summarize(runs),
        "runs": runs,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "loadavg_at_start": load_at_start,
        "elapsed_s": round(time.perf_counter() - began, 1),
    }
    (out / "learn.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "learn.md").write_text(markdown(report))
    return report


def markdown(report: dict[str, Any]) -> str:
    """learn.md: every run, then the medians and their ratio."""
    key = f"{report['threshold']:g}"
    lines = [
        "# lockstep bench learn\n",
        f"`{report['command']}`: {report['env']} to a running mean return of {key} "
        f"({report['threshold_source']}); distributed runs over {report['transport']}; {report['cpu_count']} CPU "
        f"cores, torch {report['torch']}; load average at start {', '.join(map(str, report['loadavg_at_start']))}; "
        f"{report['elapsed_s']:g} s in all.\n",
        f"| seed | mode | reached | seconds to {key} | env steps to {key} | final return (last 20) | "
        "training s | process s | load 1m |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        reached = "FAILED" if r["error"] else ("yes" if r["reached"] else "no")
        lines.append("| " + " | ".join([
            str(r["seed"]), r["mode"], reached, cell(r["seconds_to_threshold"]), cell(r["env_steps_to_threshold"]),
            cell(r["final_return"]), cell(r["wall_s"]), cell(r["process_s"]), cell(r["loadavg_1m"])]) + " |")
    summary = report["summary"]
    lines += ["", f"| mode | reached | median seconds to {key} | median env steps to {key} |", "|---|---|---|---|"]
    for mode in MODES:
        s = summary[mode]
        lines.append(f"| {mode} | {s['reached']}/{s['runs']} | {cell(s['median_seconds_to_threshold'])} | "
                     f"{cell(s['median_env_steps_to_threshold'])} |")
    lines += [
        "",
        f"Distributed / in-process: {cell(summary['ratio_seconds'])}x the seconds, "
        f"{cell(summary['ratio_env_steps'])}x the env steps (medians).",
        "",
        f"Seconds to {key}: from the start of training (the learner's first phase; in-process: the first env step) "
        f"until the mean return of the last 20 episodes first reached {key}; *process s* adds start-up and "
        "shutdown. A run that never got there counts as infinitely slow in the medians (n/a when that is the "
        "median). load 1m: the 1-minute load average as the run started; above the core count, other work "
        "competed for the CPUs.",
    ]
    failed = [r for r in report["runs"] if r["error"]]
    if failed:
        lines += ["", "Failures:", ""] + [f"- seed {r['seed']} {r['mode']}: {r['error']}" for r in failed]
    return "\n".join(lines) + "\n"
