"""``lockstep sweep`` end to end: real ``lockstep sweep`` processes run real ``lockstep train`` trials (CartPole, the
default preset's in-process env loops, a few thousand env steps each) on an SQLite study.

One sweep of two trials is run from scratch; a second, with the same spec and seed, is stopped with SIGTERM
while its second trial trains and then resumed: its trials must be the first sweep's, parameter for parameter
and objective for objective (strict runs are reproducible), and its finished trial kept. A spec with a bad
trial on purpose is pruned; two processes on one storage share one study.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from processes import children, pending

from lockstep import cli

optuna = pytest.importorskip("optuna")

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("sweep")]

STEPS = 16384  # 32 iterations of the default preset: long enough to be stopped mid-run
SPEC = {
    "base": "cartpole-fast",
    "trials": 2,
    "seed": 7,
    "objective": {"metric": "episode_return_mean", "direction": "maximize"},
    "budget": {"total_steps": STEPS},
    "space": {"ppo.lr": {"low": 1.0e-3, "high": 1.0e-2, "log": True}, "ppo.epochs": {"low": 2, "high": 6}},
    "pruner": {"kind": "none"},
}


def _write_spec(folder: Path, spec: dict, name: str = "spec") -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _sweep(spec: Path, out: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "lockstep", "sweep", str(spec), "--out", str(out), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=out.parent)


def _finish(proc: subprocess.Popen, timeout: float = 240) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def _study(out: Path, name: str = "spec") -> optuna.Study:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{out / 'study.db'}")


def _trials(study: optuna.Study) -> dict[int, optuna.trial.FrozenTrial]:
    return {t.number: t for t in study.get_trials()}


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sweep")


@pytest.fixture(scope="module")
def first_sweep(folder) -> Path:
    """Two trials from scratch."""
    out = folder / "first"
    code, log = _finish(_sweep(_write_spec(folder, SPEC), out))
    assert code == 0, log
    return out


@pytest.fixture(scope="module")
def interrupted_sweep(folder) -> dict:
    """The same spec: SIGTERM while the second trial's run trains, then the same command again."""
    out = folder / "interrupted"
    spec = _write_spec(folder, SPEC)
    proc = _sweep(spec, out)
    metrics = out / "trials" / "trial-0001" / "metrics.csv"
    deadline = time.monotonic() + 240
    while not (metrics.is_file() and metrics.read_text().count("\n") >= 2) and proc.poll() is None:
        assert time.monotonic() < deadline, "the second trial never started training"
        time.sleep(0.05)
    # The run is frozen before the sweep is signalled and thawed once the sweep's SIGTERM waits on it, so it is
    # stopped mid-run however fast it trains: a run of 32 iterations can otherwise finish before the signal lands.
    (run,) = children(proc.pid)
    os.kill(run, signal.SIGSTOP)
    rows = metrics.read_text().count("\n") - 1
    assert rows < STEPS // 512 - 1, f"the run had trained {rows} of its {STEPS // 512} iterations when frozen"
    proc.send_signal(signal.SIGTERM)
    while not pending(run, signal.SIGTERM):
        assert time.monotonic() < deadline, "the sweep never passed its SIGTERM to the run"
        time.sleep(0.05)
    os.kill(run, signal.SIGCONT)
    code, log = _finish(proc)
    stopped = {"code": code, "log": log, "trials": _trials(_study(out)),
               "summary": _summary(out / "trials" / "trial-0000"),
               "summary_mtime": os.stat(out / "trials" / "trial-0000" / "summary.json").st_mtime_ns}
    code, log = _finish(_sweep(spec, out))
    return {"out": out, "stopped": stopped, "code": code, "log": log, "trials": _trials(_study(out))}


def test_a_two_trial_sweep_writes_its_table_plots_and_a_best_yaml_that_train_accepts(first_sweep, tmp_path):
    trials = _trials(_study(first_sweep))
    assert sorted(trials) == [0, 1] and all(t.state.name == "COMPLETE" for t in trials.values())
    for t in trials.values():  # every trial is a run of its own, its config saved
        run_dir = first_sweep / "trials" / f"trial-{t.number:04d}"
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert config["ppo"]["lr"] == t.params["ppo.lr"] and config["ppo"]["epochs"] == t.params["ppo.epochs"]
        summary = _summary(run_dir)
        assert summary["env_steps"] == STEPS
        assert summary["sweep"] == {"trial": t.number, "state": "complete", "objective": t.value}
        assert t.value == summary["episode_return_mean"]  # objective: the metric's last row
    table = (first_sweep / "trials.csv").read_text().splitlines()
    assert table[0] == "trial,state,objective,seconds,ppo.epochs,ppo.lr,run_dirs" and len(table) == 3
    for name in ("trials.md", "history.png", "importance.png", "curves.png"):
        assert (first_sweep / name).stat().st_size > 0, name
    best = max(trials.values(), key=lambda t: t.value)
    config = yaml.safe_load((first_sweep / "best.yaml").read_text())
    assert config["ppo"]["lr"] == best.params["ppo.lr"] and config["ppo"]["total_steps"] == STEPS
    assert config["run"]["run_dir"] == "" and config["actors"]["transport"] == "inprocess"
    run_dir = tmp_path / "best"
    assert cli.main(["train", "--config", str(first_sweep / "best.yaml"), "--total-steps", "1024", "--run-dir",
                     str(run_dir), "--no-progress"]) == 0
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["ppo"]["lr"] == best.params["ppo.lr"]


def test_an_interrupted_sweep_stops_its_run_in_order_and_resumes_without_losing_finished_trials(interrupted_sweep):
    stopped = interrupted_sweep["stopped"]
    assert stopped["code"] == 128 + signal.SIGTERM, stopped["log"]
    trials = stopped["trials"]
    assert trials[0].state.name == "COMPLETE" and trials[1].state.name == "FAIL"
    assert trials[2].state.name == "WAITING" and trials[2].params == trials[1].params  # queued again
    out = interrupted_sweep["out"]
    cut = _summary(out / "trials" / "trial-0001")  # the stopped run wrote its summary, rows and checkpoint
    assert cut["sweep"] == {"trial": 1, "state": "interrupted"} and 0 < cut["env_steps"] < STEPS
    rows = (out / "trials" / "trial-0001" / "metrics.csv").read_text()
    assert rows.endswith("\n") and len(rows.splitlines()) == cut["iterations"] + 1
    assert (out / "trials" / "trial-0001" / "checkpoints" / "final.pt").is_file()

    assert interrupted_sweep["code"] == 0, interrupted_sweep["log"]
    trials = interrupted_sweep["trials"]
    assert sorted(trials) == [0, 1, 2]  # nothing ran twice but the interrupted trial, rerun once
    assert [trials[n].state.name for n in (0, 1, 2)] == ["COMPLETE", "FAIL", "COMPLETE"]
    assert "finished before" in interrupted_sweep["log"] and "trial 0 started" not in interrupted_sweep["log"]
    assert os.stat(out / "trials" / "trial-0000" / "summary.json").st_mtime_ns == stopped["summary_mtime"]
    assert _summary(out / "trials" / "trial-0002")["env_steps"] == STEPS
    states = [line.split(",")[:2] for line in (out / "trials.csv").read_text().splitlines()[1:]]
    assert states == [["0", "complete"], ["2", "complete (rerun of 1)"]]


def test_the_same_seed_gives_the_same_trials_and_results(first_sweep, interrupted_sweep):
    first = _trials(_study(first_sweep))
    resumed = interrupted_sweep["trials"]
    assert (resumed[0].params, resumed[0].value) == (first[0].params, first[0].value)
    assert (resumed[2].params, resumed[2].value) == (first[1].params, first[1].value)
    assert first[0].params != first[1].params


def test_a_trial_worse_than_the_median_is_pruned_and_its_summary_says_so(folder):
    spec = {**SPEC, "space": {"ppo.lr": [5.0e-3, 1.0e-8]}, "first": [{"ppo.lr": 5.0e-3}, {"ppo.lr": 1.0e-8}],
            "budget": {"total_steps": 8192}, "pruner": {"kind": "median", "startup_trials": 1, "warmup": 0.25,
                                                         "reports": 8}}
    out = folder / "pruned"
    code, log = _finish(_sweep(_write_spec(folder, spec, "pruned"), out))
    assert code == 0, log
    trials = _trials(_study(out, "pruned"))
    assert trials[0].state.name == "COMPLETE"
    assert trials[1].state.name == "PRUNED" and trials[1].params["ppo.lr"] == 1.0e-8, log
    summary = _summary(out / "trials" / "trial-0001")
    # decided from the rows before the budget was spent, whenever the sweep read them: the run stops at the next
    # row it writes, or had written its last (a fast machine) and is judged on its rows all the same
    assert summary["sweep"]["state"] == "pruned" and summary["sweep"]["pruned_at"]["env_steps"] < 8192
    assert summary["sweep"]["pruned_at"]["env_steps"] <= summary["env_steps"] <= 8192
    assert "trial 1: pruned at" in log
    assert (out / "trials.csv").read_text().splitlines()[2].startswith("1,pruned,")


def test_two_sweep_processes_on_one_storage_share_one_study_and_run_each_trial_once(folder):
    spec = _write_spec(folder, {**SPEC, "budget": {"total_steps": 2048}}, "shared")
    storage = f"sqlite:///{folder / 'shared.db'}"
    procs = [_sweep(spec, folder / f"machine-{i}", "--storage", storage) for i in range(2)]
    for proc in procs:
        code, log = _finish(proc)
        assert code == 0, log
    trials = _trials(optuna.load_study(study_name="shared", storage=storage))
    assert sorted(trials) == [0, 1] and all(t.state.name == "COMPLETE" for t in trials.values())
    ran = sorted(p.name for i in range(2) for p in (folder / f"machine-{i}" / "trials").glob("trial-*"))
    assert ran == ["trial-0000", "trial-0001"]  # each trial ran once, in one of the two processes
    assert trials[0].params != trials[1].params
    assert not (folder / "machine-0" / "study.db").exists()
