"""Sample Factory 2.1.1 as a peer of ``lockstep bench peers``: its throwaway venv, its command line and its log.

Sample Factory is never a dependency of the project: ``prepare`` makes a virtual environment under the cache
folder at benchmark time with ``sample-factory==2.1.1`` and what its examples import (ViZDoom 1.2.4; ale-py 0.9,
whose wheel carries the Atari ROMs), inside the bounds Sample Factory declares (gymnasium < 1, numpy < 2), and
the torch already on this machine (a range capped at the running release: the newest torch of the index would
pull gigabytes of CUDA libraries).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from lockstep_bench import cell
from lockstep_bench.peers import Workload, blank_row, exit_error, peer_env, run_stamped

SF_VERSION = "2.1.1"
SF_PACKAGES = [f"sample-factory=={SF_VERSION}", "gymnasium<1", "numpy<2", "vizdoom==1.2.4", "ale-py==0.9.*"]
# gymnasium < 1 finds the Atari env ids only once ale_py is imported (gymnasium[atari] of that era did it with
# shimmy's plugin, which wants ale-py 0.8 and its ROMs from elsewhere), and Sample Factory's Atari example imports
# gymnasium alone, in each worker process: a .pth line in the venv imports ale_py in every one of its interpreters
ALE_PTH = ("lockstep_peers_ale.pth", 'import importlib.util as u; u.find_spec("ale_py") and __import__("ale_py")\n')


def torch_range() -> str:
    """``torch>=2.2,<=R``, R the running torch's release: any torch Sample Factory runs on that needs no download."""
    import torch

    return f"torch>=2.2,<={torch.__version__.split('+')[0]}"


def prepare(cache: Path) -> Path:
    """The interpreter of Sample Factory's venv under ``cache``, made once; ``cache/ready.json`` marks it done and
    names what it holds, so that a changed package list makes it anew. A failed pip names its log."""
    cache.mkdir(parents=True, exist_ok=True)
    python, ready, log = cache / "venv" / "bin" / "python", cache / "ready.json", cache / "install.log"
    wanted = {"sample-factory": SF_VERSION, "packages": [torch_range(), *SF_PACKAGES], "pth": ALE_PTH[1]}
    if ready.is_file() and json.loads(ready.read_text()) == wanted and python.is_file():
        return python
    ready.unlink(missing_ok=True)
    log.write_text("")
    print(f"[peers] installing Sample Factory {SF_VERSION} into {cache / 'venv'} (a few minutes; log {log}) ...",
          flush=True)
    shutil.rmtree(cache / "venv", ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(cache / "venv")], check=True)
    with open(log, "a") as out:
        rc = subprocess.call([str(python), "-m", "pip", "install", *wanted["packages"]], stdout=out,
                             stderr=subprocess.STDOUT)
    if rc != 0:
        raise RuntimeError(f"installing Sample Factory {SF_VERSION} failed (pip exit {rc}); see {log}")
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    (Path(purelib) / ALE_PTH[0]).write_text(ALE_PTH[1])
    ready.write_text(json.dumps(wanted))
    return python


# Sample Factory's console lines (sample_factory/utils/utils.py:36, colorlog's "%(log_color)s[%(asctime)s]
# [%(process)05d] %(message)s"), coloured even into a pipe, from sample_factory/algo/runners/runner.py:348
# ("Fps is %s. Total num frames: %d. ..."), :362 ("Avg episode reward: %r" of [(policy, "%.3f")]) and :783
# ("Collected %r, FPS: %.1f" of {policy: env steps}); its env steps count frames (x env_frameskip)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[\s*\d+\] ")
FPS_LINE = re.compile(r"Fps is \(.*\)\. Total num frames: (\d+)\.")
REWARD_LINE = re.compile(r"Avg episode reward: \[\(0, '([-+0-9.eE]+|nan)'\)")
COLLECTED_LINE = re.compile(r"Collected \{0: (\d+)\}, FPS: ([-+0-9.eE]+|nan)")


@dataclass
class SfOutput:
    """What a Sample Factory run printed, read by its own time stamps (the seconds of each line's asctime)."""

    frames: list[tuple[float, int]] = field(default_factory=list)  # (stamp, total frames) of each Fps line
    rewards: list[float] = field(default_factory=list)  # each "Avg episode reward" (its last stats_avg episodes)
    # the learning curve: (stamp, total frames, reward) of each reward with the Fps report printed before it
    curve: list[tuple[float, int, float]] = field(default_factory=list)
    collected: int | None = None  # the frames of its closing "Collected" line
    main_loop_fps: float | None = None  # that line's FPS: frames over its main loop's seconds

    def feed(self, _stamp: float, line: str) -> None:
        line = ANSI.sub("", line).strip()
        stamp = STAMP.match(line)
        if m := FPS_LINE.search(line):
            if stamp:
                when = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                self.frames.append((when, int(m.group(1))))
        elif m := REWARD_LINE.search(line):
            self.rewards.append(float(m.group(1)))
            if self.frames:
                self.curve.append((*self.frames[-1], float(m.group(1))))
        elif m := COLLECTED_LINE.search(line):
            self.collected, self.main_loop_fps = int(m.group(1)), float(m.group(2))

    def steady_frames_per_s(self) -> float | None:
        """Frames per second from the first report with frames to the last: start-up and the first batch (its
        compilation and warm-up) outside; None with fewer than two such reports."""
        counted = [(t, f) for t, f in self.frames if f > 0]
        if len(counted) < 2 or counted[-1][0] <= counted[0][0]:
            return None
        (t0, f0), (t1, f1) = counted[0], counted[-1]
        return (f1 - f0) / (t1 - t0)


def command(python: str, module: str, env: str, flags: tuple[str, ...], seed: int, agent_steps: int, frameskip: int,
            train_dir: Path, device: str) -> list[str]:
    """Sample Factory's training command (flags of sample_factory/cfg/cfg.py): ``agent_steps`` x ``frameskip``
    env frames, the workload's shape ``flags``, and the mean return over the last 20 episodes as lockstep's."""
    return [python, "-m", module, f"--env={env}", f"--experiment={env}-s{seed}", f"--train_dir={train_dir}",
            *flags, f"--train_for_env_steps={agent_steps * frameskip}", f"--seed={seed}", f"--device={device}",
            "--stats_avg=20", "--restart_behavior=overwrite"]


def run_sf(workload: Workload, seed: int, steps: int, python: str, work: Path, timeout_s: float, threads: int,
           device: str) -> dict[str, Any]:
    """One Sample Factory run (its train_dir in ``work``), its row in agent steps: its frames / frameskip."""
    row = blank_row(workload, seed, "samplefactory")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    cmd = command(python, workload.script, workload.env_id, workload.peer_args, seed, steps, workload.frameskip,
                  work / "train_dir", device)
    log_path = work / "stdout.log"
    rc, process_s, output = run_stamped(cmd, log_path, timeout_s, work, peer_env(threads), SfOutput())
    row.update(command=" ".join(cmd), process_s=round(process_s, 2), loadavg_end=round(os.getloadavg()[0], 2),
               error=exit_error(rc, timeout_s, log_path))
    if output.collected is None:
        row["error"] = row["error"] or f"no 'Collected' line in its output; see {log_path}"
        return row
    write_curve(work / CURVE, output, workload)
    agent_steps = output.collected // workload.frameskip
    steady = output.steady_frames_per_s()
    row.update(env_steps=agent_steps, process_steps_per_s=round(agent_steps / process_s, 1),
               env_steps_per_s=None if output.main_loop_fps is None else round(
                   output.main_loop_fps / workload.frameskip, 1),
               steady_steps_per_s=None if steady is None else round(steady / workload.frameskip, 1),
               final_return=round(output.rewards[-1] * workload.reward_scale, 2) if output.rewards else None)
    return row


CURVE = "curve.csv"  # a run's learning curve, beside its log


def write_curve(path: Path, output: SfOutput, workload: Workload) -> None:
    """The run's curve in metrics.csv's columns (``lockstep.observe.plot`` reads both): agent steps (its frames /
    frameskip), seconds since its first report (its runner's start), the mean of its last 20 returns (unscaled);
    the reports before its first finished episode (a NaN reward) left out."""
    start = output.frames[0][0] if output.frames else 0.0
    lines = ["env_steps,wall_s,episode_return_mean20"]
    lines += [f"{frames // workload.frameskip},{stamp - start:.3f},{reward * workload.reward_scale:g}"
              for stamp, frames, reward in output.curve if reward == reward]
    path.write_text("\n".join(lines) + "\n")


def read_curve(path: Path, name: str) -> Any:
    """A curve written by ``write_curve``, as ``lockstep.observe.plot`` draws it."""
    import numpy as np

    from lockstep.observe import plot

    table = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2).reshape(-1, 3)
    return plot.Curve(name, table[:, 0], table[:, 1], table[:, 2])


def draw_curves(out: Path, runs: list[dict[str, Any]]) -> list[str]:
    """``learning-NAME.png`` for each Sample Factory workload: both sides' mean and min-max over their seeds, against
    agent steps and seconds since training started. The file names written; none without matplotlib."""
    from lockstep.observe import plot

    written = []
    for name in dict.fromkeys(r["workload"] for r in runs if r["side"] == "samplefactory"):
        done = [r for r in runs if r["workload"] == name and not r["error"]]
        sides = {"samplefactory": [], "lockstep": []}
        for r in done:
            base = out / "runs" / f"{name}-s{r['seed']}-{r['side']}"
            curve = (read_curve(base / CURVE, base.name) if r["side"] == "samplefactory"
                     else plot.read_curve(base))
            if len(curve.values):
                sides[r["side"]].append(curve)
        groups = [plot.Group(label, sides[side], unit="seeds") for side, label in
                  (("samplefactory", f"Sample Factory {SF_VERSION}"), ("lockstep", "lockstep")) if sides[side]]
        try:
            path = plot.draw(groups, out / f"learning-{name}.png", f"{name}: lockstep and Sample Factory",
                             ylabel="return (mean of the last 20 episodes)")
        except (plot.PlotUnavailable, ValueError) as err:  # no matplotlib, or curves that do not overlap
            print(f"[peers] no curves for {name}: {err}", flush=True)
            continue
        written.append(path.name)
    return written


NOTE = ("\nSample Factory: env steps are agent steps (policy decisions), its frames / env_frameskip; it stops at "
        "the first report past the budget, so it may run a batch or more beyond it. Final return: its last `Avg "
        "episode reward` over 20 episodes (`--stats_avg=20`), times the workload's reward scale (100 for doom_basic, "
        "whose rewards it scales by 0.01), against the mean of lockstep's last 20 at the end of its run; lockstep "
        "trains for the agent steps Sample Factory took in the same seed, so both returns are at equal steps. Its "
        "seconds to the threshold are not read (n/a): its returns come every 5 s, stamped from its own start.")


def table(summary: dict[str, Any], workloads: dict[str, Any]) -> list[str]:
    """The Sample Factory workloads' medians: agent steps/s steady and whole process with lockstep / Sample Factory,
    and the final returns."""
    lines = ["", "| workload | budget (agent steps) | SF steady | lockstep steady | ratio | SF whole process | "
                 "lockstep whole process | ratio | SF final return | lockstep final return |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, entry in summary.items():
        w, sf, lk = workloads[name], entry["samplefactory"], entry["lockstep"]
        lines.append("| " + " | ".join([
            f"{name} ({w['script']} {w['env']} / {w['preset']})", cell(w["steps"]),
            cell(sf["steady_steps_per_s"]), cell(lk["steady_steps_per_s"]), cell(entry["ratio_steady_steps_per_s"]),
            cell(sf["process_steps_per_s"]), cell(lk["process_steps_per_s"]),
            cell(entry["ratio_process_steps_per_s"]), cell(sf["final_return"]), cell(lk["final_return"])]) + " |")
    return lines
