"""``lockstep bench sync --learning``: what staying on-policy costs in wall time, and what it buys in learning.

The same workload under each synchronization (``CONFIGS``: strict; pipelined, lag 1; async with lag bounds 2
and 8, each with V-trace and uncorrected), several seeds each, on a few workloads (``WORKLOADS``: CartPole's
default preset, Hopper's, MinAtar Breakout's, each at a budget that fits the benchmark; and ``cartpole-remote``,
CartPole whose env steps wait 0.5 ms each, asleep, as an env on a simulator or another machine would: the
simulated-latency run). Every run is a real ``lockstep train`` over shared memory with its actors in their own
processes, at a fixed env-step budget (no early stop), one after another: seed 1 of every config, then seed 2,
..., so that whatever else the machine does hits every config alike.

Per configuration (median over seeds, with each run's 1-minute load average beside it in ``learning.json``):
env steps/s; the actors' held fraction (the share of the actors' time their requests waited on the gate,
``actors_held_s`` / (actors x wall_s)); the return (mean of the last 20 episodes) at equal env steps (the
budget's half and its end) and at equal wall seconds (when the workload's fastest run finished its budget: every
run is still learning there, and one that is slower has taken fewer steps by then); the lag's mean and max; the
share of the samples V-trace truncated. Curves against steps and against seconds: one PNG per workload.
``rebuild(OUT)`` writes the table and the curves again from the runs in ``OUT`` (the figures are read from each
run's files; the load each run started under is kept from learning.json).
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lockstep.observe import plot
from lockstep.observe.run_dir import RunDir
from lockstep_bench import cell
from lockstep_bench.runs import command, run_process, tail


@dataclass(frozen=True)
class Workload:
    """A preset (or a YAML config) at a benchmark budget, with its own overrides (``--set``)."""

    name: str
    config: str
    total_steps: int
    sets: tuple[str, ...] = ()


@dataclass(frozen=True)
class SyncChoice:
    """One synchronization as ``lockstep train`` is told it."""

    name: str
    strategy: str
    max_lag: int | None = None
    vtrace: bool | None = None

    def args(self) -> list[str]:
        lag = ["--max-lag", str(self.max_lag)] if self.max_lag is not None else []
        vtrace = ["--set", f"ppo.vtrace={str(self.vtrace).lower()}"] if self.vtrace is not None else []
        return ["--sync", self.strategy, *lag, *vtrace]


WORKLOADS = {
    "cartpole": Workload("cartpole", "cartpole-fast", 100_000),
    "hopper": Workload("hopper", "hopper", 50_000),
    "minatar-breakout": Workload("minatar-breakout", "minatar-breakout", 200_000),
    # env steps that wait (asleep, the core free) as a remote simulator's do: 0.5 ms each, 8 envs per actor
    "cartpole-remote": Workload("cartpole-remote", "cartpole-fast", 40_000, (
        "env.id=lockstep.envs.tasks:Slow", "env.kwargs={step_ms: 0.5}", "actors.count=2",
        "actors.envs_per_actor=8", "ppo.steps_per_env=32")),
}

CONFIGS = [
    SyncChoice("strict", "strict"),
    SyncChoice("pipelined", "pipelined", 1, False),
    SyncChoice("async-2", "async", 2, True),
    SyncChoice("async-2-uncorrected", "async", 2, False),
    SyncChoice("async-8", "async", 8, True),
    SyncChoice("async-8-uncorrected", "async", 8, False),
]
CHOICES = {c.name: c for c in CONFIGS}

RUN_KEYS = ["workload", "config", "seed", "env_steps", "wall_s", "sps", "held_fraction", "return_half",
            "return_end", "return_at_equal_s", "lag_mean", "lag_max", "vtrace_truncated", "loadavg_1m", "error"]


@dataclass
class LearningOptions:
    workloads: list[str] = field(default_factory=lambda: list(WORKLOADS))
    configs: list[str] = field(default_factory=lambda: list(CHOICES))
    seeds: list[int] = field(default_factory=lambda: [1, 2, 3])
    scale: float = 1.0  # every workload's budget times this (--quick: a small fraction)
    timeout_s: float = 900.0  # per run: a run that hangs is that run's error, not the benchmark's end


def train_args(workload: Workload, choice: SyncChoice, seed: int, run_dir: Path, scale: float) -> list[str]:
    """``lockstep train``'s arguments for one run: over shared memory, actors in their own processes, the whole
    budget (no stop at a return)."""
    budget = max(1, int(workload.total_steps * scale))
    sets = [arg for s in workload.sets for arg in ("--set", s)]
    return ["--config", workload.config, *sets, "--transport", "shm", *choice.args(), "--seed", str(seed),
            "--total-steps", str(budget), "--stop-at-return", "none", "--run-dir", str(run_dir)]


def _return_at(curve: plot.Curve, axis: str, x: float) -> float | None:
    """The curve's return at ``x`` (steps or seconds): interpolated; past its end, its last value."""
    xs = curve.x(axis)
    if not len(xs) or x < xs[0]:
        return None
    return float(np.interp(x, xs, curve.values))


def measure(workload: str, choice: str, seed: int, run_dir: Path) -> dict[str, Any]:
    """One finished run's row, equal-seconds return aside (it needs every run of the workload)."""
    run = RunDir(run_dir)
    summary = run.summary()
    config = run.config_dict()
    actors = config["actors"]["count"]
    curve = plot.read_curve(run_dir)
    budget = summary["env_steps"]
    return {
        "workload": workload, "config": choice, "seed": seed, "env_steps": budget, "wall_s": summary["wall_s"],
        "sps": summary["sps"], "held_fraction": summary["actors_held_s"] / (actors * summary["wall_s"]),
        "return_half": _return_at(curve, "steps", budget / 2), "return_end": _return_at(curve, "steps", budget),
        "lag_mean": summary["policy_lag_mean"], "lag_max": summary["policy_lag_max"],
        "vtrace_truncated": summary.get("vtrace_truncated"), "error": None,
    }


def run(options: LearningOptions, out: Path, invocation: str) -> dict[str, Any]:
    """Every run, seed by seed, then the table and the curves; ``learning.json`` and ``learning.md`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for seed in options.seeds:
        for name in options.workloads:
            workload = WORKLOADS[name]
            for choice in options.configs:
                run_dir = out / "runs" / name / choice / f"seed{seed}"
                log = out / "runs" / name / choice / f"seed{seed}.log"
                run_dir.parent.mkdir(parents=True, exist_ok=True)
                load = os.getloadavg()[0]
                cmd = command(train_args(workload, CHOICES[choice], seed, run_dir, options.scale))
                rc, _ = run_process(cmd, log, options.timeout_s)
                try:
                    if rc != 0:
                        raise RuntimeError(f"exit {rc}: {tail(log)}")
                    row = measure(name, choice, seed, run_dir)
                except Exception as err:  # one failed run is its row's error; the others still count
                    row = {"workload": name, "config": choice, "seed": seed, "error": str(err)}
                row["loadavg_1m"] = round(load, 2)
                rows.append(row)
                print(f"{name} {choice} seed {seed}: " + (row["error"] or
                      f"{row['sps']:,.0f} steps/s, return {row['return_end']}, load {load:.2f}"), flush=True)
    return report(rows, options, out, invocation)


def report(rows: list[dict[str, Any]], options: LearningOptions, out: Path, invocation: str) -> dict[str, Any]:
    """The table and the curves of ``rows``; ``learning.json`` and ``learning.md`` in ``out``."""
    _equal_seconds(rows, out)
    written = {"invocation": invocation, "options": asdict(options), "runs": rows,
               "table": table(rows, options), "curves": draw_curves(options, out)}
    (out / "learning.json").write_text(json.dumps(written, indent=2) + "\n")
    (out / "learning.md").write_text("\n".join(markdown(written)) + "\n")
    return written


def rebuild(out: Path) -> dict[str, Any]:
    """``report`` again over the runs of an earlier invocation in ``out``, their figures read anew."""
    earlier = json.loads((out / "learning.json").read_text())
    options = LearningOptions(**earlier["options"])
    rows = []
    for old in earlier["runs"]:
        row = old if old["error"] else measure(old["workload"], old["config"], old["seed"],
                                               out / "runs" / old["workload"] / old["config"] / f"seed{old['seed']}")
        rows.append({**row, "loadavg_1m": old["loadavg_1m"]})
    return report(rows, options, out, earlier["invocation"])


def _equal_seconds(rows: list[dict[str, Any]], out: Path) -> None:
    """Each run's return at its workload's equal wall second: when its fastest run had finished its budget."""
    for name in {row["workload"] for row in rows}:
        done = [row for row in rows if row["workload"] == name and not row["error"]]
        if not done:
            continue
        seconds = min(row["wall_s"] for row in done)
        for row in done:
            curve = plot.read_curve(out / "runs" / name / row["config"] / f"seed{row['seed']}")
            row["return_at_equal_s"] = _return_at(curve, "time", seconds)
            row["equal_s"] = seconds


def _median(values: list[Any]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def table(rows: list[dict[str, Any]], options: LearningOptions) -> list[dict[str, Any]]:
    """One line per (workload, config): medians over its seeds, the returns' spread (min and max) too."""
    lines = []
    for name in options.workloads:
        for choice in options.configs:
            runs = [r for r in rows if r["workload"] == name and r["config"] == choice and not r["error"]]
            errors = sum(1 for r in rows if r["workload"] == name and r["config"] == choice and r["error"])
            line: dict[str, Any] = {"workload": name, "config": choice, "runs": len(runs), "errors": errors}
            for key in ("sps", "held_fraction", "return_half", "return_end", "return_at_equal_s", "lag_mean",
                        "lag_max", "vtrace_truncated", "loadavg_1m", "equal_s"):
                line[key] = _median([r.get(key) for r in runs])
            ends = [r["return_end"] for r in runs if r["return_end"] is not None]
            line["return_end_min"], line["return_end_max"] = (min(ends), max(ends)) if ends else (None, None)
            lines.append(line)
    return lines


def draw_curves(options: LearningOptions, out: Path) -> list[str]:
    """One PNG per workload: each config's mean and min-max over its seeds, against steps and seconds."""
    written = []
    for name in options.workloads:
        groups = []
        for choice in options.configs:
            dirs = [out / "runs" / name / choice / f"seed{s}" for s in options.seeds]
            curves = [plot.read_curve(d) for d in dirs if (d / "summary.json").exists()]
            curves = [c for c in curves if len(c.values)]
            if curves:
                groups.append(plot.Group(choice, curves, unit="seeds"))
        try:
            path = plot.draw(groups, out / f"learning-{name}.png", f"{name}: the synchronizations compared")
        except (plot.PlotUnavailable, ValueError) as err:  # no matplotlib, or curves that do not overlap
            print(f"no curves for {name}: {err}")
            continue
        written.append(path.name)
    return written


def markdown(report: dict[str, Any]) -> list[str]:
    lines = [f"`{report['invocation']}`", "",
             "Medians over seeds. held: the share of the actors' time their requests waited on the gate. Return: "
             "the mean of the last 20 episodes, at half the budget, at its end (min-max over seeds) and at equal "
             "wall seconds (when the workload's fastest run had finished its budget).", "",
             "| workload | config | runs | env steps/s | held | return @ ½ budget | return @ budget (min–max) "
             "| return @ equal s (s) | lag mean | lag max | V-trace truncated | load |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for t in report["table"]:
        spread = f" ({cell(t['return_end_min'])}–{cell(t['return_end_max'])})" if t["runs"] > 1 else ""
        errors = f" ({t['errors']} failed)" if t["errors"] else ""
        lines.append(
            f"| {t['workload']} | {t['config']} | {t['runs']}{errors} | {cell(t['sps'])} | "
            f"{cell(t['held_fraction'])} | {cell(t['return_half'])} | {cell(t['return_end'])}{spread} | "
            f"{cell(t['return_at_equal_s'])} ({cell(t['equal_s'])}) | {cell(t['lag_mean'])} | {cell(t['lag_max'])} | "
            f"{cell(t['vtrace_truncated'])} | {cell(t['loadavg_1m'])} |")
    failed = [r for r in report["runs"] if r["error"]]
    lines += ["", *[f"- failed: {r['workload']} {r['config']} seed {r['seed']}: {r['error']}" for r in failed]]
    lines += [f"![{name}]({name})" for name in report["curves"]]
    return lines
