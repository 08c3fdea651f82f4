"""Benchmarks (``lockstep bench ...``): each writes a Markdown table and a JSON file to ``--out``."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any


def cell(value: Any) -> str:
    """One Markdown table cell: thousands separators, four significant digits, n/a for missing."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


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
    try:
        return " | ".join(path.read_text().strip().splitlines()[-lines:])
    except OSError:
        return ""
