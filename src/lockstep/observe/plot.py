"""Learning curves: a run's return from its ``metrics.csv``, the mean and spread of several runs, and PNG figures.

``lockstep plot`` and ``lockstep bench learn --suite`` share this module. A curve is one run's
``episode_return_mean20`` column (the mean return of the last 20 finished episodes at each
training iteration) against ``env_steps`` or ``wall_s`` (seconds since training started); rows
before the first finished episode have no return and are left out.

Several runs of one config (seeds) become a *band*: on the x values where every run has data
(from the latest first point to the earliest last point), each run is linearly interpolated,
and the band holds the mean, the population standard deviation, the minimum and the maximum
across runs. Runs of one config share their ``env_steps`` values, so against env steps the
band is exact; against wall time the runs are interpolated at each other's times.

Figures need matplotlib (the ``plot`` extra), imported only when one is drawn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lockstep.observe.run_dir import RunDir

RETURN_COLUMN = "episode_return_mean20"
RETURN_LABEL = "episodic return (mean of the last 20 episodes)"
# axis -> (metrics.csv column, axis label, panel title)
AXES = {"steps": ("env_steps", "env steps", "against env steps"),
        "time": ("wall_s", "wall time (s, since training started)", "against wall time")}
INSTALL_HINT = "pip install -e '.[plot]'"


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


@dataclass
class Curve:
    """One run's learning curve: ``values`` [n] against ``env_steps`` [n] and ``wall_s`` [n]."""

    name: str
    env_steps: np.ndarray
    wall_s: np.ndarray
    values: np.ndarray

    def x(self, axis: str) -> np.ndarray:
        return self.env_steps if axis == "steps" else self.wall_s


@dataclass
class Band:
    """Several curves on one grid ``x`` [m]: their mean, population std, minimum and maximum [m] per point."""

    x: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    low: np.ndarray
    high: np.ndarray
    runs: int


@dataclass
class Group:
    """Curves drawn as one mean and spread (the seeds of one config), with the legend's label."""

    label: str
    curves: list[Curve]
    unit: str = "runs"  # what the curves are, in the legend: "mean of 3 runs", "mean of 3 seeds"


@dataclass
class Reference:
    """A published figure drawn as a horizontal line: ``value`` ± ``spread`` (None: no band)."""

    label: str
    value: float
    spread: float | None = None


def read_curve(run_dir: str | Path, column: str = RETURN_COLUMN) -> Curve:
    """The curve of ``column`` in ``run_dir/metrics.csv``; rows where the column is empty are left out."""
    run = RunDir(run_dir)
    columns = run.columns()
    missing = [c for c in ("env_steps", "wall_s", column) if c not in columns]
    if missing:
        raise ValueError(f"{run.metrics_path} has no column {', '.join(missing)}; columns: {', '.join(columns)}")
    rows = [(r["env_steps"], r["wall_s"], r[column]) for r in run.metrics() if r[column] is not None]
    table = np.array(rows, dtype=np.float64).reshape(-1, 3)
    keep = np.isfinite(table).all(axis=1)
    return Curve(run.name, table[keep, 0], table[keep, 1], table[keep, 2])


def band(curves: list[Curve], axis: str = "steps") -> Band:
    """The mean and spread of ``curves`` against ``axis`` ("steps" or "time"), on the x values of every curve
    that lie where all of them have data. A ValueError when a curve is empty or the curves do not overlap."""
    if axis not in AXES:
        raise ValueError(f"axis must be one of {', '.join(AXES)}, got {axis!r}")
    if not curves:
        raise ValueError("no curves to combine")
    empty = [c.name for c in curves if not len(c.values)]
    if empty:
        raise ValueError(f"no finished episode recorded in {', '.join(empty)}")
    start = max(float(c.x(axis)[0]) for c in curves)
    stop = min(float(c.x(axis)[-1]) for c in curves)
    if start > stop:
        raise ValueError(f"the curves of {', '.join(c.name for c in curves)} do not overlap in {AXES[axis][0]}")
    grid = np.unique(np.concatenate([c.x(axis) for c in curves]))
    grid = grid[(grid >= start) & (grid <= stop)]
    ys = np.stack([np.interp(grid, c.x(axis), c.values) for c in curves])  # [runs, m]
    return Band(grid, ys.mean(axis=0), ys.std(axis=0), ys.min(axis=0), ys.max(axis=0), len(curves))


def group_runs(run_dirs: list[str | Path], column: str = RETURN_COLUMN) -> list[Group]:
    """Read ``run_dirs`` and group them by config: runs whose ``config.yaml`` differs only in its ``run``
    section (seed, name, directory, ...) are one group, labelled by the environment id."""
    import yaml

    groups: dict[str, list[Curve]] = {}
    envs: dict[str, str] = {}
    for run_dir in run_dirs:
        curve = read_curve(run_dir, column)
        config = RunDir(run_dir).config_dict()
        key = yaml.safe_dump({k: v for k, v in config.items() if k != "run"}, sort_keys=True)
        groups.setdefault(key, []).append(curve)
        envs.setdefault(key, (config.get("env") or {}).get("id") or curve.name)
    labels = list(envs.values())
    return [Group(label if labels.count(label) == 1 else f"{label} ({curves[0].name}, ...)", curves)
            for curves, label in zip(groups.values(), labels)]


def require_matplotlib() -> None:
    """Raise PlotUnavailable, naming the install command, when matplotlib is missing."""
    _matplotlib()


def _matplotlib():
    """matplotlib's Figure and Agg canvas (no pyplot: no global state, no display needed)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise PlotUnavailable(f"drawing learning curves needs matplotlib: {INSTALL_HINT}") from err
    return Figure, FigureCanvasAgg


def draw(groups: list[Group], out: str | Path, title: str, axes: tuple[str, ...] = ("steps", "time"),
         reference: Reference | None = None, ylabel: str = RETURN_LABEL) -> Path:
    """Write a PNG to ``out``: one panel per axis, each group's mean as a line and its min-max as a shaded band
    (a single run: its own line), and ``reference`` as a dashed horizontal line. Returns ``out``."""
    Figure, FigureCanvasAgg = _matplotlib()
    from matplotlib.ticker import EngFormatter

    fig = Figure(figsize=(6.0 * len(axes), 4.4), layout="constrained")
    FigureCanvasAgg(fig)
    panels = fig.subplots(1, len(axes), squeeze=False)[0]
    colors = [f"C{i}" for i in range(10)]
    for panel, axis in zip(panels, axes):
        for i, group in enumerate(groups):
            color = colors[i % len(colors)]
            b = band(group.curves, axis)
            prefix = "" if len(groups) == 1 else f"{group.label}: "
            if b.runs == 1:
                panel.plot(b.x, b.mean, color=color, lw=1.6, label=f"{prefix}{group.curves[0].name}")
                continue
            panel.plot(b.x, b.mean, color=color, lw=1.8, label=f"{prefix}mean of {b.runs} {group.unit}")
            panel.fill_between(b.x, b.low, b.high, color=color, alpha=0.22, lw=0,
                               label=f"{prefix}min–max of {b.runs} {group.unit}")
        if reference is not None:
            panel.axhline(reference.value, color="0.25", ls="--", lw=1.2, label=reference.label)
            if reference.spread:
                panel.axhspan(reference.value - reference.spread, reference.value + reference.spread,
                              color="0.5", alpha=0.12, lw=0)
        panel.set_xlabel(AXES[axis][1])
        panel.set_ylabel(ylabel)
        panel.set_title(AXES[axis][2], fontsize=10)
        panel.grid(alpha=0.3)
        if axis == "steps":
            panel.xaxis.set_major_formatter(EngFormatter(sep=""))  # 250k, 1M
        panel.legend(fontsize=8, loc="best")
    fig.suptitle(title, fontsize=12)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    return out


def summary_line(b: Band) -> str:
    """The last point of a band in words, for the command line."""
    spread = "" if b.runs == 1 else f" (min {b.low[-1]:.1f}, max {b.high[-1]:.1f}, std {b.std[-1]:.1f})"
    return f"{b.runs} run{'s' if b.runs > 1 else ''}: {_fmt(b.mean[-1])} at x = {_fmt(b.x[-1])}{spread}"


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    return f"{value:,.0f}" if float(value).is_integer() and abs(value) >= 1000 else f"{value:,.1f}"
