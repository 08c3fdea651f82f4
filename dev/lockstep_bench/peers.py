"""``lockstep bench peers``: CleanRL's PPO scripts side by side with the matching lockstep presets.

For each seed and each workload, two fresh processes one right after the other (seed 1 CleanRL,
seed 1 lockstep, then the next workload, then seed 2, ...), so that whatever else the machine is
doing hits both alike:

    cartpole  CleanRL ``ppo.py --env-id CartPole-v1``            against ``lockstep train --config cartpole-cleanrl``
    hopper    CleanRL ``ppo_continuous_action.py --env-id Hopper-v4`` against ``lockstep train --config hopper``
    halfcheetah  the same script with ``--env-id HalfCheetah-v4`` against ``lockstep train --config halfcheetah``

Both train for the same number of env steps with the same seed and report two figures:

* env steps/s over training: CleanRL's own last ``SPS:`` line (global_step over the seconds since
  its ``start_time``, taken after its envs are made); lockstep's summary.json ``sps`` (env steps
  over the seconds since its first phase). Start-up is outside both.
* seconds to a return threshold: when the mean of the last 20 episodes first reached it. For
  lockstep, summary.json ``first_reached``; for CleanRL, each stdout line is time-stamped as it is
  read, its training start is recovered from the first ``SPS:`` line (stamp - steps / SPS), and the
  running mean is taken over its ``episodic_return=`` lines.

CleanRL is never a dependency of the project: it is fetched at run time (``pip download`` of the
``cleanrl`` wheel, whose package holds the scripts) into a throwaway virtual environment under
``--cache`` (default ``OUT/cleanrl``), with the versions its scripts import (gym 0.23.1 for
``ppo.py``; gymnasium 0.29.1 with MuJoCo 2.3.3 for ``ppo_continuous_action.py``; numpy < 2) and
torch pinned to the version running here. ``--python`` and ``--scripts`` use a ready interpreter
and a folder holding the two scripts instead (a CleanRL checkout, say).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import zipfile
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lockstep.observe.run_dir import RunDir
from lockstep_bench import cell
from lockstep_bench.runs import command as lockstep_command
from lockstep_bench.runs import tail

CLEANRL_VERSION = "1.2.0"  # the last wheel; its metadata says Python < 3.11, so pip is told 3.10 and --no-deps
PEER_PACKAGES = ["gym==0.23.1", "pygame", "gymnasium[mujoco]==0.29.1", "mujoco==2.3.3", "numpy<2", "tensorboard"]
WINDOW = 20  # episodes in the running mean, as lockstep's EpisodeTracker
STEP_LINE = re.compile(r"global_step=(\d+), episodic_return=\[?\s*([-+0-9.eE]+|nan)")
SPS_LINE = re.compile(r"^SPS:\s*(\d+)")
RUN_KEYS = ["workload", "seed", "side", "env_steps", "env_steps_per_s", "seconds_to_threshold",
            "env_steps_to_threshold", "final_return", "process_s", "loadavg_start", "loadavg_end", "command", "error"]


@dataclass(frozen=True)
class Workload:
    """One side-by-side pair: a CleanRL script with its env and a lockstep preset, at CleanRL's settings."""

    name: str
    script: str
    env_id: str
    preset: str
    steps: int  # env steps of each run by default
    quick_steps: int
    threshold: float  # the return both runs are timed to
    batch: int  # CleanRL's env steps per update (num_envs x num_steps): the steps at its n-th SPS line


WORKLOADS = {
    "cartpole": Workload("cartpole", "ppo.py", "CartPole-v1", "cartpole-cleanrl", 100_000, 8_192, 195.0, 4 * 128),
    "hopper": Workload("hopper", "ppo_continuous_action.py", "Hopper-v4", "hopper", 40_960, 4_096, 500.0, 2048),
    # HalfCheetah has no early terminations: every episode is 1,000 steps, and a random policy scores about
    # -280, so 0 is the first sign of running forward that both reach within a short run
    "halfcheetah": Workload("halfcheetah", "ppo_continuous_action.py", "HalfCheetah-v4", "halfcheetah", 40_960,
                            4_096, 0.0, 2048),
}


@dataclass
class PeersOptions:
    """What ``lockstep bench peers`` runs."""

    workloads: list[str] = field(default_factory=lambda: list(WORKLOADS))
    seeds: list[int] = field(default_factory=lambda: [1])
    steps: int | None = None  # None: each workload's own (quick_steps with quick)
    quick: bool = False
    cache: Path | None = None  # where the CleanRL venv and scripts live; None: OUT/cleanrl
    python: str | None = None  # a ready interpreter for the scripts instead of the venv
    scripts: Path | None = None  # a folder holding ppo.py and ppo_continuous_action.py instead of the wheel's
    timeout_s: float = 1800.0  # per run
    peer_threads: int = 1  # OMP_NUM_THREADS of CleanRL's runs, as lockstep's learner.torch_threads; 0: torch's own

    def steps_of(self, workload: Workload) -> int:
        if self.steps is not None:
            return self.steps
        return workload.quick_steps if self.quick else workload.steps


def _pip(python: Path | str, args: list[str], log: Path) -> None:
    with open(log, "a") as out:
        rc = subprocess.call([str(python), "-m", "pip", *args], stdout=out, stderr=subprocess.STDOUT)
    if rc != 0:
        raise RuntimeError(f"pip {' '.join(args)} failed (exit {rc}): {tail(log)}")


def prepare(cache: Path) -> tuple[Path, Path]:
    """The CleanRL interpreter and scripts folder under ``cache``, made once: a venv with the scripts' imports
    and the running torch, and the scripts unpacked from the cleanrl wheel. ``cache/ready.json`` marks it done."""
    import torch

    cache.mkdir(parents=True, exist_ok=True)
    python, scripts, ready = cache / "venv" / "bin" / "python", cache / "cleanrl", cache / "ready.json"
    torch_pin = f"torch=={torch.__version__.split('+')[0]}"  # never a newer one: that would download gigabytes
    wanted = {"cleanrl": CLEANRL_VERSION, "packages": [torch_pin, *PEER_PACKAGES]}
    if ready.is_file() and json.loads(ready.read_text()) == wanted and python.is_file():
        return python, scripts
    log = cache / "install.log"
    log.write_text("")
    print(f"[peers] fetching CleanRL {CLEANRL_VERSION} into {cache} (a few minutes) ...", flush=True)
    shutil.rmtree(cache / "venv", ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(cache / "venv")], check=True)
    _pip(python, ["install", "--quiet", torch_pin, *PEER_PACKAGES], log)
    dist = cache / "dist"
    _pip(python, ["download", "--quiet", f"cleanrl=={CLEANRL_VERSION}", "--no-deps", "--only-binary=:all:",
                  "--python-version", "3.10", "-d", str(dist)], log)
    wheel = next(dist.glob(f"cleanrl-{CLEANRL_VERSION}-*.whl"))
    shutil.rmtree(scripts, ignore_errors=True)
    scripts.mkdir()
    with zipfile.ZipFile(wheel) as archive:
        for workload in WORKLOADS.values():
            (scripts / workload.script).write_bytes(archive.read(f"cleanrl/{workload.script}"))
    ready.write_text(json.dumps(wanted))
    return python, scripts


@dataclass
class PeerOutput:
    """What a CleanRL-style run printed, each line stamped (perf_counter seconds) as it was read."""

    returns: list[tuple[float, int, float]] = field(default_factory=list)  # (stamp, global_step, return)
    sps: list[tuple[float, int]] = field(default_factory=list)  # (stamp, SPS)

    def feed(self, stamp: float, line: str) -> None:
        if m := STEP_LINE.search(line):
            self.returns.append((stamp, int(m.group(1)), float(m.group(2))))
        elif m := SPS_LINE.match(line):
            self.sps.append((stamp, int(m.group(1))))

    def training_start(self, batch: int) -> float | None:
        """When its ``start_time`` was, from the first SPS line: that line's stamp less ``batch`` steps at SPS."""
        if not self.sps or self.sps[0][1] <= 0:
            return None
        stamp, sps = self.sps[0]
        return stamp - batch / sps

    def first_reached(self, threshold: float, batch: int) -> tuple[float, int] | None:
        """(seconds from the training start, global_step) when the mean of the last 20 returns first reached
        ``threshold``; None if it never did or the start is unknown."""
        start = self.training_start(batch)
        window: deque[float] = deque(maxlen=WINDOW)
        for stamp, step, value in self.returns:
            window.append(value)
            if start is not None and len(window) == WINDOW and statistics.fmean(window) >= threshold:
                return round(stamp - start, 3), step
        return None

    def final_return(self) -> float | None:
        values = [value for _, _, value in self.returns[-WINDOW:]]
        return round(statistics.fmean(values), 2) if values else None


def run_stamped(cmd: list[str], log_path: Path, timeout_s: float, cwd: Path,
                env: dict[str, str] | None = None) -> tuple[int | None, float, PeerOutput]:
    """Run ``cmd`` in its own session, reading its output line by line, stamping each line as it arrives and
    copying it to ``log_path``; kill its process group after ``timeout_s``. Returns (exit code or None,
    seconds, what it printed)."""
    output = PeerOutput()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd, env=env, text=True,
                            bufsize=1, start_new_session=True)
    killed = threading.Event()

    def kill() -> None:
        killed.set()
        os.killpg(proc.pid, signal.SIGKILL)

    timer = threading.Timer(timeout_s, kill)
    timer.start()
    try:
        with open(log_path, "w", buffering=1) as log:  # line-buffered: the log can be watched as it runs
            assert proc.stdout is not None
            for line in proc.stdout:
                output.feed(time.perf_counter(), line)
                log.write(line)
        rc: int | None = proc.wait()
    finally:
        timer.cancel()
    return (None if killed.is_set() else rc), time.perf_counter() - start, output


def _row(workload: Workload, seed: int, side: str) -> dict[str, Any]:
    row: dict[str, Any] = {k: None for k in RUN_KEYS}
    row.update(workload=workload.name, seed=seed, side=side, loadavg_start=round(os.getloadavg()[0], 2))
    return row


def _error(rc: int | None, timeout_s: float, log_path: Path) -> str | None:
    if rc is None:
        return f"killed after {timeout_s:g} s; see {log_path}"
    if rc != 0:
        return f"exit code {rc}: {tail(log_path)}"
    return None


def run_peer(workload: Workload, seed: int, steps: int, python: str, scripts: Path, work: Path,
             timeout_s: float, threads: int = 1) -> dict[str, Any]:
    """One CleanRL run (in its own folder: it writes runs/ there), its row."""
    row = _row(workload, seed, "cleanrl")
    work.mkdir(parents=True, exist_ok=True)
    cmd = [python, str(scripts / workload.script), "--env-id", workload.env_id, "--total-timesteps", str(steps),
           "--seed", str(seed), "--cuda", "False"]
    log_path = work / "stdout.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONPATH", None)  # the peer's own packages only
    if threads:  # torch's default (one thread per core) spins against itself on a busy machine: 10x slower here
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    rc, process_s, output = run_stamped(cmd, log_path, timeout_s, work, env)
    reached = output.first_reached(workload.threshold, workload.batch)
    row.update(command=" ".join(cmd), process_s=round(process_s, 2), loadavg_end=round(os.getloadavg()[0], 2),
               error=_error(rc, timeout_s, log_path))
    if row["error"] is None and not output.sps:
        row["error"] = f"no 'SPS:' line in its output; see {log_path}"
    if output.sps:
        updates = len(output.sps)
        row.update(env_steps=updates * workload.batch, env_steps_per_s=float(output.sps[-1][1]))
    row.update(seconds_to_threshold=None if reached is None else reached[0],
               env_steps_to_threshold=None if reached is None else reached[1], final_return=output.final_return())
    return row


def run_lockstep(workload: Workload, seed: int, steps: int, run_path: Path, timeout_s: float) -> dict[str, Any]:
    """One ``lockstep train`` of the workload's preset, its row."""
    from lockstep_bench.runs import run_process

    row = _row(workload, seed, "lockstep")
    shutil.rmtree(run_path, ignore_errors=True)
    cmd = lockstep_command(["--config", workload.preset, "--seed", str(seed), "--run-dir", str(run_path),
                            "--name", run_path.name, "--set", f"ppo.total_steps={steps}",
                            "--set", f"run.thresholds=[{workload.threshold:g}]"])
    log_path = run_path.parent / f"{run_path.name}.log"
    rc, process_s = run_process(cmd, log_path, timeout_s, cwd=run_path.parent)
    row.update(command=" ".join(cmd), process_s=round(process_s, 2), loadavg_end=round(os.getloadavg()[0], 2),
               error=_error(rc, timeout_s, log_path))
    summary = RunDir(run_path).summary() if (run_path / "summary.json").is_file() else None
    if summary is None:
        row["error"] = row["error"] or f"no summary.json written; see {log_path}"
        return row
    if summary.get("error"):
        row["error"] = f"learner error: {summary['error']}"
    crossing = summary["first_reached"].get(f"{workload.threshold:g}")
    metrics = RunDir(run_path).metrics()
    final = metrics[-1].get("episode_return_mean20") if metrics else None
    row.update(env_steps=summary["env_steps"], env_steps_per_s=summary["sps"],
               seconds_to_threshold=None if crossing is None else crossing["wall_s"],
               env_steps_to_threshold=None if crossing is None else crossing["env_steps"],
               final_return=None if final is None else round(float(final), 2))
    return row


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present and len(present) == len(values) else None


def summarize(runs: list[dict[str, Any]], workloads: list[str]) -> dict[str, Any]:
    """Per workload and side: median env steps/s and seconds to the threshold (n/a unless every seed has one);
    and lockstep / CleanRL for each (above 1: lockstep steps faster; below 1: lockstep gets there sooner)."""
    out: dict[str, Any] = {}
    for name in workloads:
        entry: dict[str, Any] = {}
        for side in ("cleanrl", "lockstep"):
            rows = [r for r in runs if r["workload"] == name and r["side"] == side]
            entry[side] = {"env_steps_per_s": _median([r["env_steps_per_s"] for r in rows]),
                           "seconds_to_threshold": _median([r["seconds_to_threshold"] for r in rows]),
                           "reached": sum(r["seconds_to_threshold"] is not None for r in rows), "runs": len(rows)}
        for what in ("env_steps_per_s", "seconds_to_threshold"):
            ours, theirs = entry["lockstep"][what], entry["cleanrl"][what]
            entry[f"ratio_{what}"] = round(ours / theirs, 3) if ours is not None and theirs else None
        out[name] = entry
    return out


def run(options: PeersOptions, out: Path, command: str) -> dict[str, Any]:
    """Every seed of every workload, CleanRL then lockstep; OUT/peers.json and OUT/peers.md; the report."""
    import torch

    unknown = [w for w in options.workloads if w not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workload {unknown[0]!r}; workloads: {', '.join(WORKLOADS)}")
    out.mkdir(parents=True, exist_ok=True)
    if options.python is not None and options.scripts is not None:
        python, scripts = options.python, options.scripts
    else:
        venv_python, wheel_scripts = prepare(options.cache or out / "cleanrl")
        python, scripts = options.python or str(venv_python), options.scripts or wheel_scripts
    began, load_at_start = time.perf_counter(), [round(x, 2) for x in os.getloadavg()]
    runs: list[dict[str, Any]] = []
    for seed in options.seeds:
        for name in options.workloads:
            workload, steps = WORKLOADS[name], options.steps_of(WORKLOADS[name])
            for side in ("cleanrl", "lockstep"):
                print(f"[peers] {name} seed {seed} {side}: {steps:,} env steps ...", flush=True)
                base = out / "runs" / f"{name}-s{seed}-{side}"
                base.parent.mkdir(parents=True, exist_ok=True)
                row = (run_peer(workload, seed, steps, python, Path(scripts), base, options.timeout_s,
                                options.peer_threads)
                       if side == "cleanrl" else run_lockstep(workload, seed, steps, base, options.timeout_s))
                runs.append(row)
                print(f"[peers] {name} seed {seed} {side}: "
                      + (f"FAILED: {row['error']}" if row["error"] else
                         f"{cell(row['env_steps_per_s'])} env steps/s, {cell(row['seconds_to_threshold'])} s to "
                         f"{workload.threshold:g}"), flush=True)
    report = {
        "command": command,
        "workloads": {n: {"env": WORKLOADS[n].env_id, "preset": WORKLOADS[n].preset,
                          "script": WORKLOADS[n].script, "threshold": WORKLOADS[n].threshold,
                          "steps": options.steps_of(WORKLOADS[n])} for n in options.workloads},
        "cleanrl": CLEANRL_VERSION if options.scripts is None else str(options.scripts),
        "seeds": list(options.seeds),
        "peer_threads": options.peer_threads,
        "summary": summarize(runs, options.workloads),
        "runs": runs,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "loadavg_at_start": load_at_start,
        "elapsed_s": round(time.perf_counter() - began, 1),
    }
    (out / "peers.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "peers.md").write_text(markdown(report))
    return report


def markdown(report: dict[str, Any]) -> str:
    """peers.md: the medians with their ratios, then every run with the load average beside it."""
    lines = [
        "# lockstep bench peers\n",
        f"`{report['command']}`: CleanRL {report['cleanrl']} against lockstep, interleaved per seed; "
        f"seeds {', '.join(map(str, report['seeds']))}; CleanRL with "
        f"{'OMP_NUM_THREADS=' + str(report['peer_threads']) if report['peer_threads'] else 'torch default threads'}"
        f" (lockstep's learner: learner.torch_threads, 1 unless the preset says); {report['cpu_count']} CPU "
        f"cores, torch {report['torch']}; "
        f"load average at start {', '.join(map(str, report['loadavg_at_start']))}; {report['elapsed_s']:g} s in all.\n",
        "| workload | env steps | threshold | CleanRL env steps/s | lockstep env steps/s | ratio | "
        "CleanRL s to threshold | lockstep s to threshold | ratio |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in report["summary"].items():
        w = report["workloads"][name]
        c, lk = entry["cleanrl"], entry["lockstep"]
        lines.append("| " + " | ".join([
            f"{name} ({w['script']} {w['env']} / {w['preset']})", cell(w["steps"]), f"{w['threshold']:g}",
            cell(c["env_steps_per_s"]), cell(lk["env_steps_per_s"]), cell(entry["ratio_env_steps_per_s"]),
            cell(c["seconds_to_threshold"]), cell(lk["seconds_to_threshold"]),
            cell(entry["ratio_seconds_to_threshold"])]) + " |")
    lines += ["", "| workload | seed | side | env steps | env steps/s | s to threshold | env steps to threshold | "
                  "final return (last 20) | process s | load 1m start / end |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        lines.append("| " + " | ".join([
            r["workload"], str(r["seed"]), r["side"] + (" FAILED" if r["error"] else ""), cell(r["env_steps"]),
            cell(r["env_steps_per_s"]), cell(r["seconds_to_threshold"]), cell(r["env_steps_to_threshold"]),
            cell(r["final_return"]), cell(r["process_s"]), f"{cell(r['loadavg_start'])} / {cell(r['loadavg_end'])}"])
            + " |")
    lines += [
        "",
        "Env steps/s: over training, start-up excluded (CleanRL: its last `SPS:` line; lockstep: summary.json "
        "`sps`); the ratio is lockstep / CleanRL, above 1 when lockstep steps faster. Seconds to threshold: from "
        "the start of training until the mean return of the last 20 episodes first reached it (CleanRL: its "
        "stdout lines time-stamped as read); the ratio is lockstep / CleanRL, below 1 when lockstep gets there "
        "sooner; n/a when a run never reached it. Medians over seeds. Load 1m: the 1-minute load average as "
        "each run started and ended; above the core count, other work competed for the CPUs. CleanRL's Hopper "
        "is Hopper-v4 (its gymnasium 0.29); the lockstep preset runs Hopper-v5.",
    ]
    failed = [r for r in report["runs"] if r["error"]]
    if failed:
        lines += ["", "Failures:", ""] + [f"- {r['workload']} seed {r['seed']} {r['side']}: {r['error']}"
                                          for r in failed]
    return "\n".join(lines) + "\n"
