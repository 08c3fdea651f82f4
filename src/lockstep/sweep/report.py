"""What a sweep leaves in its directory: the trials table, best.yaml and the plots.

``trials.csv`` and ``trials.md``: one row per trial (number, state, objective, seconds, parameters, run
directories); ``best.yaml``: the best complete trial's whole config, which ``lockstep train --config`` takes;
``history.png`` (every trial's objective and the best so far), ``importance.png`` (Optuna's parameter
importances, its default evaluator, PED-ANOVA) and ``curves.png`` (the best trials' learning curves). The plots
need matplotlib (``pip install -e '.[plot]'``); without it the sweep says so and writes the rest.
"""

from __future__ import annotations

import csv
import io
import logging
import math
from pathlib import Path
from typing import Any

import optuna

from lockstep.common.files import atomic_write
from lockstep.observe import plot
from lockstep.sweep.spec import Spec

log = logging.getLogger("lockstep.sweep")

BEST_CURVES = 3  # the best trials whose learning curves curves.png draws


def finished(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The study's trials in number order, but for failed ones that were queued again (their retries stand)."""
    trials = study.get_trials(deepcopy=False)
    again = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    return [t for t in trials if t.number not in again]


def best(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    if not complete:
        return None
    maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
    return (max if maximize else min)(complete, key=lambda t: t.value)


def table(study: optuna.Study) -> list[dict[str, Any]]:
    """One row per trial: number, state, objective, seconds, each parameter, run directories."""
    trials = finished(study)
    keys = list(dict.fromkeys(k for t in trials for k in t.params))
    rows = []
    for t in trials:
        rerun = t.system_attrs.get("failed_trial")
        row = {"trial": t.number, "state": t.state.name.lower() + ("" if rerun is None else f" (rerun of {rerun})"),
               "objective": "" if t.value is None else round(t.value, 6),
               "seconds": "" if t.duration is None else round(t.duration.total_seconds(), 1)}
        row.update({k: t.params.get(k, "") for k in keys})
        row["run_dirs"] = " ".join(t.user_attrs.get("run_dirs", []))
        rows.append(row)
    return rows


def write(study: optuna.Study, spec: Spec, out: Path) -> dict[str, Path]:
    """Write the table, best.yaml and the plots into ``out``; the paths written, by name."""
    rows = table(study)
    written = {}
    if rows:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
        atomic_write(out / "trials.csv", buffer.getvalue())
        atomic_write(out / "trials.md", markdown(rows))
        written["trials.csv"], written["trials.md"] = out / "trials.csv", out / "trials.md"
    top = best(study)
    if top is not None and "config" in top.user_attrs:
        header = (f"# The best trial of sweep {study.study_name}: trial {top.number}, {spec.objective.metric} "
                  f"({spec.objective.value}) {top.value:.6g}.\n# Train it: lockstep train --config "
                  f"{out / 'best.yaml'}\n")
        atomic_write(out / "best.yaml", header + top.user_attrs["config"])
        written["best.yaml"] = out / "best.yaml"
    try:
        plot.require_matplotlib()
    except plot.PlotUnavailable as err:
        print(f"sweep: no plots: {err}", flush=True)
        return written
    written["history.png"] = history(study, spec, out / "history.png")
    importance = importances(study, out / "importance.png")
    if importance is not None:
        written["importance.png"] = importance
    curves = learning_curves(study, spec, out / "curves.png")
    if curves is not None:
        written["curves.png"] = curves
    return written


def markdown(rows: list[dict[str, Any]]) -> str:
    columns = [c for c in rows[0] if c != "run_dirs"]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)


def _figure(width: float = 7.0, height: float = 4.4):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def history(study: optuna.Study, spec: Spec, path: Path) -> Path:
    """Every complete trial's objective by trial number, the best so far as a step line, pruned trials' last
    reported value as crosses."""
    fig = _figure()
    ax = fig.subplots()
    maximize = spec.objective.maximize
    complete = [t for t in finished(study) if t.state == optuna.trial.TrialState.COMPLETE]
    pruned = [t for t in finished(study) if t.state == optuna.trial.TrialState.PRUNED and t.intermediate_values]
    ax.plot([t.number for t in complete], [t.value for t in complete], "o", color="C0", label="complete trial")
    if pruned:
        ax.plot([t.number for t in pruned], [t.intermediate_values[max(t.intermediate_values)] for t in pruned],
                "x", color="C3", label="pruned trial (its last report)")
    best_so_far, xs, ys = None, [], []
    for t in complete:
        if best_so_far is None or (t.value > best_so_far if maximize else t.value < best_so_far):
            best_so_far = t.value
        xs.append(t.number)
        ys.append(best_so_far)
    if xs:
        ax.step(xs, ys, where="post", color="C1", label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel(f"{spec.objective.metric} ({spec.objective.value}, {spec.objective.direction})")
    ax.set_title(f"{study.study_name}: optimization history", fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    return path


def importances(study: optuna.Study, path: Path) -> Path | None:
    """Optuna's parameter importances (its default evaluator) as bars; None with too few complete trials."""
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    if len(complete) < 2 or not complete[0].params:
        return None
    try:
        values = optuna.importance.get_param_importances(study)
    except (RuntimeError, ValueError) as err:  # e.g. every trial with the same objective
        log.info("no parameter importances: %s", err)
        return None
    if not values or any(math.isnan(v) for v in values.values()):
        return None
    fig = _figure(height=1.2 + 0.45 * len(values))
    ax = fig.subplots()
    names = list(values)[::-1]
    ax.barh(names, [values[n] for n in names], color="C0")
    ax.set_xlabel("importance (Optuna's default evaluator, normalized)")
    ax.set_title(f"{study.study_name}: parameter importances ({len(complete)} complete trials)", fontsize=11)
    ax.grid(alpha=0.3, axis="x")
    fig.savefig(path, dpi=110)
    return path


def learning_curves(study: optuna.Study, spec: Spec, path: Path) -> Path | None:
    """The learning curves of the best ``BEST_CURVES`` complete trials whose runs are on this machine."""
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == optuna.trial.TrialState.COMPLETE]
    complete.sort(key=lambda t: t.value, reverse=spec.objective.maximize)
    column = spec.objective.metric
    groups = []
    for t in complete[:BEST_CURVES]:
        dirs = [d for d in t.user_attrs.get("run_dirs", []) if (Path(d) / "metrics.csv").is_file()]
        try:
            curves = [plot.read_curve(d, column) for d in dirs]
        except ValueError:
            continue
        if curves and all(len(c.values) for c in curves):
            groups.append(plot.Group(f"trial {t.number} ({t.value:.4g})", curves, unit="seeds"))
    if not groups:
        return None
    return plot.draw(groups, path, f"{study.study_name}: the best trials", ylabel=column)
