"""Running the learner as a subprocess for a benchmark: its command, its log, its timeout and its run directory.

Every benchmark that starts ``lockstep train`` (or ``lockstep learner``) starts it here. A run with
none of a benchmark's ``Knobs`` set is the real ``lockstep train``; one with knobs runs
``python -m lockstep_bench.train``, which is ``lockstep train`` with the benchmark's parts injected
into the learner (``lockstep_bench.hooks``), so the runtime carries no benchmark flag.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from lockstep.observe.run_dir import RunDir


def run_process(cmd: list[str], log_path: Path, timeout_s: float | None,
                cwd: Path | None = None) -> tuple[int | None, float]:
    """Run ``cmd`` (in ``cwd``: MuJoCo writes MUJOCO_LOG.TXT into the working directory) in its own session,
    output to ``log_path``; kill its process group on timeout. Returns (exit code or None, seconds)."""
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
    return rc, time.perf_counter() - start


def tail(path: Path, lines: int = 5) -> str:
    """The last lines of a log, joined on one line for an error message."""
    try:
        return " | ".join(path.read_text().strip().splitlines()[-lines:])
    except OSError:
        return ""


@dataclass(frozen=True)
class Knobs:
    """What a benchmark changes in the learner; each is a flag of ``python -m lockstep_bench.train``."""

    jitter_ms: float = 0.0  # adversarial delays up to this in inference, training, publishing and guards
    collect_only: bool = False  # check and count every batch, never update the policy
    design: str = ""  # a reference synchronization design (``lockstep_bench.reference``) instead of sync.strategy's
    inference_threads: int = 2  # with ``design``: the threads that run its forward passes

    def flags(self) -> list[str]:
        return ([f"--jitter-ms={self.jitter_ms:g}"] if self.jitter_ms else []) + (
            ["--collect-only"] if self.collect_only else []) + (
            [f"--design={self.design}", f"--inference-threads={self.inference_threads}"] if self.design else [])


NO_KNOBS = Knobs()


def command(args: list[str], knobs: Knobs = NO_KNOBS, subcommand: str = "train") -> list[str]:
    """``lockstep SUBCOMMAND ARGS --no-progress``, through the benchmark entry point when a knob is set."""
    if knobs == NO_KNOBS:
        return [sys.executable, "-m", "lockstep", subcommand, *args, "--no-progress"]
    if subcommand != "train":
        raise ValueError(f"benchmark knobs apply to lockstep train only, not lockstep {subcommand}")
    return [sys.executable, "-m", "lockstep_bench.train", *knobs.flags(), *args, "--no-progress"]


@dataclass
class TrainRun:
    """One finished (or killed) learner subprocess and the run directory it wrote."""

    command: list[str]
    run: RunDir
    log_path: Path
    returncode: int | None  # None: killed at the timeout
    process_s: float
    timeout_s: float | None

    @property
    def error(self) -> str | None:
        """Why the run gave no result, naming its log; None when it exited 0 and wrote summary.json."""
        if self.returncode is None:
            return f"killed after {self.timeout_s:g} s; see {self.log_path}"
        if self.returncode != 0:
            return f"exit code {self.returncode}: {tail(self.log_path)}"
        if not self.run.summary_path.is_file():
            return f"no summary.json written; see {self.log_path}"
        return None


def train(config_path: Path, run_dir: Path, log_path: Path, timeout_s: float | None, flags: tuple[str, ...] = (),
          knobs: Knobs = NO_KNOBS, cwd: Path | None = None) -> TrainRun:
    """``lockstep train --config CONFIG_PATH --run-dir RUN_DIR FLAGS`` to the end, its output in ``log_path``;
    killed (with its actors: its process group) after ``timeout_s``."""
    cmd = command(["--config", str(config_path), "--run-dir", str(run_dir), *flags], knobs)
    rc, process_s = run_process(cmd, log_path, timeout_s, cwd=cwd)
    return TrainRun(cmd, RunDir(run_dir), log_path, rc, process_s, timeout_s)


def start(args: list[str], log: IO[str], subcommand: str = "train", knobs: Knobs = NO_KNOBS,
          new_session: bool = False, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``lockstep SUBCOMMAND ARGS`` and return at once, for a benchmark that watches, kills or resumes it;
    ``new_session``: in its own process group, so that the caller can kill it with its actors; ``env``: its
    environment (this one's by default)."""
    return subprocess.Popen(command(args, knobs, subcommand), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=new_session, env=env)
