"""``lockstep bench soak``: train while killing actors (and once the learner), then check the books.

Runs ``lockstep train`` as a child process with a checkpoint every iteration,
sends SIGKILL to a random actor process on a schedule, kills the learner once
half-way and resumes it with ``--resume``, and reports:

    deadlocks              times training made no progress for ``deadlock_s`` while running
    off_policy_samples     over every metrics.csv row
    transitions_*          collected = trained + dropped, from the final summary (a resumed run
                           continues the books from its checkpoint)
    actor_restarts         restarts by the train command's supervisor, both runs
    learner_restarts       1 (the resume)
    final_return           mean return of the last 100 episodes
    exit_code, error       the resumed ``lockstep train``'s exit code, and the error in its summary.json
    problems, healthy      what makes the soak unhealthy (``problems``), and whether anything does
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lockstep.common.files import atomic_write
from lockstep.config import Config
from lockstep.config import save as save_config
from lockstep.observe.run_dir import RunDir
from lockstep_bench import runs


@dataclass
class SoakOptions:
    minutes: float = 3.0
    kill_every_s: float = 12.0
    deadlock_s: float = 30.0
    seed: int = 1
    actors: int = 4
    envs_per_actor: int = 4


def actor_pids(parent: int) -> list[int]:
    """Actor processes that `lockstep train` (pid ``parent``) spawned, not multiprocessing's resource tracker."""
    out = subprocess.run(["ps", "-ww", "-o", "pid=,args=", "--ppid", str(parent)], capture_output=True, text=True,
                         check=False).stdout
    return [int(line.split()[0]) for line in out.splitlines() if "spawn_main" in line]


class _Run:
    """One `lockstep train` child, watched for progress."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.log = log_path.open("a")
        self.proc = runs.start(args, self.log)

    def alive(self) -> bool:
        return self.proc.poll() is None


def run(opts: SoakOptions, out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "run"
    config = Config()
    config.actors.count, config.actors.envs_per_actor = opts.actors, opts.envs_per_actor
    config.ppo.steps_per_env = 64
    config.ppo.total_steps = 10**9
    config.ppo.lr = 1e-3
    config.run.seed = opts.seed
    config.run.checkpoint_every = 1
    config.run.time_limit_s = opts.minutes * 60
    config.run.thresholds = [195.0, 475.0]
    config_path = out / "soak.yaml"
    save_config(config, config_path)
    rng = random.Random(opts.seed)
    log_path = out / "soak.log"
    if log_path.exists():
        log_path.unlink()

    deadlocks = actor_kills = 0
    learner_killed = False
    current = _Run(["--config", str(config_path), "--run-dir", str(run_dir)], log_path)
    start = time.monotonic()
    next_kill = start + opts.kill_every_s
    last_rows, last_progress = 0, time.monotonic()
    budget = opts.minutes * 60 * 2 + 120  # generous: start-up, the resume, and the final phase
    while current.alive() and time.monotonic() - start < budget:
        time.sleep(0.5)
        now = time.monotonic()
        rows = len(RunDir(run_dir).metrics())
        if rows != last_rows:
            last_rows, last_progress = rows, now
        elif rows and now - last_progress > opts.deadlock_s:
            deadlocks += 1
            print(f"soak: no progress for {opts.deadlock_s:.0f} s at iteration {rows}: counted as a deadlock",
                  file=sys.stderr)
            last_progress = now
        if not learner_killed and rows and now - start > opts.minutes * 30:
            print(f"soak: SIGKILL to the learner at iteration {rows}; resuming", file=sys.stderr)
            current.proc.send_signal(signal.SIGKILL)
            current.proc.wait()
            learner_killed = True
            time.sleep(1.0)
            current = _Run(["--resume", str(run_dir)], log_path)
            last_progress = time.monotonic()
            continue
        if rows and now >= next_kill:
            pids = actor_pids(current.proc.pid)
            if pids:
                os.kill(rng.choice(pids), signal.SIGKILL)
                actor_kills += 1
            next_kill = now + opts.kill_every_s * rng.uniform(0.5, 1.5)
    if current.alive():
        current.proc.kill()
        deadlocks += 1
    current.proc.wait()
    current.log.close()

    report = build_report(run_dir, log_path, minutes=opts.minutes, deadlocks=deadlocks, actor_kills=actor_kills,
                          learner_restarts=int(learner_killed), exit_code=current.proc.returncode)
    atomic_write(out / "soak.json", json.dumps(report, indent=2) + "\n")
    return report


def build_report(run_dir: Path, log_path: Path, *, minutes: float, deadlocks: int, actor_kills: int,
                 learner_restarts: int, exit_code: int | None) -> dict[str, Any]:
    """The soak report from what the run left behind (``summary.json``, ``metrics.csv``, the log) and
    what the soak saw (``exit_code``: the last ``lockstep train``'s, None if it never exited).

    Ends with ``problems`` and ``healthy`` (see ``problems``)."""
    run = RunDir(run_dir)
    summary = run.summary() or {}
    rows = run.metrics()
    report = {
        "minutes": minutes,
        "deadlocks": deadlocks,
        "off_policy_samples": sum(r["off_policy_samples"] for r in rows),
        "transitions_collected": summary.get("transitions_collected"),
        "transitions_trained": summary.get("transitions_trained"),
        "transitions_dropped": summary.get("dropped_transitions"),
        "balanced": bool(summary) and summary["transitions_collected"]
        == summary["transitions_trained"] + summary["dropped_transitions"],
        "actor_kills": actor_kills,
        "actor_restarts": log_path.read_text().count("restarting actor") if log_path.exists() else 0,
        "learner_restarts": learner_restarts,
        "iterations": len(rows),
        "iterations_contiguous": [r["iteration"] for r in rows] == list(range(1, len(rows) + 1)),
        "final_return": summary.get("episode_return_mean"),
        "exit_code": exit_code,
        "summary_found": bool(summary),
        "error": summary.get("error"),
    }
    report["problems"] = problems(report)
    report["healthy"] = not report["problems"]
    return report


def problems(report: dict[str, Any]) -> list[str]:
    """What makes a soak unhealthy, one line each; empty when it is healthy.

    Unhealthy: a deadlock, an off-policy sample, a transition account that does not balance (or
    no ``summary.json`` to check it with), a ``lockstep train`` that did not exit 0 (it crashed,
    was killed, or never finished), or an error recorded in ``summary.json`` (a learner that failed
    writes its summary and error before it stops).
    """
    found = []
    if report["deadlocks"]:
        found.append(f"{report['deadlocks']} deadlock(s)")
    if report["off_policy_samples"]:
        found.append(f"{report['off_policy_samples']} off-policy sample(s)")
    if not report["summary_found"]:
        found.append("no summary.json: the run did not finish, so its transitions cannot be balanced")
    elif not report["balanced"]:
        found.append(f"transitions do not balance: collected {report['transitions_collected']} != trained "
                     f"{report['transitions_trained']} + dropped {report['transitions_dropped']}")
    if report["exit_code"] != 0:
        found.append(f"lockstep train exited with {report['exit_code']} (0 expected; see soak.log)")
    if report.get("error"):
        found.append(f"the run recorded an error: {report['error']}")
    return found


def healthy(report: dict[str, Any]) -> bool:
    """True when ``problems(report)`` finds nothing: what ``lockstep bench soak``'s exit code should say."""
    return not problems(report)
