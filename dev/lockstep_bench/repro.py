"""``lockstep bench repro``: the same strict training twice, once on a quiet machine and once beside
CPU-burning processes; are the two runs' metrics identical, row by row?

Each run is a fresh ``lockstep train`` subprocess with real actor processes over the real
transport, so nothing carries over from one run to the other but the config. The second run
shares the machine with ``burners`` processes that spin for its whole duration, which changes
every timing: which requests share a forward pass, in which order the actors' messages arrive,
when a batch flushes on its timeout. A strict run must not care (``docs/architecture.md``,
"Reproducible strict runs"): for one seed, environment and actor layout, every compared column of
``metrics.csv`` and the final parameters must be identical.

Overridden in the config, because each makes a run depend on timing by design: ``sync.strategy``
(strict), ``sync.phase_cutoff`` (none: a straggler cut-off closes phases by arrival) and
``run.time_limit_s`` (none: the number of iterations would depend on speed). Set on:
``learner.deterministic`` (a GPU's kernels and reduction orders fixed; nothing changes on the CPU).
``run.stop_at_return`` is kept: it reads the ordered episode window, so both runs stop at the same iteration.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lockstep import config as config_lib
from lockstep.observe.run_dir import RunDir, Value
from lockstep_bench import cell, runs

# metrics.csv columns that must be identical (the others are times, rates and timing-dependent counts)
COMPARED = ["episodes", "episode_return_mean", "episode_return_mean20", "episode_length_mean", "policy_loss",
            "value_loss", "entropy", "approx_kl", "clip_fraction", "env_steps", "policy_version",
            "off_policy_samples"]
RUNS = ("quiet", "loaded")


@dataclass
class ReproOptions:
    config: str | None = None  # YAML file; None: the built-in defaults (CleanRL's CartPole settings)
    seed: int = 1
    iterations: int = 30
    burners: int = 1  # CPU-burning processes beside the second run
    timeout_s: float = 900.0  # per run


def make_config(options: ReproOptions, run_dir: Path) -> config_lib.Config:
    config = config_lib.load(options.config) if options.config else config_lib.Config()
    config.run.seed = options.seed
    config.sync.strategy = "strict"
    config.learner.deterministic = True  # on a GPU: the same kernels and reduction orders (learner/device.py)
    config.sync.phase_cutoff = None
    config.run.time_limit_s = None
    config.ppo.total_steps = options.iterations * config.batch_size
    config.run.progress = False
    config.run.audit = False
    config.run.run_dir = str(run_dir)
    config.run.name = run_dir.name
    config.validate()
    return config


def _burn(stop: Any) -> None:
    """Spin on one core until ``stop`` is set (checked every few milliseconds)."""
    x = 0
    while not stop.is_set():
        for i in range(20_000):
            x = (x * 31 + i) & 0xFFFFFFFF


class Burners:
    """``count`` spinning processes for the duration of a ``with`` block."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._ctx = mp.get_context("spawn")
        self._stop = self._ctx.Event()
        self._procs: list[Any] = []

    def __enter__(self) -> Burners:
        for i in range(self.count):
            proc = self._ctx.Process(target=_burn, args=(self._stop,), name=f"lockstep-burner-{i}", daemon=True)
            proc.start()
            self._procs.append(proc)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        for proc in self._procs:
            proc.join(timeout=5.0)
            if proc.is_alive():
                proc.kill()
                proc.join()


def _train(config: config_lib.Config, out: Path, name: str, timeout_s: float) -> dict[str, Any]:
    """One ``lockstep train`` subprocess; its exit code, wall seconds and summary figures."""
    run_dir = Path(config.run.run_dir)
    config_path = out / f"{name}.yaml"
    config_lib.save(config, config_path)
    run = runs.train(config_path, run_dir, out / f"{name}.log", timeout_s)  # on timeout its process group is killed
    result: dict[str, Any] = {"returncode": run.returncode, "process_s": round(run.process_s, 2)}
    s = run.run.summary()
    if s is not None:
        result.update({k: s.get(k) for k in ("iterations", "env_steps", "wall_s", "sps", "forward_passes",
                                              "inference_batch_mean", "learner_cpu_s")})
    return result


def first_difference(a: list[dict[str, Value]], b: list[dict[str, Value]]) -> dict[str, Any] | None:
    """The first (row, column) where the compared columns differ, as read (None: identical)."""
    for i, (ra, rb) in enumerate(zip(a, b)):
        for column in COMPARED:
            if ra.get(column) != rb.get(column):
                return {"row": i + 1, "iteration": ra.get("iteration"), "column": column,
                        RUNS[0]: ra.get(column), RUNS[1]: rb.get(column)}
    if len(a) != len(b):
        return {"row": min(len(a), len(b)) + 1, "iteration": None, "column": "(row count)",
                RUNS[0]: len(a), RUNS[1]: len(b)}
    return None


def parameters_identical(run_a: Path, run_b: Path) -> bool:
    """Bit for bit: the final checkpoints' network parameters and observation statistics."""
    import torch

    from lockstep.learner import checkpoint

    a = checkpoint.load(checkpoint.find(RunDir(run_a).checkpoints, "final.pt"))["trainer"]
    b = checkpoint.load(checkpoint.find(RunDir(run_b).checkpoints, "final.pt"))["trainer"]
    if a["model"].keys() != b["model"].keys():
        return False
    same = all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    rms_a, rms_b = a.get("obs_rms"), b.get("obs_rms")
    if rms_a is not None and rms_b is not None:
        same = same and all(torch.equal(torch.as_tensor(rms_a[k]), torch.as_tensor(rms_b[k])) for k in ("mean", "var"))
    return same


def run(options: ReproOptions, out: Path) -> dict[str, Any]:
    """Both runs, the comparison, ``repro.json`` and ``repro.md`` in ``out``; returns the report."""
    out.mkdir(parents=True, exist_ok=True)
    configs = {name: make_config(options, out / "runs" / name) for name in RUNS}
    results = {"quiet": _train(configs["quiet"], out, "quiet", options.timeout_s)}
    with Burners(options.burners):
        results["loaded"] = _train(configs["loaded"], out, "loaded", options.timeout_s)
    report: dict[str, Any] = {
        "identical": False, "metrics_identical": False, "parameters_identical": False, "rows": None,
        "first_difference": None, "error": None, "seed": options.seed, "iterations": options.iterations,
        "config": options.config or "(defaults)", "burners": options.burners, "cpu_cores": os.cpu_count(),
        "compared_columns": COMPARED, "runs": results,
    }
    failed = [n for n in RUNS if results[n]["returncode"] != 0]
    if failed:
        report["error"] = f"run(s) {', '.join(failed)} failed; see {', '.join(f'{n}.log' for n in failed)}"
    else:
        metrics = {n: RunDir(configs[n].run.run_dir).metrics() for n in RUNS}
        report["rows"] = [len(metrics[n]) for n in RUNS]
        report["first_difference"] = first_difference(metrics["quiet"], metrics["loaded"])
        report["metrics_identical"] = report["first_difference"] is None and len(metrics["quiet"]) > 0
        report["parameters_identical"] = parameters_identical(*(Path(configs[n].run.run_dir) for n in RUNS))
        report["identical"] = report["metrics_identical"] and report["parameters_identical"]
    (out / "repro.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "repro.md").write_text(markdown(report, configs["quiet"]))
    return report


def markdown(report: dict[str, Any], config: config_lib.Config) -> str:
    yes = {True: "yes", False: "no"}
    diff = report["first_difference"]
    lines = [
        "# lockstep bench repro\n",
        f"{config.env.id}, {config.actors.count} actors x {config.actors.envs_per_actor} envs, "
        f"T = {config.ppo.steps_per_env}, {report['iterations']} iterations, seed {report['seed']}, strict; "
        f"config {report['config']}; the second run beside {report['burners']} CPU-burning process(es) "
        f"on {report['cpu_cores']} CPU cores.\n",
        f"**identical: {yes[report['identical']]}**\n",
        f"* metrics.csv ({', '.join(report['compared_columns'])}): {yes[report['metrics_identical']]}"
        + (f", {report['rows'][0]} rows" if report["rows"] else ""),
        f"* final parameters, bit for bit: {yes[report['parameters_identical']]}",
    ]
    if diff is not None:
        lines.append(f"* first difference: row {diff['row']} (iteration {diff['iteration']}), column "
                     f"`{diff['column']}`: quiet {diff['quiet']}, loaded {diff['loaded']}")
    if report["error"]:
        lines.append(f"* error: {report['error']}")
    lines += ["", "| run | exit code | wall s (training) | env steps/s | forward passes | mean batch | process s |",
              "|---|---|---|---|---|---|---|"]
    for name in RUNS:
        r = report["runs"][name]
        cells = [name, r["returncode"], r.get("wall_s"), r.get("sps"), r.get("forward_passes"),
                 r.get("inference_batch_mean"), r["process_s"]]
        lines.append("| " + " | ".join(cell(c) for c in cells) + " |")
    lines += ["", "Forward passes and timings differ between the runs (the load changes how requests are batched "
              "and when messages arrive); the compared columns must not. Overridden in the config for both runs: "
              "sync.strategy=strict, sync.phase_cutoff=none, run.time_limit_s=none."]
    return "\n".join(lines) + "\n"
