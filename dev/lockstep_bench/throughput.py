"""``lockstep bench throughput``: env steps per second of the distributed system against an in-process baseline.

For each configuration, every mode runs in its own fresh subprocess, so peak RSS is
per run and nothing is warm from the run before:

    baseline   ``python -m lockstep_bench.baseline``: one process, same envs, same
               forward pass, same rollout store, same PPO (``dev/lockstep_bench/baseline.py``)
    collect    ``python -m lockstep_bench.train --collect-only`` (``lockstep train`` with a trainer
               that only counts): learner + actor processes, batches collected and checked, never trained
    strict     ``lockstep train --sync strict``
    pipelined  ``lockstep train --sync pipelined --max-lag 1``

Each distributed mode runs once per transport (``--transport inprocess``, ``shm`` and ``grpc``),
side by side. ``ratio_to_baseline`` is a mode's env steps/s over the same configuration's baseline
env steps/s, both measured in this invocation. Both count trained (collect: counted)
transitions per second from the first phase (baseline: the first env step) to the end
of the last update, so process start-up, imports and env creation are excluded.
A learner's ``learner_peak_rss_mb`` covers the learner process only, not its actors.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from lockstep import config as config_lib
from lockstep_bench import cell, roundtrip, runs
from lockstep_bench.runs import run_process, tail

MODES = ("baseline", "collect", "strict", "pipelined")
KEYS = ["config", "mode", "transport", "env_steps_per_s", "ratio_to_baseline", "inference_batch_mean",
        "learner_peak_rss_mb", "time_split_s", "env_steps", "wall_s", "device", "time_limited",
        "episode_return_mean", "process_s", "loadavg_1m", "error"]

# CleanRL's CartPole settings (src/lockstep/presets/cartpole-cleanrl.yaml; also the Config defaults).
_CARTPOLE = {
    "env": {"id": "CartPole-v1"},
    "ppo": {"anneal_lr": True, "gamma": 0.99, "gae_lambda": 0.95, "epochs": 4, "minibatches": 4, "clip_coef": 0.2,
            "clip_vloss": True, "ent_coef": 0.01, "vf_coef": 0.5, "max_grad_norm": 0.5},
    "run": {"seed": 1, "thresholds": [195, 475]},
}
# src/lockstep/presets/pendulum.yaml (CleanRL's continuous-action settings, rl-baselines3-zoo's gamma and lr).
_PENDULUM = {
    "env": {"id": "Pendulum-v1", "normalize_obs": True, "normalize_reward": True},
    "ppo": {"lr": 1.0e-3, "anneal_lr": True, "gamma": 0.9, "gae_lambda": 0.95, "clip_coef": 0.2,
            "clip_vloss": False, "ent_coef": 0.0, "vf_coef": 0.5, "max_grad_norm": 0.5},
    "model": {"hidden": [64, 64], "init_log_std": 0.0},
    "run": {"seed": 1, "thresholds": [-400, -200]},
}


def _preset(name: str) -> dict[str, Any]:
    """A shipped preset's settings, as the base of a benchmark configuration."""
    return yaml.safe_load(config_lib.preset_text(name))


@dataclass
class BenchConfig:
    name: str
    description: str
    base: dict[str, Any]
    settings: dict[str, Any]  # dotted key -> value, over ``base``
    modes: tuple[str, ...]
    # ppo.total_steps, sized from a 2-core machine's speeds (a whole number of batches):
    steps_full: int  # about 30 s for the slowest mode
    steps_quick: int  # about 4 s for the slowest mode (plus 3-6 s of process start-up)
    baseline_collect_only: bool = False  # the baseline collects without training too


CONFIGS: dict[str, BenchConfig] = {c.name: c for c in [
    BenchConfig(
        "cartpole-cleanrl", "CartPole-v1, CleanRL: 2 actors x 2 envs, T=128, 4 epochs x 4 minibatches, lr 2.5e-4",
        _CARTPOLE, {"actors.count": 2, "actors.envs_per_actor": 2, "ppo.steps_per_env": 128, "ppo.lr": 2.5e-4,
                    "ppo.epochs": 4, "ppo.minibatches": 4},
        MODES, steps_full=81_920, steps_quick=10_240),
    BenchConfig(
        "cartpole-cleanrl-1x4", "cartpole-cleanrl with its 4 envs in one actor: the layout for in-process actors, "
                                "which share the learner's thread (a request per actor and step is the cost)",
        _CARTPOLE, {"actors.count": 1, "actors.envs_per_actor": 4, "ppo.steps_per_env": 128, "ppo.lr": 2.5e-4,
                    "ppo.epochs": 4, "ppo.minibatches": 4},
        ("baseline", "strict"), steps_full=81_920, steps_quick=10_240),
    BenchConfig(
        "cartpole-scaled", "CartPole-v1: 4 actors x 64 envs, T=32, 4 epochs x 4 minibatches, lr 1e-3",
        _CARTPOLE, {"actors.count": 4, "actors.envs_per_actor": 64, "ppo.steps_per_env": 32, "ppo.lr": 1e-3,
                    "ppo.epochs": 4, "ppo.minibatches": 4},
        MODES, steps_full=1_081_344, steps_quick=147_456),
    BenchConfig(
        "pendulum-scaled", "Pendulum-v1 (the pendulum preset): 4 actors x 16 envs, T=64, 4 epochs x 4 minibatches",
        _PENDULUM, {"actors.count": 4, "actors.envs_per_actor": 16, "ppo.steps_per_env": 64,
                    "ppo.epochs": 4, "ppo.minibatches": 4},
        MODES, steps_full=499_712, steps_quick=65_536),
    BenchConfig(
        "cartpole-collect", "CartPole-v1: 4 actors x 128 envs, T=32, collection only (target 100k steps/s)",
        _CARTPOLE, {"actors.count": 4, "actors.envs_per_actor": 128, "ppo.steps_per_env": 32},
        ("baseline", "collect"), steps_full=2_392_064, steps_quick=327_680, baseline_collect_only=True),
    BenchConfig(
        "atari-breakout", "Breakout (the breakout preset: 84x84x4 uint8 frames, Nature CNN): 2 actors x 4 envs, "
                          "T=32, 4 epochs x 4 minibatches",
        _preset("breakout"), {"ppo.steps_per_env": 32}, ("baseline", "collect", "strict"),
        steps_full=8 * 32 * 16, steps_quick=8 * 32 * 2),
    BenchConfig(
        "atari-breakout-envpool", "atari-breakout with EnvPool stepping each actor's envs (env.id envpool:Breakout-v5)",
        _preset("breakout"), {"ppo.steps_per_env": 32, "env.id": "envpool:Breakout-v5"},
        ("baseline", "collect", "strict"), steps_full=8 * 32 * 16, steps_quick=8 * 32 * 2),
]}

TIME_LIMIT_S = {False: 60.0, True: 8.0}  # safety cap per run (run.time_limit_s): full, quick


def build_config(bench: BenchConfig, total_steps: int, time_limit_s: float, device: str) -> config_lib.Config:
    config = config_lib.from_dict(bench.base)
    for key, value in bench.settings.items():
        config_lib.set_value(config, key, value)
    config.ppo.total_steps = total_steps
    config.run.time_limit_s = time_limit_s
    config.run.progress = False
    config.learner.device = device
    config.validate()
    return config


LEARNER_MODES: dict[str, tuple[tuple[str, ...], runs.Knobs]] = {  # mode -> lockstep train's flags, knobs
    "collect": (("--sync", "strict"), runs.Knobs(collect_only=True)),
    "strict": (("--sync", "strict"), runs.NO_KNOBS),
    "pipelined": (("--sync", "pipelined", "--max-lag", "1"), runs.NO_KNOBS),
}


def _learner_command(mode: str, transport: str, config_path: Path, run_dir: Path) -> list[str]:
    if mode not in LEARNER_MODES:
        raise ValueError(f"unknown mode {mode!r}; modes: {', '.join(LEARNER_MODES)}")
    flags, knobs = LEARNER_MODES[mode]
    return runs.command(["--config", str(config_path), "--run-dir", str(run_dir), "--name", run_dir.name,
                         "--transport", transport, *flags], knobs)


def _row(bench: BenchConfig, mode: str, transport: str | None, result: dict[str, Any] | None, process_s: float,
         error: str | None) -> dict[str, Any]:
    row: dict[str, Any] = {"config": bench.name, "mode": mode, "transport": transport}
    if result is None:
        row.update({k: None for k in KEYS[2:]})
    elif mode == "baseline":
        row.update({
            "env_steps_per_s": result["env_steps_per_s"],
            "inference_batch_mean": result["inference_batch_mean"],
            "learner_peak_rss_mb": result["peak_rss_mb"],
            "time_split_s": result["time_split_s"],
            "env_steps": result["env_steps"],
            "wall_s": result["wall_s"],
            "device": result["device"],
            "time_limited": result["time_limited"],
            "episode_return_mean": result["episode_return_mean"],
            "collect_only": result["collect_only"],
        })
    else:
        inference_batch = result.get("inference_batch_mean")
        row.update({
            "env_steps_per_s": result["sps"],
            "inference_batch_mean": None if inference_batch is None else round(inference_batch, 2),
            "learner_peak_rss_mb": result.get("learner_peak_rss_mb"),
            "time_split_s": result.get("time_split_s"),
            "env_steps": result["env_steps"],
            "wall_s": result["wall_s"],
            "device": result.get("device"),
            "time_limited": result["time_limited"],
            "episode_return_mean": result["episode_return_mean"],
            "collect_only": mode == "collect",
            "off_policy_samples": result.get("off_policy_samples"),
            "policy_lag_mean": result.get("policy_lag_mean"),
        })
        if result.get("error"):
            error = error or f"learner error: {result['error']}"
    row["process_s"] = round(process_s, 2)
    row["error"] = error
    row["ratio_to_baseline"] = None
    return row


def run(out: Path, quick: bool = False, device: str = "auto", configs: list[str] | None = None,
        total_steps: int | None = None, time_limit_s: float | None = None,
        modes: list[str] | None = None, transports: tuple[str, ...] = roundtrip.TRANSPORTS,
        roundtrip_messages: int | None = None, repeats: int = 1) -> list[dict[str, Any]]:
    """Run the benchmark, write OUT/throughput.json and OUT/throughput.md, return the rows.

    ``total_steps`` and ``time_limit_s`` override every configuration's step budget and
    time cap (tests use tiny ones); ``modes`` restricts the modes run (baseline is always run
    where a mode needs its ratio). Every distributed mode runs once per transport in
    ``transports``; the round-trip micro-benchmark (``dev/lockstep_bench/roundtrip.py``) runs last, with
    ``roundtrip_messages`` messages per transport (0: skipped).

    ``repeats`` > 1 runs each configuration's whole sequence (its baseline, then every mode and transport)
    that many times, round after round, each row's ratio against its own round's baseline; the medians over
    the rounds (``medians``) go to OUT/medians.json and a table of their own. One run of each is a rough
    figure on a small shared machine: the same baseline has run at 6,300 and at 9,800 env steps/s minutes apart.
    """
    import torch

    names = configs or list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise ValueError(f"unknown throughput config(s) {unknown}; choose from {list(CONFIGS)}")
    if modes is not None:
        bad = [m for m in modes if m not in MODES]
        if bad:
            raise ValueError(f"unknown mode(s) {bad}; choose from {list(MODES)}")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, not {repeats}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "configs").mkdir(exist_ok=True)
    began = time.perf_counter()
    load = os.getloadavg()
    rows: list[dict[str, Any]] = []
    for name in names:
        bench = CONFIGS[name]
        steps = total_steps or (bench.steps_quick if quick else bench.steps_full)
        limit = time_limit_s or TIME_LIMIT_S[quick]
        config = build_config(bench, steps, limit, device)
        config_path = out / "configs" / f"{name}.yaml"
        config_lib.save(config, config_path)
        runs = out / "runs" / name
        runs.mkdir(parents=True, exist_ok=True)
        timeout_s = 3 * limit + 120  # start-up, the last iteration past the cap, shutdown
        baseline_sps = None
        sequence = [(m, t) for m in bench.modes for t in ((None,) if m == "baseline" else transports)
                    if modes is None or m in modes or m == "baseline"]
        for round_, (mode, transport) in [(r, step) for r in range(1, repeats + 1) for step in sequence]:
            if mode == "baseline":
                baseline_sps = None
            label = (mode if transport is None else f"{mode} over {transport}") + (
                f", round {round_} of {repeats}" if repeats > 1 else "")
            print(f"[throughput] {name} {label}: running ({steps:,} steps, cap {limit:g} s) ...", flush=True)
            suffix = f"-r{round_}" if repeats > 1 else ""
            log_path = runs / f"{mode}{'' if transport is None else '-' + transport}{suffix}.log"
            if mode == "baseline":
                result_path = runs / f"baseline{suffix}.json"
                result_path.unlink(missing_ok=True)
                cmd = [sys.executable, "-m", "lockstep_bench.baseline", str(config_path), str(result_path)]
                if bench.baseline_collect_only:
                    cmd.append("--collect-only")
            else:
                run_dir = runs / f"{mode}-{transport}{suffix}"
                result_path = run_dir / "summary.json"
                shutil.rmtree(run_dir, ignore_errors=True)  # this benchmark's own run of an earlier invocation
                cmd = _learner_command(mode, transport, config_path, run_dir)
            load_1m = round(os.getloadavg()[0], 2)  # others' work on this machine skews the figures
            rc, process_s = run_process(cmd, log_path, timeout_s)
            result, error = None, None
            if rc is None:
                error = f"killed after {timeout_s:g} s; see {log_path}"
            elif rc != 0:
                error = f"exit code {rc}: {tail(log_path)}"
            elif not result_path.is_file():
                error = f"no {result_path.name} written; see {log_path}"
            else:
                result = json.loads(result_path.read_text())
            row = _row(bench, mode, transport, result, process_s, error)
            row["loadavg_1m"], row["round"] = load_1m, round_
            if mode == "baseline":
                baseline_sps = row["env_steps_per_s"]
            sps = row["env_steps_per_s"]
            if sps is not None and baseline_sps:
                row["ratio_to_baseline"] = round(sps / baseline_sps, 3)
            rows.append(row)
            if error:
                print(f"[throughput] {name} {label}: FAILED: {error}", flush=True)
            else:
                ratio = row["ratio_to_baseline"]
                print(f"[throughput] {name} {label}: {sps:,.0f} env steps/s"
                      + (f" (x{ratio:.3f} baseline)" if ratio is not None else "")
                      + f", {row['env_steps']:,} steps in {row['wall_s']:.1f} s"
                      + (" (time limit)" if row["time_limited"] else "")
                      + f"; process {process_s:.1f} s", flush=True)
    messages = roundtrip_messages if roundtrip_messages is not None else (20_480 if quick else 102_400)
    trips = roundtrip.run(out / "roundtrip", messages, transports=transports) if messages else []
    elapsed = time.perf_counter() - began
    info = {
        "command": _command(out, quick, device, configs, transports, roundtrip_messages, repeats),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "device": device + (f" ({', '.join(sorted({r['device'] for r in rows if r['device']}))})"
                            if any(r["device"] for r in rows) else ""),
        "loadavg_at_start": [round(x, 2) for x in load],
        "elapsed_s": round(elapsed, 1),
    }
    central = medians(rows) if repeats > 1 else []
    if central:
        (out / "medians.json").write_text(json.dumps(central, indent=2) + "\n")
    (out / "throughput.md").write_text(markdown(rows, info, names, trips, central))
    (out / "throughput.json").write_text(json.dumps(rows, indent=2) + "\n")  # roundtrip/roundtrip.json beside it
    print(f"[throughput] done in {elapsed:.0f} s; wrote {out / 'throughput.md'} and {out / 'throughput.json'}",
          flush=True)
    return rows


def medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (config, mode, transport), over its rounds that did not fail: the median env steps/s and the
    median, lowest and highest ratio to its round's baseline; in the order the rows first appear."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["config"], row["mode"], row["transport"]), []).append(row)
    central = []
    for (config, mode, transport), group in groups.items():
        ok = [r for r in group if r["error"] is None and r["env_steps_per_s"] is not None]
        ratios = [r["ratio_to_baseline"] for r in ok if r["ratio_to_baseline"] is not None]
        central.append({
            "config": config, "mode": mode, "transport": transport,
            "rounds": len(group), "failed": len(group) - len(ok),
            "env_steps_per_s": float(np.median([r["env_steps_per_s"] for r in ok])) if ok else None,
            "ratio_to_baseline": round(float(np.median(ratios)), 3) if ratios else None,
            "ratio_range": [min(ratios), max(ratios)] if ratios else None,
            "loadavg_1m_range": [min(r["loadavg_1m"] for r in group), max(r["loadavg_1m"] for r in group)],
        })
    return central


def _command(out: Path, quick: bool, device: str, configs: list[str] | None, transports: tuple[str, ...],
             roundtrip_messages: int | None, repeats: int) -> str:
    parts = ["lockstep bench throughput", f"--out {out}"]
    if quick:
        parts.append("--quick")
    parts.append(f"--device {device}")
    if configs:
        parts.append("--configs " + " ".join(configs))
    if tuple(transports) != roundtrip.TRANSPORTS:
        parts.append("--transports " + " ".join(transports))
    if roundtrip_messages is not None:
        parts.append(f"--roundtrip-messages {roundtrip_messages}")
    if repeats > 1:
        parts.append(f"--repeats {repeats}")
    return " ".join(parts)


def markdown(rows: list[dict[str, Any]], info: dict[str, Any], names: list[str],
             trips: list[dict[str, Any]] | None = None, central: list[dict[str, Any]] | None = None) -> str:
    head = ["config", "mode", "transport", "env steps/s", "ratio to baseline", "inference batch mean", "peak RSS MB",
            "time split s", "env steps", "wall s", "final return", "load 1m"]
    lines = [
        "# lockstep bench throughput\n",
        f"`{info['command']}`; {info['cpu_count']} CPU cores, torch {info['torch']}, device {info['device']}; "
        f"load average at start {', '.join(map(str, info['loadavg_at_start']))}; {info['elapsed_s']:g} s in all.\n",
    ]
    lines += [f"- **{n}**: {CONFIGS[n].description}" for n in names]
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        mode = row["mode"]
        if mode == "baseline" and row.get("collect_only"):
            mode += " (collect only)"
        if row["error"]:
            mode += " (FAILED)"
        elif row["time_limited"]:
            mode += " (time limit)"
        if central:
            mode += f", round {row['round']}"
        cells = [row["config"], mode, row["transport"] or "-", cell(row["env_steps_per_s"]),
                 cell(row["ratio_to_baseline"]),
                 cell(row["inference_batch_mean"]), cell(row["learner_peak_rss_mb"]), _split(row["time_split_s"]),
                 cell(row["env_steps"]), cell(row["wall_s"]), cell(row["episode_return_mean"]),
                 cell(row["loadavg_1m"])]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "env steps/s: trained transitions (collect: collected and counted) per second, from the first phase "
        "(baseline: the first env step) to the end of the last update. The ratio divides by the same config's "
        "baseline in this invocation; a config's baseline trains unless marked *collect only*, so a *collect* "
        "row of a training config compares collection alone against collection plus training. Peak RSS: the "
        "learner process only (its actor processes are not counted); baseline: its one process, envs included. "
        "Time split: baseline env / inference / training / other; learner inference / serialization / "
        "training / other (other includes waiting for actors). *(time limit)*: stopped by run.time_limit_s "
        "before ppo.total_steps. load 1m: the machine's 1-minute load average as the run started; above the "
        "core count, other work competed for the CPUs and the figures are noisy.",
    ]
    if central:
        lines += ["", f"## Medians over {max(r['rounds'] for r in central)} rounds", "",
                  "| config | mode | transport | rounds (failed) | env steps/s | ratio to baseline | ratio range | "
                  "load 1m range |", "|---|---|---|---|---|---|---|---|"]
        for c in central:
            low_high = c["ratio_range"]
            lines.append(f"| {c['config']} | {c['mode']} | {c['transport'] or '-'} | {c['rounds']} ({c['failed']}) | "
                         f"{cell(c['env_steps_per_s'])} | {cell(c['ratio_to_baseline'])} | "
                         f"{'n/a' if low_high is None else f'{low_high[0]:.3f}-{low_high[1]:.3f}'} | "
                         f"{c['loadavg_1m_range'][0]:g}-{c['loadavg_1m_range'][1]:g} |")
        lines += ["", "Each round runs the config's baseline and then its modes; a ratio divides by its own round's "
                  "baseline, and the median is over the rounds' ratios (not the ratio of the medians)."]
    if trips:
        lines += [""] + roundtrip.markdown(trips)
    failed = [r for r in rows if r["error"]]
    if failed:
        lines += ["", "Failures:", ""] + [f"- {r['config']} {r['mode']}: {r['error']}" for r in failed]
    return "\n".join(lines) + "\n"


_SHORT = {"env": "env", "inference": "inf", "serialization": "ser", "training": "train", "other": "other"}


def _split(split: dict[str, float] | None) -> str:
    if not split:
        return "n/a"
    return " / ".join(f"{_SHORT.get(k, k)} {v:.2f}" for k, v in split.items())
