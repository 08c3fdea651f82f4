"""``lockstep bench peers``: CleanRL's PPO scripts, or Sample Factory's examples, beside the matching lockstep presets.

For each seed and each workload, two fresh processes one right after the other (seed 1 CleanRL,
seed 1 lockstep, then the next workload, then seed 2, ...), so that whatever else the machine is
doing hits both alike:

    cartpole  CleanRL ``ppo.py --env-id CartPole-v1``            against ``lockstep train --config cartpole-cleanrl``
    hopper    CleanRL ``ppo_continuous_action.py --env-id Hopper-v4`` against ``lockstep train --config hopper``
    halfcheetah  the same script with ``--env-id HalfCheetah-v4`` against ``lockstep train --config halfcheetah``
    doom      Sample Factory ``sf_examples.vizdoom.train_vizdoom --env=doom_basic`` against ``--config doom-basic``
    breakout-sf  Sample Factory ``sf_examples.atari.train_atari --env=atari_breakout`` against ``--config breakout``

The Sample Factory pairs (``peers_sf``) run only when named with ``--only``; they report agent steps/s steady
(between its first and last report with frames, as between lockstep's first and last metrics.csv row) and over
the whole process, and both final returns, lockstep trained for the agent steps Sample Factory took.

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
RUN_KEYS = ["workload", "seed", "side", "env_steps", "env_steps_per_s", "steady_steps_per_s", "process_steps_per_s",
            "seconds_to_threshold", "env_steps_to_threshold", "final_return", "process_s", "loadavg_start",
            "loadavg_end", "command", "error"]


@dataclass(frozen=True)
class Workload:
    """One side-by-side pair: a peer's script with its env and a lockstep preset, at the same settings.

    For Sample Factory (``peer="samplefactory"``) ``script`` is its example's module, ``env_id`` its env name,
    ``peer_args`` the flags that give it the preset's shape, ``frameskip`` the env frames it counts per agent step
    and ``reward_scale`` what undoes the scaling of its env's rewards."""

    name: str
    script: str
    env_id: str
    preset: str
    steps: int  # env (agent) steps of each run by default
    quick_steps: int
    threshold: float  # the return both runs are timed to
    batch: int  # the peer's env steps per update (num_envs x num_steps): the steps at CleanRL's n-th SPS line
    peer: str = "cleanrl"
    peer_args: tuple[str, ...] = ()
    frameskip: int = 1
    reward_scale: float = 1.0


WORKLOADS = {
    "cartpole": Workload("cartpole", "ppo.py", "CartPole-v1", "cartpole-cleanrl", 100_000, 8_192, 195.0, 4 * 128),
    "hopper": Workload("hopper", "ppo_continuous_action.py", "Hopper-v4", "hopper", 40_960, 4_096, 500.0, 2048),
    # HalfCheetah has no early terminations: every episode is 1,000 steps, and a random policy scores about
    # -280, so 0 is the first sign of running forward that both reach within a short run
    "halfcheetah": Workload("halfcheetah", "ppo_continuous_action.py", "HalfCheetah-v4", "halfcheetah", 40_960,
                            4_096, 0.0, 2048),
    # Sample Factory's Doom example at the preset's shape: 4 processes x 8 envs, rollouts of 32, batches of 1,024
    # in one epoch of one minibatch. Its doom_basic scales rewards by 0.01 (sf_examples/vizdoom/doom/doom_utils.py,
    # DoomSpec "doom_basic"); lockstep's are the game's own
    "doom": Workload("doom", "sf_examples.vizdoom.train_vizdoom", "doom_basic", "doom-basic", 200_000, 8_192, 0.0,
                     1024, "samplefactory", ("--num_workers=4", "--num_envs_per_worker=8", "--rollout=32",
                                             "--batch_size=1024", "--num_batches_per_epoch=1", "--num_epochs=1"),
                     frameskip=4, reward_scale=100.0),
    # its Atari example at CleanRL's ppo_atari.py shape, as the breakout preset: 2 x 4 envs x 128 steps, 4 epochs
    # x 4 minibatches of 256; its returns are whole games' raw scores (RecordEpisodeStatistics), as lockstep's
    "breakout-sf": Workload("breakout-sf", "sf_examples.atari.train_atari", "atari_breakout", "breakout", 100_000,
                            4_096, 10.0, 1024, "samplefactory",
                            ("--num_workers=2", "--num_envs_per_worker=4", "--rollout=128", "--batch_size=256",
                             "--num_batches_per_epoch=4", "--num_epochs=4"), frameskip=4),
}
DEFAULT_WORKLOADS = [name for name, w in WORKLOADS.items() if w.peer == "cleanrl"]  # Sample Factory's when named
PEERS = {"cleanrl": "CleanRL", "samplefactory": "Sample Factory"}


@dataclass
class PeersOptions:
    """What ``lockstep bench peers`` runs."""

    workloads: list[str] = field(default_factory=lambda: list(DEFAULT_WORKLOADS))
    seeds: list[int] = field(default_factory=lambda: [1])
    steps: int | None = None  # None: each workload's own (quick_steps with quick)
    quick: bool = False
    cache: Path | None = None  # where the CleanRL venv and scripts live (Sample Factory's: its samplefactory/)
    python: str | None = None  # a ready interpreter for the scripts instead of the venv
    scripts: Path | None = None  # a folder holding ppo.py and ppo_continuous_action.py instead of the wheel's
    sf_python: str | None = None  # a ready interpreter with Sample Factory instead of its venv
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


def run_stamped(cmd: list[str], log_path: Path, timeout_s: float, cwd: Path, env: dict[str, str] | None = None,
                output: Any = None) -> tuple[int | None, float, Any]:
    """Run ``cmd`` in its own session, reading its output line by line, stamping each line as it arrives and
    copying it to ``log_path`` and ``output.feed`` (a ``PeerOutput`` unless given); kill its process group after
    ``timeout_s``. Returns (exit code or None, seconds, the output)."""
    output = PeerOutput() if output is None else output
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


def blank_row(workload: Workload, seed: int, side: str) -> dict[str, Any]:
    row: dict[str, Any] = {k: None for k in RUN_KEYS}
    row.update(workload=workload.name, seed=seed, side=side, loadavg_start=round(os.getloadavg()[0], 2))
    return row


def exit_error(rc: int | None, timeout_s: float, log_path: Path) -> str | None:
    if rc is None:
        return f"killed after {timeout_s:g} s; see {log_path}"
    if rc != 0:
        return f"exit code {rc}: {tail(log_path)}"
    return None


def peer_env(threads: int) -> dict[str, str]:
    """A peer's environment: unbuffered output, its own packages only, ``threads`` torch threads (0: torch's)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("PYTHONPATH", None)
    if threads:  # torch's default (one thread per core) spins against itself on a busy machine: 10x slower here
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


def run_peer(workload: Workload, seed: int, steps: int, python: str, scripts: Path, work: Path,
             timeout_s: float, threads: int = 1) -> dict[str, Any]:
    """One CleanRL run (in its own folder: it writes runs/ there), its row."""
    row = blank_row(workload, seed, "cleanrl")
    work.mkdir(parents=True, exist_ok=True)
    cmd = [python, str(scripts / workload.script), "--env-id", workload.env_id, "--total-timesteps", str(steps),
           "--seed", str(seed), "--cuda", "False"]
    log_path = work / "stdout.log"
    rc, process_s, output = run_stamped(cmd, log_path, timeout_s, work, peer_env(threads))
    reached = output.first_reached(workload.threshold, workload.batch)
    row.update(command=" ".join(cmd), process_s=round(process_s, 2), loadavg_end=round(os.getloadavg()[0], 2),
               error=exit_error(rc, timeout_s, log_path))
    if row["error"] is None and not output.sps:
        row["error"] = f"no 'SPS:' line in its output; see {log_path}"
    if output.sps:
        updates = len(output.sps)
        row.update(env_steps=updates * workload.batch, env_steps_per_s=float(output.sps[-1][1]),
                   process_steps_per_s=round(updates * workload.batch / process_s, 1))
    row.update(seconds_to_threshold=None if reached is None else reached[0],
               env_steps_to_threshold=None if reached is None else reached[1], final_return=output.final_return())
    return row


def run_lockstep(workload: Workload, seed: int, steps: int, run_path: Path, timeout_s: float) -> dict[str, Any]:
    """One ``lockstep train`` of the workload's preset, its row."""
    from lockstep_bench.runs import run_process

    row = blank_row(workload, seed, "lockstep")
    shutil.rmtree(run_path, ignore_errors=True)
    cmd = lockstep_command(["--config", workload.preset, "--seed", str(seed), "--run-dir", str(run_path),
                            "--name", run_path.name, "--set", f"ppo.total_steps={steps}",
                            "--set", f"run.thresholds=[{workload.threshold:g}]"])
    log_path = run_path.parent / f"{run_path.name}.log"
    rc, process_s = run_process(cmd, log_path, timeout_s, cwd=run_path.parent)
    row.update(command=" ".join(cmd), process_s=round(process_s, 2), loadavg_end=round(os.getloadavg()[0], 2),
               error=exit_error(rc, timeout_s, log_path))
    summary = RunDir(run_path).summary() if (run_path / "summary.json").is_file() else None
    if summary is None:
        row["error"] = row["error"] or f"no summary.json written; see {log_path}"
        return row
    if summary.get("error"):
        row["error"] = f"learner error: {summary['error']}"
    crossing = summary["first_reached"].get(f"{workload.threshold:g}")
    metrics = RunDir(run_path).metrics()
    final = metrics[-1].get("episode_return_mean20") if metrics else None
    row.update(env_steps=summary["env_steps"], env_steps_per_s=summary["sps"], steady_steps_per_s=steady_rate(metrics),
               process_steps_per_s=round(summary["env_steps"] / process_s, 1),
               seconds_to_threshold=None if crossing is None else crossing["wall_s"],
               env_steps_to_threshold=None if crossing is None else crossing["env_steps"],
               final_return=None if final is None else round(float(final), 2))
    return row


def steady_rate(metrics: list[dict[str, Any]]) -> float | None:
    """Env steps/s of metrics.csv from its first row to its last (the first iteration, with its warm-up, outside),
    as Sample Factory's from its first report with frames to its last; None with fewer than two rows."""
    if len(metrics) < 2 or float(metrics[-1]["wall_s"]) <= float(metrics[0]["wall_s"]):
        return None
    steps = int(metrics[-1]["env_steps"]) - int(metrics[0]["env_steps"])
    return round(steps / (float(metrics[-1]["wall_s"]) - float(metrics[0]["wall_s"])), 1)


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return round(statistics.median(present), 3) if present and len(present) == len(values) else None


MEDIANS = ("env_steps_per_s", "steady_steps_per_s", "process_steps_per_s", "seconds_to_threshold", "final_return")
RATIOS = ("env_steps_per_s", "steady_steps_per_s", "process_steps_per_s", "seconds_to_threshold")


def summarize(runs: list[dict[str, Any]], workloads: list[str]) -> dict[str, Any]:
    """Per workload and side (its peer's, then lockstep): the medians of each rate, of the seconds to the
    threshold and of the final return (n/a unless every seed has one); and lockstep / the peer for each rate and
    the seconds (above 1: lockstep steps faster; below 1: lockstep gets there sooner)."""
    out: dict[str, Any] = {}
    for name in workloads:
        peer = WORKLOADS[name].peer
        entry: dict[str, Any] = {"peer": peer}
        for side in (peer, "lockstep"):
            rows = [r for r in runs if r["workload"] == name and r["side"] == side]
            entry[side] = {what: _median([r[what] for r in rows]) for what in MEDIANS}
            entry[side].update(reached=sum(r["seconds_to_threshold"] is not None for r in rows), runs=len(rows))
        for what in RATIOS:
            ours, theirs = entry["lockstep"][what], entry[peer][what]
            entry[f"ratio_{what}"] = round(ours / theirs, 3) if ours is not None and theirs else None
        out[name] = entry
    return out


def run(options: PeersOptions, out: Path, command: str) -> dict[str, Any]:
    """Every seed of every workload, its peer (CleanRL or Sample Factory) then lockstep; OUT/peers.json and
    OUT/peers.md; the report."""
    import torch

    from lockstep_bench import peers_sf

    unknown = [w for w in options.workloads if w not in WORKLOADS]
    if unknown:
        raise ValueError(f"unknown workload {unknown[0]!r}; workloads: {', '.join(WORKLOADS)}")
    out.mkdir(parents=True, exist_ok=True)
    peers = {WORKLOADS[name].peer for name in options.workloads}
    python, scripts, sf_python = options.python, options.scripts, options.sf_python
    if "cleanrl" in peers and (python is None or scripts is None):
        venv_python, wheel_scripts = prepare(options.cache or out / "cleanrl")
        python, scripts = python or str(venv_python), scripts or wheel_scripts
    if "samplefactory" in peers and sf_python is None:
        sf_python = str(peers_sf.prepare((options.cache or out) / "samplefactory"))
    device = "gpu" if torch.cuda.is_available() else "cpu"  # where lockstep's learner.device auto puts it
    began, load_at_start = time.perf_counter(), [round(x, 2) for x in os.getloadavg()]
    runs: list[dict[str, Any]] = []
    for seed in options.seeds:
        for name in options.workloads:
            workload, steps = WORKLOADS[name], options.steps_of(WORKLOADS[name])
            for side in (workload.peer, "lockstep"):
                if side == "lockstep" and workload.peer == "samplefactory" and runs[-1]["env_steps"]:
                    steps = runs[-1]["env_steps"]  # it overshoots by whole batches: the returns at equal steps
                print(f"[peers] {name} seed {seed} {side}: {steps:,} env steps ...", flush=True)
                base = out / "runs" / f"{name}-s{seed}-{side}"
                base.parent.mkdir(parents=True, exist_ok=True)
                if side == "cleanrl":
                    row = run_peer(workload, seed, steps, str(python), Path(str(scripts)), base, options.timeout_s,
                                   options.peer_threads)
                elif side == "samplefactory":
                    row = peers_sf.run_sf(workload, seed, steps, str(sf_python), base, options.timeout_s,
                                          options.peer_threads, device)
                else:
                    row = run_lockstep(workload, seed, steps, base, options.timeout_s)
                runs.append(row)
                print(f"[peers] {name} seed {seed} {side}: "
                      + (f"FAILED: {row['error']}" if row["error"] else
                         f"{cell(row['env_steps_per_s'])} env steps/s, {cell(row['seconds_to_threshold'])} s to "
                         f"{workload.threshold:g}"), flush=True)
    report = {
        "command": command,
        "workloads": {n: {"env": WORKLOADS[n].env_id, "preset": WORKLOADS[n].preset, "peer": WORKLOADS[n].peer,
                          "script": WORKLOADS[n].script, "threshold": WORKLOADS[n].threshold,
                          "steps": options.steps_of(WORKLOADS[n])} for n in options.workloads},
        "cleanrl": CLEANRL_VERSION if options.scripts is None else str(options.scripts),
        "samplefactory": peers_sf.SF_VERSION if options.sf_python is None else options.sf_python,
        "seeds": list(options.seeds),
        "peer_threads": options.peer_threads,
        "summary": summarize(runs, options.workloads),
        "runs": runs,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "loadavg_at_start": load_at_start,
        "elapsed_s": round(time.perf_counter() - began, 1),
    }
    report["figures"] = peers_sf.draw_curves(out, runs)
    (out / "peers.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "peers.md").write_text(markdown(report))
    return report


def markdown(report: dict[str, Any]) -> str:
    """peers.md: the medians with their ratios (a table per peer), then every run with the load average beside it."""
    from lockstep_bench import peers_sf

    summary = report["summary"]
    names = {"cleanrl": f"CleanRL {report['cleanrl']}", "samplefactory": f"Sample Factory {report['samplefactory']}"}
    lines = [
        "# lockstep bench peers\n",
        f"`{report['command']}`: {' and '.join(sorted({names[e['peer']] for e in summary.values()}))} "
        f"against lockstep, interleaved per seed; seeds {', '.join(map(str, report['seeds']))}; the peers with "
        f"{'OMP_NUM_THREADS=' + str(report['peer_threads']) if report['peer_threads'] else 'torch default threads'}"
        f" (lockstep's learner: learner.torch_threads, 1 unless the preset says); {report['cpu_count']} CPU "
        f"cores, torch {report['torch']}; "
        f"load average at start {', '.join(map(str, report['loadavg_at_start']))}; {report['elapsed_s']:g} s in all.\n",
    ]
    cleanrl = {name: entry for name, entry in summary.items() if entry["peer"] == "cleanrl"}
    if cleanrl:
        lines += ["| workload | env steps | threshold | CleanRL env steps/s | lockstep env steps/s | ratio | "
                  "CleanRL s to threshold | lockstep s to threshold | ratio |",
                  "|---|---|---|---|---|---|---|---|---|"]
    for name, entry in cleanrl.items():
        w = report["workloads"][name]
        c, lk = entry["cleanrl"], entry["lockstep"]
        lines.append("| " + " | ".join([
            f"{name} ({w['script']} {w['env']} / {w['preset']})", cell(w["steps"]), f"{w['threshold']:g}",
            cell(c["env_steps_per_s"]), cell(lk["env_steps_per_s"]), cell(entry["ratio_env_steps_per_s"]),
            cell(c["seconds_to_threshold"]), cell(lk["seconds_to_threshold"]),
            cell(entry["ratio_seconds_to_threshold"])]) + " |")
    sample_factory = {name: entry for name, entry in summary.items() if entry["peer"] == "samplefactory"}
    lines += peers_sf.table(sample_factory, report["workloads"]) if sample_factory else []
    lines += ["", "| workload | seed | side | env steps | env steps/s | steady | whole process | s to threshold | "
                  "env steps to threshold | final return (last 20) | process s | load 1m start / end |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        lines.append("| " + " | ".join([
            r["workload"], str(r["seed"]), r["side"] + (" FAILED" if r["error"] else ""), cell(r["env_steps"]),
            cell(r["env_steps_per_s"]), cell(r["steady_steps_per_s"]), cell(r["process_steps_per_s"]),
            cell(r["seconds_to_threshold"]), cell(r["env_steps_to_threshold"]), cell(r["final_return"]),
            cell(r["process_s"]), f"{cell(r['loadavg_start'])} / {cell(r['loadavg_end'])}"]) + " |")
    lines += [
        "",
        "Env steps/s: over training (CleanRL: its last `SPS:` line; lockstep: summary.json `sps`; both without "
        "start-up; Sample Factory: its closing `Collected ..., FPS:`, over its runner's main loop, which holds its "
        "workers' start-up); the ratio is lockstep / the peer, above 1 when lockstep steps faster. "
        "Steady: from the first report with steps to the last (lockstep: "
        "metrics.csv rows; Sample Factory: its `Fps is ... Total num frames:` lines). Whole process: env steps over "
        "the process's seconds, start-up in. Seconds to threshold: from "
        "the start of training until the mean return of the last 20 episodes first reached it (CleanRL: its "
        "stdout lines time-stamped as read); the ratio is lockstep / CleanRL, below 1 when lockstep gets there "
        "sooner; n/a when a run never reached it. Medians over seeds. Load 1m: the 1-minute load average as "
        "each run started and ended; above the core count, other work competed for the CPUs. CleanRL's Hopper "
        "is Hopper-v4 (its gymnasium 0.29); the lockstep preset runs Hopper-v5.",
    ]
    lines += [peers_sf.NOTE] if sample_factory else []
    lines += ["", "Curves: " + ", ".join(f"![{name}]({name})" for name in report["figures"])
              + " (each side's mean and min-max over its seeds; Sample Factory's seconds from its first report)."
              ] if report.get("figures") else []
    failed = [r for r in report["runs"] if r["error"]]
    if failed:
        lines += ["", "Failures:", ""] + [f"- {r['workload']} seed {r['seed']} {r['side']}: {r['error']}"
                                          for r in failed]
    return "\n".join(lines) + "\n"
