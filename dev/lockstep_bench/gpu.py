"""``lockstep bench gpu``: what the learner does on an accelerator, in under eight minutes; on the CPU too.

Seven parts, written to ``OUT/gpu.json`` and ``OUT/gpu.md``:

    inference  latency and rows/s of ``lockstep.learner.inference.act`` (the one sampling function)
               against batch size, for the MLP policy (CartPole and Hopper shapes) and the Nature CNN
               (Atari, 4x84x84 uint8), built by ``lockstep.models.build_policy`` from the presets' model
               sections; observations copied to the device and actions back as the learner does (one copy each way)
    training   strict Breakout (the breakout preset) and the hopper preset for a fixed number of env
               steps, ``lockstep train --device DEVICE`` subprocesses, with summary.json's time split; and
               the hopper preset again on the CPU of the same machine (one env: which device is faster)
    audits     strict runs with ``run.audit`` on the device, of the MLP (CartPole), the Nature CNN
               (Breakout) and the LSTM (masked CartPole), each followed by ``lockstep audit RUN`` with no
               device visible (``CUDA_VISIBLE_DEVICES=``): the trail recorded on the device must check out
               on the CPU, where the audit replays every step in float32
    eval       ``lockstep eval --device DEVICE`` of the hopper run (a checkpoint holding numpy arrays: the
               observation and reward statistics)
    repro      ``lockstep bench repro`` of strict Breakout on the device with ``learner.deterministic``:
               the same run quiet and beside CPU-burning processes, compared bit for bit (the CNN's
               backward pass included)
    syncs      host syncs per training update of small MLP, uint8 CNN and LSTM cases
               (``lockstep_bench.syncs``): counted by ``HostSyncs`` and, on CUDA, reported by
               ``torch.cuda.set_sync_debug_mode("warn")``
    memory     peak device memory (``torch.cuda.max_memory_allocated``) of each inference model and of
               each training process (which runs as ``python -m lockstep_bench.gpu OUT_JSON train ...``
               to read it at exit); on the CPU, the learner's peak RSS

Timings on CUDA synchronize the device before each timed call and time it with CUDA events as
well as the wall clock (``act`` copies its results to host memory, so the wall clock covers the
whole round trip).
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lockstep_bench import cell, syncs
from lockstep_bench.runs import command, run_process, tail

BATCHES = (1, 8, 64, 512, 4096)
QUICK_BATCHES = (1, 8, 64, 512)
MODELS = {  # name -> (preset whose model section it uses, observation shape, dtype, action)
    "mlp-cartpole": ("cartpole-cleanrl", (4,), "float32", ("discrete", 2)),
    "mlp-hopper": ("hopper", (11,), "float64", ("box", 3)),
    "nature-cnn": ("breakout", (4, 84, 84), "uint8", ("discrete", 4)),
}
# name -> (preset, flags, env steps in full, env steps with --quick, device: None for the one checked)
TRAINING = {
    "breakout-strict": ("breakout", ("--sync", "strict"), 32_768, 64, None),
    "hopper": ("hopper", (), 20_480, 256, None),
    "hopper-on-cpu": ("hopper", (), 20_480, 256, "cpu"),
}
# strict runs recorded on the device and audited on the CPU: name -> (preset, env steps in full, with --quick)
AUDITS = {
    "audited-strict": ("cartpole-cleanrl", 4 * 512, 2 * 512),
    "audited-cnn": ("breakout", 4 * 1024, 64),
    "audited-lstm": ("cartpole-masked-lstm", 10 * 256, 2 * 256),
}
EVAL_EPISODES = 3
REPRO = ("breakout", 8, 1)  # preset, iterations in full, with --quick
REPRO_BURNERS = 4
_BREAKOUT_QUICK = ("actors.transport=inprocess", "actors.count=1", "actors.envs_per_actor=2",
                   "ppo.steps_per_env=32", "ppo.minibatches=2")
_HOPPER_QUICK = ("actors.transport=inprocess", "ppo.steps_per_env=256", "ppo.minibatches=4", "ppo.epochs=2")
# every run's own settings: the CNN's audit in process (its trail holds every frame, written by the learner)
SETS = {"audited-cnn": ("actors.transport=inprocess",)}
# --quick (the suite's CPU check): one small iteration of each, actors in process (no actor process start-up)
QUICK_SETS = {
    "breakout-strict": _BREAKOUT_QUICK,
    "hopper": _HOPPER_QUICK,
    "hopper-on-cpu": _HOPPER_QUICK,
    "audited-strict": ("actors.transport=inprocess",),
    "audited-cnn": _BREAKOUT_QUICK,
    "audited-lstm": ("ppo.epochs=2",),
    "repro": ("actors.envs_per_actor=2", "ppo.steps_per_env=16", "ppo.minibatches=2", "ppo.epochs=1"),
}
# each training subprocess: killed after this (its training capped at half of it), so that the whole command
# stays under eight minutes on a GPU; --quick gets more, for a busy CPU
RUN_TIMEOUT_S = 120.0
QUICK_RUN_TIMEOUT_S = 300.0


@dataclass
class GpuOptions:
    device: str = "auto"  # auto, cuda or cpu
    quick: bool = False


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _policy(name: str, device: Any) -> tuple[Any, Any, tuple[int, ...], str]:
    import numpy as np

    from lockstep import config as config_lib
    from lockstep.algo.normalize import ObsNormalizer
    from lockstep.envs import SpaceSpec
    from lockstep.models import build_policy

    preset, shape, dtype, (kind, size) = MODELS[name]
    config = config_lib.load(preset)
    if dtype == "uint8":
        observation = SpaceSpec("box", shape, dtype, low=np.zeros(shape, np.uint8), high=np.full(shape, 255, np.uint8))
    else:
        observation = SpaceSpec("box", shape, dtype, low=np.full(shape, -np.inf), high=np.full(shape, np.inf))
    action = (SpaceSpec("discrete", (), "int64", n=size) if kind == "discrete" else
              SpaceSpec("box", (size,), "float32", low=-np.ones(size, np.float32), high=np.ones(size, np.float32)))
    model = build_policy(observation, action, config.model).to(device).eval()
    normalized = config.env.normalize_obs
    normalize = ObsNormalizer(np.zeros(shape) if normalized else None, np.ones(shape) if normalized else None,
                              config.env.clip_obs, device)
    return model, normalize, shape, dtype


def time_inference(name: str, batch: int, device: Any, budget_s: float, max_reps: int) -> dict[str, Any]:
    """Median latency and rows/s of ``act`` at one batch size: a warm-up call, then calls until ``max_reps`` or
    ``budget_s`` has passed (at least three)."""
    import numpy as np
    import torch

    from lockstep.learner.inference import act

    model, normalize, shape, dtype = _policy(name, device)
    rng = np.random.default_rng(batch)
    obs = (rng.integers(0, 256, (batch, *shape), dtype=np.uint8) if dtype == "uint8"
           else rng.standard_normal((batch, *shape)).astype(dtype))
    uniform = rng.random((batch, model.noise_width))
    state = model.initial_state(batch)
    act(model, normalize, obs, uniform, state, device)  # warm-up: kernels, allocator, lazy init
    cuda = device.type == "cuda"
    walls: list[float] = []
    device_ms: list[float] = []
    began = time.perf_counter()
    while len(walls) < max_reps and (len(walls) < 3 or time.perf_counter() - began < budget_s):
        _sync(device)
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        act(model, normalize, obs, uniform, state, device)
        if cuda:
            end.record()
            end.synchronize()
            device_ms.append(start.elapsed_time(end))
        _sync(device)
        walls.append(time.perf_counter() - t0)
    latency = statistics.median(walls)
    return {"model": name, "batch": batch, "calls": len(walls), "latency_ms": round(latency * 1e3, 4),
            "rows_per_s": round(batch / latency, 1),
            "device_ms": round(statistics.median(device_ms), 4) if device_ms else None}


def inference(device: Any, quick: bool) -> tuple[list[dict[str, Any]], dict[str, float | None]]:
    """Every model at every batch size; and each model's peak device memory in MB (None on the CPU)."""
    import torch

    rows: list[dict[str, Any]] = []
    peaks: dict[str, float | None] = {}
    for name in MODELS:
        batches = QUICK_BATCHES if quick else BATCHES
        if quick and name == "nature-cnn":
            batches = (1, 8)  # a 64-frame CNN pass on two loaded cores takes most of a second
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
        for batch in batches:
            rows.append(time_inference(name, batch, device, budget_s=0.2 if quick else 2.0,
                                       max_reps=50 if quick else 500))
            print(f"[gpu] inference {name} batch {batch}: {rows[-1]['latency_ms']:.3f} ms, "
                  f"{rows[-1]['rows_per_s']:,.0f} rows/s", flush=True)
        peaks[name] = (round(torch.cuda.max_memory_allocated(device) / 2**20, 1) if device.type == "cuda" else None)
    return rows, peaks


def train_command(memory_path: Path, args: list[str]) -> list[str]:
    """``lockstep train ARGS`` run by this module, which writes the process's peak device memory to
    ``memory_path`` at exit."""
    base = command(args)
    return [sys.executable, "-m", "lockstep_bench.gpu", str(memory_path), *base[base.index("train"):]]


def _train(name: str, preset: str, flags: tuple[str, ...], steps: int, device: str, runs_dir: Path,
           quick: bool) -> dict[str, Any]:
    run_path = runs_dir / name
    log_path = runs_dir / f"{name}.log"
    memory_path = runs_dir / f"{name}.memory.json"
    memory_path.unlink(missing_ok=True)
    sets = (*SETS.get(name, ()), *(QUICK_SETS[name] if quick else ()))
    extra = [item for key in sets for item in ("--set", key)]
    timeout_s = QUICK_RUN_TIMEOUT_S if quick else RUN_TIMEOUT_S
    args = ["--config", preset, "--run-dir", str(run_path), "--name", name, "--device", device,
            "--set", f"ppo.total_steps={steps}", "--set", f"run.time_limit_s={timeout_s / 2:g}", *flags, *extra]
    cmd = train_command(memory_path, args)
    rc, process_s = run_process(cmd, log_path, timeout_s, cwd=runs_dir)
    row: dict[str, Any] = {"run": name, "preset": preset, "command": " ".join(cmd), "process_s": round(process_s, 2),
                           "error": None, "run_dir": str(run_path)}
    summary_path = run_path / "summary.json"
    if rc is None:
        row["error"] = f"killed after {timeout_s:g} s; see {log_path}"
    elif rc != 0:
        row["error"] = f"exit code {rc}: {tail(log_path)}"
    elif not summary_path.is_file():
        row["error"] = f"no summary.json written; see {log_path}"
    if summary_path.is_file():
        summary = json.loads(summary_path.read_text())
        row.update(env_steps=summary["env_steps"], wall_s=summary["wall_s"], sps=summary["sps"],
                   time_split_s=summary.get("time_split_s"), device=summary.get("device"),
                   learner_peak_rss_mb=summary.get("learner_peak_rss_mb"))
        if summary.get("error") and row["error"] is None:
            row["error"] = f"learner error: {summary['error']}"
    if memory_path.is_file():
        row["peak_device_mb"] = json.loads(memory_path.read_text()).get("peak_device_mb")
    return row


def audit_cpu(run_dir: Path, log_path: Path) -> tuple[int | None, str]:
    """``lockstep audit RUN_DIR`` with no CUDA device visible; (exit code, its last line)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, "-m", "lockstep", "audit", str(run_dir)]
    with open(log_path, "w") as log:
        try:
            rc: int | None = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                             timeout=QUICK_RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            rc = None
    lines = log_path.read_text().strip().splitlines()
    return rc, lines[-1] if lines else ""


def audited(name: str, device: str, runs_dir: Path, quick: bool) -> dict[str, Any]:
    """Strict run ``name`` of ``AUDITS`` with ``--audit`` on ``device``, then its audit on the CPU."""
    preset, steps, quick_steps = AUDITS[name]
    row = _train(name, preset, ("--sync", "strict", "--audit"), quick_steps if quick else steps, device, runs_dir,
                 quick)
    rc, line = (None, "not run: the training run failed")
    if row["error"] is None:
        rc, line = audit_cpu(runs_dir / name, runs_dir / f"{name}.audit.log")
    row.update(audit_exit_code=rc, audit_result=line, audit_passed=rc == 0)
    return row


def evaluate(run_dir: Path, device: str, log_path: Path) -> dict[str, Any]:
    """``lockstep eval RUN_DIR --device DEVICE`` for ``EVAL_EPISODES`` episodes: exit code, mean return, error."""
    out = run_dir.parent / f"{run_dir.name}.eval.json"
    cmd = command([str(run_dir), "--device", device, "--episodes", str(EVAL_EPISODES), "--out", str(out)],
                  subcommand="eval")[:-1]  # eval has no progress bar to turn off
    rc, process_s = run_process(cmd, log_path, QUICK_RUN_TIMEOUT_S, cwd=run_dir.parent)
    row: dict[str, Any] = {"run": run_dir.name, "device": device, "command": " ".join(cmd), "exit_code": rc,
                           "process_s": round(process_s, 2), "return_mean": None, "episodes": None, "error": None}
    if rc != 0 or not out.is_file():
        row["error"] = f"exit code {rc}: {tail(log_path)}"
    else:
        result = json.loads(out.read_text())
        row.update(return_mean=round(result["return_mean"], 2), episodes=len(result["episodes"]))
    return row


def reproduce(device: str, runs_dir: Path, quick: bool) -> dict[str, Any]:
    """``bench repro`` of strict Breakout on ``device`` (deterministic kernels): identical twice, bit for bit?"""
    from lockstep import config as config_lib
    from lockstep_bench import repro

    preset, iterations, quick_iterations = REPRO
    config = config_lib.load(preset)
    config.learner.device = device
    config_lib.apply_sets(config, list(QUICK_SETS["repro"]) if quick else [])
    path = runs_dir / f"repro-{preset}.yaml"
    config_lib.save(config, path)
    report = repro.run(repro.ReproOptions(config=str(path), iterations=quick_iterations if quick else iterations,
                                          burners=1 if quick else REPRO_BURNERS, timeout_s=QUICK_RUN_TIMEOUT_S),
                       runs_dir / "repro")
    return {"preset": preset, "device": device, "iterations": report["iterations"], "burners": report["burners"],
            "identical": report["identical"], "metrics_identical": report["metrics_identical"],
            "parameters_identical": report["parameters_identical"], "rows": report["rows"],
            "first_difference": report["first_difference"], "error": report["error"],
            "sps": {name: r.get("sps") for name, r in report["runs"].items()}}


def run(options: GpuOptions, out: Path) -> dict[str, Any]:
    """Every part; OUT/gpu.json and OUT/gpu.md; the report (``ok``: every run finished, every audit passed,
    the evaluation played and the repeat was identical)."""
    import torch

    from lockstep import config as config_lib
    from lockstep.learner.device import prepare_device

    if options.device.startswith("cuda") and not torch.cuda.is_available():
        raise config_lib.ConfigError(f"--device {options.device}: torch {torch.__version__} sees no CUDA device "
                                     "here; use --device cpu (with --quick for the small check)")
    device = prepare_device(options.device)  # the numerics a learner on it computes with
    if device.type == "cuda":
        # start the context and the caching allocator now: before its first allocation, torch 2.11's
        # reset_peak_memory_stats fails ("Invalid device argument")
        torch.empty(1, device=device)
    out.mkdir(parents=True, exist_ok=True)
    runs_dir = out / "runs"
    runs_dir.mkdir(exist_ok=True)
    began = time.perf_counter()
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    rows, peaks = inference(device, options.quick)
    print(f"[gpu] host syncs per update on {device} ...", flush=True)
    host_syncs = syncs.per_update(device)
    training = []
    for name, (preset, flags, steps, quick_steps, on) in TRAINING.items():
        print(f"[gpu] training {name} on {on or device} ...", flush=True)
        training.append(_train(name, preset, flags, quick_steps if options.quick else steps, on or str(device),
                               runs_dir, options.quick))
        training[-1]["loadavg_1m"] = round(os.getloadavg()[0], 2)
    audits = []
    for name in AUDITS:
        print(f"[gpu] {name} on {device}, audited on the CPU ...", flush=True)
        audits.append(audited(name, str(device), runs_dir, options.quick))
        audits[-1]["loadavg_1m"] = round(os.getloadavg()[0], 2)
    print(f"[gpu] lockstep eval of the hopper run on {device} ...", flush=True)
    evaluated = (evaluate(runs_dir / "hopper", str(device), runs_dir / "hopper.eval.log")
                 if (runs_dir / "hopper" / "summary.json").is_file() else
                 {"run": "hopper", "device": str(device), "error": "not run: the hopper run failed"})
    print(f"[gpu] bench repro of strict Breakout on {device} ...", flush=True)
    repeated = reproduce(str(device), runs_dir, options.quick)
    report = {
        "command": "lockstep bench gpu " + " ".join([f"--out {out}", f"--device {options.device}"]
                                                    + (["--quick"] if options.quick else [])),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpu_count": os.cpu_count(),
        "loadavg_at_start": load_at_start,
        "inference": rows,
        "inference_peak_device_mb": peaks,
        "host_syncs_per_update": host_syncs,
        "training": training,
        "audits": audits,
        "eval": evaluated,
        "repro": repeated,
        "elapsed_s": None,
    }
    report["ok"] = (all(r["error"] is None for r in training) and all(a["audit_passed"] for a in audits)
                    and evaluated["error"] is None and repeated["identical"])
    report["elapsed_s"] = round(time.perf_counter() - began, 1)
    (out / "gpu.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "gpu.md").write_text(markdown(report))
    return report


def _split(split: dict[str, float] | None) -> str:
    return "n/a" if not split else ", ".join(f"{k} {v:g}" for k, v in split.items())


def markdown(report: dict[str, Any]) -> str:
    """gpu.md: the inference table, host syncs, the training runs with their time split and memory, the audits,
    the evaluation and the bitwise repeat."""
    cuda = report["device"].startswith("cuda")
    lines = [
        "# lockstep bench gpu\n",
        f"`{report['command']}` on {report['device_name']} ({report['device']}), torch {report['torch']}"
        f"{', CUDA ' + str(report['cuda']) if cuda else ''}; {report['cpu_count']} CPU cores; load average at "
        f"start {', '.join(map(str, report['loadavg_at_start']))}; {report['elapsed_s']:g} s in all.\n",
        "## Inference (`lockstep.learner.inference.act`, observations to the device and actions back)\n",
        "| model | batch | median latency ms | rows/s | device ms (CUDA events) | calls |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["inference"]:
        lines.append(f"| {r['model']} | {r['batch']:,} | {cell(r['latency_ms'])} | {cell(r['rows_per_s'])} | "
                     f"{cell(r['device_ms'])} | {r['calls']} |")
    if cuda:
        lines += ["", "Peak device memory of the inference passes (MB): "
                  + ", ".join(f"{k} {cell(v)}" for k, v in report["inference_peak_device_mb"].items())]
    lines += ["", "## Host syncs per training update (`lockstep_bench.syncs`; CUDA's debug mode also reports "
              "the blocking host-to-device copies)\n",
              "| case | counted | reported by CUDA's sync debug mode |", "|---|---|---|"]
    lines += [f"| {name} | {r['counted']} | {cell(r['reported'])} |"
              for name, r in report["host_syncs_per_update"].items()]
    lines += ["", "## Training (`lockstep train --device`; `audited-*`: strict with `--audit`)\n",
              "| run | device | env steps | training s | env steps/s | time split s | peak MB (device on CUDA, learner "
              "RSS on the CPU) | process s | load 1m |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in [*report["training"], *report["audits"]]:
        on = r.get("device") or "n/a"
        mem = r.get("peak_device_mb") if on.startswith("cuda") else r.get("learner_peak_rss_mb")
        lines.append("| " + " | ".join([
            r["run"] + (" FAILED" if r["error"] else ""), on, cell(r.get("env_steps")), cell(r.get("wall_s")),
            cell(r.get("sps")), _split(r.get("time_split_s")), cell(mem), cell(r["process_s"]),
            cell(r.get("loadavg_1m"))]) + " |")
    lines += ["", "## Audits (`lockstep audit RUN` with no CUDA device visible: replayed on the CPU)\n"]
    for a in report["audits"]:
        lines.append(f"- `{a['run']}` ({a['preset']}): {'passed' if a['audit_passed'] else 'FAILED'} "
                     f"(exit code {a['audit_exit_code']}): {a['audit_result']}")
    e = report["eval"]
    lines += ["", "## Evaluation (`lockstep eval --device`)\n",
              f"`{e['run']}` on {e['device']}: " + (f"FAILED: {e['error']}" if e["error"] else
                                                    f"{e['episodes']} episodes, mean return {cell(e['return_mean'])}")]
    r = report["repro"]
    verdict = ("identical: yes" if r["identical"] else f"identical: NO ({r['error'] or r['first_difference']})")
    lines += ["", "## Bitwise repeat (`lockstep bench repro`, `learner.deterministic`)\n",
              f"strict {r['preset']} on {r['device']}, {r['iterations']} iteration(s), quiet then beside "
              f"{r['burners']} CPU burner(s): **{verdict}** (metrics.csv rows {r['rows']}, final parameters "
              f"{'identical' if r['parameters_identical'] else 'different'}); env steps/s "
              + ", ".join(f"{k} {cell(v)}" for k, v in r["sps"].items())]
    failed = [x for x in [*report["training"], *report["audits"], e] if x["error"]]
    if failed:
        lines += ["", "Failures:", ""] + [f"- {x['run']}: {x['error']}" for x in failed]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """``python -m lockstep_bench.gpu MEMORY_JSON train ARGS``: ``lockstep train ARGS``, then the process's peak
    device memory (or, without CUDA, its peak RSS) to MEMORY_JSON."""
    import torch

    from lockstep import cli

    memory_path, rest = Path(argv[0]), argv[1:]
    try:
        return cli.run(cli.build_parser().parse_args(rest))
    finally:
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        memory_path.write_text(json.dumps({
            "peak_device_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1) if cuda else None,
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}) + "\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
