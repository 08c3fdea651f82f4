"""Faults of several learners (torchrun, 2 ranks on gloo, real actor processes):

* every actor of rank 1 dies for good (SIGKILL, restarts off): rank 1 closes its phases empty and keeps
  taking part in the updates, so rank 0 trains on to the step budget instead of waiting in a collective
  for the process group's timeout (1,800 s);
* a SIGTERM to one rank stops every rank after the same iteration, each with its final checkpoint, and
  no rank fails in a collective the stopped one left;
* checkpoints are agreed: rank 0 decides when (``--checkpoint-minutes`` on rank 0's clock), so both ranks
  hold the same iterations; a resume whose newest checkpoints differ (rank 1's newest ones deleted, as a
  job killed between the ranks' saves leaves them) continues on both ranks from the newest iteration both
  have, and trains on with identical parameters."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import unused_port
from processes import children

pytestmark = pytest.mark.slow

TORCHRUN = Path(sys.executable).with_name("torchrun")
PER_ITERATION = 2 * 2 * 2 * 32  # ranks x actors x envs x steps per env


FRESH = ("--config", "cartpole-cleanrl", "--transport", "shm", "--steps-per-env", "32")


def _torchrun(*args: str) -> list[str]:
    return [str(TORCHRUN), "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(unused_port()),
            "-m", "lockstep", "train", "--no-progress", *args]


def _env() -> dict[str, str]:
    return {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}


def _rank_of(pid: int) -> int | None:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    ranks = [int(v[len(b"RANK="):]) for v in environ if v.startswith(b"RANK=")]
    return ranks[0] if ranks else None


def _actor_processes(torchrun_pid: int, rank: int) -> list[int]:
    """The actor processes (multiprocessing spawn children) of the learner rank ``rank`` under torchrun."""
    workers = [pid for pid in children(torchrun_pid) if _rank_of(pid) == rank]
    actors = []
    for worker in workers:
        for child in children(worker):
            try:
                if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                    actors.append(child)
            except OSError:
                pass
    return actors


def _rows(run_dir: Path) -> int:
    path = run_dir / "metrics.csv"
    return max(0, len(path.read_text().splitlines()) - 1) if path.exists() else 0


def test_a_rank_whose_actors_all_die_for_good_lets_the_other_rank_train_on(tmp_path):
    run_dir = tmp_path / "run"
    total = PER_ITERATION * 30
    proc = subprocess.Popen(
        _torchrun(*FRESH, "--total-steps", str(total), "--actors.restarts", "0", "--ppo.epochs", "1",
                  "--ppo.minibatches", "1", "--run-dir", str(run_dir)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), cwd=tmp_path)
    try:
        deadline = time.monotonic() + 180
        while _rows(run_dir / "rank1") < 1:  # rank 1's actors have trained once
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate(timeout=30)[0]
            time.sleep(0.05)
        actors = _actor_processes(proc.pid, rank=1)
        assert len(actors) == 2, actors
        for pid in actors:
            os.kill(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=240)  # without the fix: rank 0 waits 1,800 s in a collective
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    summaries = [json.loads((run_dir / f"rank{r}" / "summary.json").read_text()) for r in (0, 1)]
    assert summaries[0]["env_steps"] >= total  # rank 0 trained on to the run's budget
    assert summaries[1]["transitions_trained"] < summaries[0]["transitions_trained"] // 2  # rank 1 had no actors
    assert summaries[0]["ranks"]["identical_parameter_checks"] == summaries[1]["ranks"]["identical_parameter_checks"]
    assert summaries[0]["iterations"] == summaries[1]["iterations"] > 20


def test_sigterm_to_one_rank_stops_every_rank_after_the_same_iteration(tmp_path):
    run_dir = tmp_path / "run"
    total = PER_ITERATION * 1000
    proc = subprocess.Popen(
        _torchrun(*FRESH, "--total-steps", str(total), "--ppo.epochs", "1", "--ppo.minibatches", "1",
                  "--run-dir", str(run_dir)),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(), cwd=tmp_path)
    try:
        deadline = time.monotonic() + 180
        while _rows(run_dir / "rank1") < 1:
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate(timeout=30)[0]
            time.sleep(0.05)
        rank1 = [pid for pid in children(proc.pid) if _rank_of(pid) == 1]
        assert len(rank1) == 1, rank1
        os.kill(rank1[0], signal.SIGTERM)  # one rank only, as a scheduler preempting one process would
        out, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert "training failed" not in out, out
    summaries = [json.loads((run_dir / f"rank{r}" / "summary.json").read_text()) for r in (0, 1)]
    assert [s["error"] for s in summaries] == [None, None], out
    assert summaries[0]["iterations"] == summaries[1]["iterations"] and summaries[0]["env_steps"] < total
    assert summaries[0]["ranks"]["identical_parameter_checks"] == summaries[0]["iterations"]
    for r in (0, 1):
        final = torch.load(run_dir / f"rank{r}" / "checkpoints" / "final.pt", weights_only=False)
        assert final["trainer"]["iteration"] == summaries[0]["iterations"]


def _iterations(checkpoints: Path) -> set[int]:
    return {int(p.stem.split("_")[1]) for p in checkpoints.glob("iter_*.pt")}


def test_a_resume_whose_newest_checkpoints_differ_continues_from_one_agreed_iteration(tmp_path):
    run_dir = tmp_path / "run"
    first = subprocess.run(
        _torchrun(*FRESH, "--total-steps", str(PER_ITERATION * 6), "--checkpoint-every", "3",
                  "--checkpoint-minutes", "0.001", "--run.keep_checkpoints", "100", "--run-dir", str(run_dir)),
        capture_output=True, text=True, timeout=240, env=_env(), cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    ckpt = [run_dir / f"rank{r}" / "checkpoints" for r in (0, 1)]
    assert _iterations(ckpt[0]) == _iterations(ckpt[1])  # rank 0's clock decided for both
    saved = sorted(_iterations(ckpt[1]))
    assert saved[-1] == 6 and len(saved) >= 2
    (ckpt[1] / "final.pt").unlink()  # rank 1 was killed before its newest saves
    (ckpt[1] / f"iter_{saved[-1]:06d}.pt").unlink()
    agreed = saved[-2]

    second = subprocess.run(
        _torchrun("--resume", str(run_dir), "--total-steps", str(PER_ITERATION * 9)),
        capture_output=True, text=True, timeout=240, env=_env(), cwd=tmp_path)
    log = second.stdout + second.stderr
    assert second.returncode == 0, log
    assert "ParametersDiverged" not in log
    summaries = [json.loads((run_dir / f"rank{r}" / "summary.json").read_text()) for r in (0, 1)]
    for summary in summaries:
        assert summary["resumed_from"] == f"checkpoints/iter_{agreed:06d}.pt"
        assert summary["iterations"] == 9 and summary["env_steps"] == PER_ITERATION * 9
        assert summary["ranks"]["identical_parameter_checks"] == 9 - agreed  # compared after every update
    models = [torch.load(c / "final.pt", weights_only=False)["trainer"]["model"] for c in ckpt]
    assert all(torch.equal(models[0][k], models[1][k]) for k in models[0])
