"""The study and its trials: Optuna proposes, each trial's runs are ``lockstep train`` processes.

A trial takes its parameters from the sampler, writes one config per run seed into its run directory
(``OUT/trials/trial-NNNN``, ``-sSEED`` with several seeds) and trains it with ``lockstep train --config``: an
ordinary run, which ``lockstep train --config RUN_DIR/config.yaml`` repeats exactly. While a run trains the
trial reads its metrics.csv rows as they are written, scores them (``objective.score``) at ``pruner.reports``
evenly spaced points of the budget and reports each to Optuna, each point scored on the rows up to the first
that reached it and every point reported before the trial completes, so that the pruner's verdict depends on
the rows alone, never on when they were read (``Sweep._report``); a pruned run is stopped with SIGTERM, as
Ctrl-C stops ``lockstep train``: in order, its summary.json and final checkpoint written. The sweep then adds
its verdict to every run's summary.json (``sweep``: trial, state, objective, where it was pruned).

The study lives in Optuna's storage: ``OUT/study.db`` (SQLite) unless ``--storage URL`` names a database that
several ``lockstep sweep`` processes, on several machines, share. Each process counts the study's trials
before it starts one, so together they run ``trials``. A sweep stopped by SIGINT or SIGTERM stops its runs
the same way, marks their trials failed and queues each again with the same parameters, so that the next
``lockstep sweep`` on the same storage reruns them and keeps every finished trial; a process that died without
a word leaves trials whose heartbeat goes stale, which the next process fails and queues the same way.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import yaml

from lockstep import config as config_lib
from lockstep.observe.metrics import write_summary
from lockstep.observe.run_dir import RunDir
from lockstep.sweep import objective as objective_lib
from lockstep.sweep import report
from lockstep.sweep.spec import Param, Spec, SpecError, decode, encode

log = logging.getLogger("lockstep.sweep")

POLL_S = 0.5  # how often a trial reads its run's metrics.csv
STOP_WAIT_S = 120.0  # how long a stopped run may take to write its summary before it is killed
HEARTBEAT_S = 5  # a running trial's heartbeat; one silent for GRACE_S belongs to a process that died
GRACE_S = 30
OPEN_TRIES = 5  # attempts at opening a storage that another process is creating


@dataclass
class Reported:
    """How far a run's reports to the pruner have got: the ``rows`` of its metrics.csv read, the ``points`` of its
    budget reported."""

    rows: int = 0
    points: int = 0


class TrialFailed(Exception):
    """A run of the trial ended without a score: ``lockstep train`` failed, or no row had the metric."""


class SweepInterrupted(Exception):
    """The sweep was asked to stop (SIGINT or SIGTERM) while this trial's run trained."""


@dataclass
class Layout:
    """How a trial's runs sit on this machine: ``transport`` (None: the config's own) and why."""

    transport: str | None
    note: str


def layout(base: config_lib.Config, spec: Spec, jobs: int, cores: int) -> Layout:
    """Size the trials so that ``jobs`` of them fit ``cores``: a run with actor processes takes a core for its
    learner and one per actor; where ``jobs`` such runs would not fit, the runs step their envs in the learner
    process (``actors.transport inprocess``: one process per run, the same envs, ids and seeds, and in strict
    mode the same numbers; docs/architecture.md#reproducible-strict-runs). A transport the spec sets or
    searches is kept, and so is one whose trials would be refused in the learner process (``Spec.check_trials``:
    envs in processes of their own, ``actors.vector async``): every trial's config validates with the layout's
    transport, as the spec's check found it does with the base's."""
    actors = base.actors
    per_run = 1 if actors.transport == "inprocess" else actors.count + 1
    cores_each = max(1, cores // jobs)
    fixed = "actors.transport" in spec.set or "actors.transport" in spec.space or actors.launcher != "local"
    note = (f"{jobs} trial{'s' if jobs > 1 else ''} at once on {cores} core{'s' if cores > 1 else ''}: each run takes "
            f"{per_run} process{'es' if per_run > 1 else ''} (")
    if actors.transport == "inprocess":
        return Layout(None, note + f"{actors.count} in-process actor{'s' if actors.count > 1 else ''})")
    note += f"a learner and {actors.count} actor{'s' if actors.count > 1 else ''} over {actors.transport})"
    if jobs * per_run <= cores or fixed:
        extra = "" if jobs * per_run <= cores else f"; more than the {cores} cores, as the spec's transport asks"
        return Layout(None, note + extra)
    crowded = f", more than the {cores_each} core{'s' if cores_each > 1 else ''} each gets"
    try:
        spec.check_trials("inprocess")
    except SpecError as err:
        return Layout(None, note + f"{crowded}; kept, since the runs cannot step their envs in the learner "
                                   f"process: {err}")
    return Layout("inprocess", note + f"{crowded}: the runs step their envs in the learner process instead "
                                      "(actors.transport inprocess, the same actors and seeds)")


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def storage_url(out: Path, storage: str | None) -> str:
    return storage or f"sqlite:///{(out / 'study.db').resolve()}"


def retry_callback() -> Any:
    """Optuna's callback that queues a failed trial again with its parameters (renamed in Optuna 4.9)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if hasattr(optuna.storages, "RetryHeartbeatStaleTrialCallback"):
            return optuna.storages.RetryHeartbeatStaleTrialCallback()
        return optuna.storages.RetryFailedTrialCallback()


def open_study(spec: Spec, out: Path, storage: str | None, name: str) -> optuna.Study:
    """The study in ``storage`` (default ``OUT/study.db``), created on first use with the spec's sampler and
    pruner. A trial whose heartbeat stopped (its process died) is failed and queued again."""
    url = storage_url(out, storage)
    stale = ("heartbeat_stale_trial_callback" if hasattr(optuna.storages, "RetryHeartbeatStaleTrialCallback")
             else "failed_trial_callback")
    import sqlalchemy.exc  # Optuna's RDB storage is built on SQLAlchemy

    attempt = 0
    while True:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                rdb = optuna.storages.RDBStorage(url, engine_kwargs=_engine_kwargs(url),
                                                 heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S,
                                                 **{stale: retry_callback()})
            return optuna.create_study(storage=rdb, study_name=name, direction=spec.objective.direction,
                                       sampler=SeededByTrial(spec), pruner=pruner(spec), load_if_exists=True)
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError):
            # processes that start together race to create the storage's tables: the loser finds them made
            attempt += 1
            if attempt == OPEN_TRIES:
                raise
            time.sleep(0.2 * attempt)


def _engine_kwargs(url: str) -> dict[str, Any]:
    # several processes write one SQLite file: wait for its lock rather than fail at once
    return {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}


def sampler(spec: Spec, seed: int) -> optuna.samplers.BaseSampler:
    """The spec's sampler (tpe, random or grid) with ``seed``."""
    if spec.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if spec.sampler == "grid":
        return optuna.samplers.GridSampler({p.key: p.grid() for p in spec.params()}, seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


class SeededByTrial(optuna.samplers.BaseSampler):
    """The spec's sampler, seeded afresh for each trial from the spec's seed and the trial's number.

    A sampler seeded once draws from one random stream per process: a resumed sweep would propose its first
    trials' parameters again, and two processes sharing a study would propose the same ones. Seeded by trial
    number, what trial n proposes depends on the seed, n and the results before it, whichever process runs it.
    A grid is shuffled by its seed once and trial n takes its n-th point: one seed for every trial.
    """

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self._by_trial: dict[int, optuna.samplers.BaseSampler] = {}

    def _of(self, trial: optuna.trial.FrozenTrial) -> optuna.samplers.BaseSampler:
        inner = self._by_trial.get(trial.number)
        if inner is None:
            seed = int(np.random.SeedSequence([self.spec.seed, trial.number]).generate_state(1)[0])
            if self.spec.sampler == "grid":  # the grid's order comes from its seed, and trial n takes its n-th point
                seed = self.spec.seed
            inner = self._by_trial.setdefault(trial.number, sampler(self.spec, seed))
        return inner

    def infer_relative_search_space(self, study, trial):
        return self._of(trial).infer_relative_search_space(study, trial)

    def sample_relative(self, study, trial, search_space):
        return self._of(trial).sample_relative(study, trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self._of(trial).sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study, trial) -> None:
        self._of(trial).before_trial(study, trial)

    def after_trial(self, study, trial, state, values) -> None:
        self._of(trial).after_trial(study, trial, state, values)
        self._by_trial.pop(trial.number, None)


def pruner(spec: Spec) -> optuna.pruners.BasePruner:
    p = spec.pruner
    if p.kind == "none":
        return optuna.pruners.NopPruner()
    if p.kind == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(1, math.ceil(p.warmup * p.reports)),
                                              max_resource=p.reports * len(spec.run_seeds(spec.base_config())),
                                              reduction_factor=3)
    return optuna.pruners.MedianPruner(n_startup_trials=p.startup_trials, n_warmup_steps=0)


def retried(trials: list[optuna.trial.FrozenTrial]) -> set[int]:
    """The numbers of failed trials that were queued again (their retries carry them in ``retry_history``)."""
    return {n for t in trials for n in t.system_attrs.get("retry_history", [])}


def counted(trials: list[optuna.trial.FrozenTrial]) -> int:
    """The trials that count towards ``spec.trials``: every one started, except those queued again."""
    again = retried(trials)
    return sum(1 for t in trials if t.number not in again and t.state != optuna.trial.TrialState.WAITING)


@dataclass
class Sweep:
    """One ``lockstep sweep`` process: runs trials of ``spec`` in ``out`` until the study has ``spec.trials``."""

    spec: Spec
    out: Path
    jobs: int = 1
    storage: str | None = None
    study_name: str = "lockstep-sweep"
    lockstep: list[str] = field(default_factory=lambda: [sys.executable, "-m", "lockstep"])
    stop: threading.Event = field(default_factory=threading.Event)
    signum: int | None = None
    interrupted: list[int] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    _starting: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.params: list[Param] = self.spec.params()
        self.base = self.spec.base_config()
        self.seeds = self.spec.run_seeds(self.base)
        self.layout = layout(self.base, self.spec, self.jobs, cores())
        self.running: set[subprocess.Popen] = set()  # the runs training now

    def run(self) -> optuna.Study:
        """Run trials until the study has its ``spec.trials`` (or a signal stops it: ``self.signum``)."""
        self.out.mkdir(parents=True, exist_ok=True)
        optuna.logging.set_verbosity(optuna.logging.ERROR)  # the progress lines say it
        study = open_study(self.spec, self.out, self.storage, self.study_name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)  # a dead process's trials: failed and queued again, counted so
        trials = study.get_trials(deepcopy=False)
        if not trials:
            for params in self.spec.first:
                study.enqueue_trial({k: encode(v) for k, v in params.items()}, skip_if_exists=True)
        remaining = self.spec.trials - counted(trials)
        done = sum(1 for t in trials if t.state.is_finished() and t.number not in retried(trials))
        print(f"sweep {self.study_name}: {self.spec.trials} trials, {done} finished before, {max(0, remaining)} to run "
              f"here; {self.layout.note}; storage {storage_url(self.out, self.storage)}", flush=True)
        if remaining <= 0:
            return study
        handlers = {}
        if threading.current_thread() is threading.main_thread():
            handlers = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        workers = [threading.Thread(target=self._work, args=(study,), name=f"lockstep-sweep-{i}", daemon=True)
                   for i in range(min(self.jobs, remaining))]
        try:
            for worker in workers:
                worker.start()
            for worker in workers:
                while worker.is_alive():
                    worker.join(timeout=0.25)  # the main thread stays free to take a signal
        finally:
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
            for proc in list(self.running):  # left by a second signal, which does not wait for them
                proc.kill()
            queue_again = retry_callback()
            for trial in study.get_trials(deepcopy=False):
                if trial.number in self.interrupted and trial.state == optuna.trial.TrialState.FAIL:
                    queue_again(study, trial)  # the next sweep on this storage runs it again, as a stale one
        if self.errors:
            raise self.errors[0]
        return study

    def _work(self, study: optuna.Study) -> None:
        """One worker: start a trial while the study has fewer than ``spec.trials`` (counted just before each,
        with this process's trials about to start, so that processes sharing the study run ``spec.trials``
        together), until a signal stops the sweep. Optuna's loop runs each trial: its heartbeat, and the failing
        and queueing again of stale trials."""
        try:
            while not self.stop.is_set():
                with self._lock:
                    if counted(study.get_trials(deepcopy=False)) + self._starting >= self.spec.trials:
                        return
                    self._starting += 1  # until the trial is in the study, where the count sees it
                study.optimize(self.objective, n_trials=1, catch=(TrialFailed,), callbacks=[self._progress],
                               gc_after_trial=False)
        except SweepInterrupted:
            return
        except BaseException as err:
            self.errors.append(err)
            self.stop.set()

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.stop.is_set():
            raise KeyboardInterrupt  # a second one: stop waiting for the runs
        self.signum = signum
        self.stop.set()
        print(f"sweep: {signal.Signals(signum).name}: stopping the trials' runs; finished trials are kept and "
              "a sweep started again on the same storage reruns the interrupted ones", flush=True)

    def _progress(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        trials = study.get_trials(deepcopy=False)
        finished = [t for t in trials if t.state.is_finished() and t.number not in retried(trials)]
        states = {s: sum(1 for t in finished if t.state == s) for s in optuna.trial.TrialState}
        best = report.best(study)
        what = {"COMPLETE": f"objective {_fmt(trial.value)}", "PRUNED": "pruned",
                "FAIL": f"failed ({trial.user_attrs.get('error', 'interrupted')})"}.get(trial.state.name, "")
        seconds = trial.duration.total_seconds() if trial.duration else 0.0
        print(f"trial {trial.number}: {what} in {seconds:.0f} s | {len(finished)} of {self.spec.trials} finished "
              f"({states[optuna.trial.TrialState.COMPLETE]} complete, {states[optuna.trial.TrialState.PRUNED]} "
              f"pruned, {states[optuna.trial.TrialState.FAIL]} failed) | best so far: "
              + (f"{_fmt(best.value)} (trial {best.number})" if best else "none"), flush=True)

    # --- one trial ----------------------------------------------------------------------------------

    def objective(self, trial: optuna.Trial) -> float:
        """Optuna's objective: run the trial's seeds one after another and aggregate their scores."""
        with self._lock:
            self._starting -= 1
        params = {p.key: decode(p, self._suggest(trial, p)) for p in self.params}
        print(f"trial {trial.number} started: " + ", ".join(f"{k}={v}" for k, v in params.items()), flush=True)
        try:  # a combination of parameters that the spec's check, which checks each on its own, did not see
            recorded = self.spec.trial_config(params, self.seeds[0])  # best.yaml's: the base's own transport
            configs = [self.spec.trial_config(params, seed, self.layout.transport) for seed in self.seeds]
        except config_lib.ConfigError as err:
            trial.set_user_attr("error", str(err))
            raise TrialFailed(str(err)) from None
        trial.set_user_attr("config", yaml.safe_dump(config_lib.to_dict(recorded), sort_keys=False))
        run_dirs = [self.out / "trials" / self._run_name(trial.number, seed) for seed in self.seeds]
        trial.set_user_attr("run_dirs", [str(d.resolve()) for d in run_dirs])
        scores = []
        for j, (config, run_dir) in enumerate(zip(configs, run_dirs)):
            config.run.name, config.run.run_dir = run_dir.name, str(run_dir)
            try:
                scores.append(self._train(trial, j, config, run_dir))
            except (optuna.TrialPruned, TrialFailed, SweepInterrupted) as err:
                state = {optuna.TrialPruned: "pruned", TrialFailed: "failed"}.get(type(err), "interrupted")
                for done in run_dirs[:j]:  # the trial's finished runs: their trial ended in a later one
                    _annotate(done, trial.number, state, during=run_dir.name)
                raise
        value = objective_lib.aggregate(scores, self.spec.aggregate, self.spec.objective.maximize)
        for run_dir in run_dirs:
            _annotate(run_dir, trial.number, "complete", objective=value)
        return value

    def _run_name(self, number: int, seed: int) -> str:
        return f"trial-{number:04d}" + (f"-s{seed}" if len(self.seeds) > 1 else "")

    def _suggest(self, trial: optuna.Trial, p: Param) -> Any:
        if p.kind == "choice":
            return trial.suggest_categorical(p.key, [encode(c) for c in p.choices])
        if p.kind == "int":
            return trial.suggest_int(p.key, int(p.low), int(p.high), step=int(p.step or 1), log=p.log)
        return trial.suggest_float(p.key, p.low, p.high, step=p.step, log=p.log)

    def _train(self, trial: optuna.Trial, j: int, config: config_lib.Config, run_dir: Path) -> float:
        """Train one run of ``trial`` (its ``j``-th seed) as a ``lockstep train`` process, report its score at
        each point of the budget as its rows arrive (``_report``; a finished run's last rows too, before its trial
        completes), and stop it when the pruner says so; its final score."""
        run_dir.mkdir(parents=True, exist_ok=True)
        config_lib.save(config, run_dir / "config.yaml")
        spec, budget, reported = self.spec, self._run_budget(config), Reported()
        with (run_dir / "train.log").open("w") as out:
            # a session of its own: a Ctrl-C at the terminal reaches the sweep, which stops the run once, in order
            proc = subprocess.Popen([*self.lockstep, "train", "--config", str(run_dir / "config.yaml")],
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            self.running.add(proc)
            try:
                while True:
                    code = proc.poll()
                    pruned = (self._report(trial, j, RunDir(run_dir).metrics(), budget, reported)
                              if code in (None, 0) else None)
                    if pruned is not None:
                        _stop(proc)
                        _annotate(run_dir, trial.number, "pruned", pruned_at=pruned)
                        print(f"trial {trial.number}: pruned at {pruned['env_steps']:,} env steps "
                              f"(its objective so far {_fmt(pruned['value'])})", flush=True)
                        raise optuna.TrialPruned()
                    if self.stop.is_set():
                        _stop(proc)
                        _annotate(run_dir, trial.number, "interrupted")
                        with self._lock:
                            self.interrupted.append(trial.number)
                        raise SweepInterrupted()
                    if code is not None:
                        break
                    time.sleep(POLL_S)
            finally:
                if proc.poll() is None:
                    _stop(proc)
                self.running.discard(proc)
        if code != 0:
            tail = (run_dir / "train.log").read_text().strip().splitlines()[-1:] or ["(no output)"]
            error = f"lockstep train exited with {code}: {tail[0]} (see {run_dir / 'train.log'})"
            _annotate(run_dir, trial.number, "failed", error=error)
            trial.set_user_attr("error", error)
            raise TrialFailed(error)
        rows = RunDir(run_dir).metrics()
        value = objective_lib.score(rows, spec.objective, budget)
        if value is None:
            error = f"no row of {run_dir / 'metrics.csv'} has {spec.objective.metric}"
            _annotate(run_dir, trial.number, "failed", error=error)
            trial.set_user_attr("error", error)
            raise TrialFailed(error)
        return value

    def _report(self, trial: optuna.Trial, j: int, rows: list[dict[str, Any]], budget: objective_lib.RunBudget,
                reported: Reported) -> dict[str, Any] | None:
        """Report each point of the budget that ``rows`` reached since the last call, each scored on the rows up to
        the first one that reached it, and ask the pruner after each; where it stops the trial: that row's
        ``env_steps``, ``wall_s`` and ``value``, else None. What the pruner sees depends on the run's rows alone,
        never on when the sweep read them: a run that finished between two reads is judged on every row, as one
        still training is."""
        reports, spec = self.spec.pruner.reports, self.spec
        for i in range(reported.rows, len(rows)):
            reported.rows = i + 1
            point = math.floor(budget.fraction(rows[i]) * reports)
            value = objective_lib.score(rows[:i + 1], spec.objective, budget) if point > reported.points else None
            if value is None:  # no new point, or no row with the metric yet: the points wait for one
                continue
            for k in range(reported.points + 1, point + 1):
                trial.report(value, j * reports + k)
            reported.points = point
            if spec.pruner.warmup * reports <= point < reports and trial.should_prune():
                return {"env_steps": rows[i]["env_steps"], "wall_s": rows[i]["wall_s"], "value": value}
        return None

    def _run_budget(self, config: config_lib.Config) -> objective_lib.RunBudget:
        return objective_lib.RunBudget(config.ppo.total_steps, config.run.time_limit_s)


def _stop(proc: subprocess.Popen) -> None:
    """Stop a run as Ctrl-C stops ``lockstep train``: SIGTERM, then wait for it to write its summary."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        log.error("run %d did not stop within %.0f s of SIGTERM: killed", proc.pid, STOP_WAIT_S)
        proc.kill()
        proc.wait()


def _annotate(run_dir: Path, number: int, state: str, **details: Any) -> None:
    """Add the sweep's verdict on a run to its summary.json (which a stopped run has written too)."""
    path = run_dir / "summary.json"
    summary = RunDir(run_dir).summary() or {}
    summary["sweep"] = {"trial": number, "state": state, **details}
    write_summary(path, summary)


def _fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
