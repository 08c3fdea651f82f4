"""A trial's objective: the number a run's metrics.csv rows score under the spec's ``objective``.

The same function scores a finished run and a run still training (its rows so far, as if it ended
there), so the intermediate values the pruner compares are the final objective's own early readings.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lockstep.sweep.spec import Objective

Row = dict[str, Any]


@dataclass(frozen=True)
class RunBudget:
    """What one run may spend: ``total_steps`` env steps, and ``seconds`` of training when it has a time limit."""

    total_steps: int
    seconds: float | None = None

    def fraction(self, row: Row) -> float:
        """How much of the budget a run had spent at ``row``: the larger of its steps' and its seconds' shares."""
        spent = row["env_steps"] / self.total_steps
        if self.seconds:
            spent = max(spent, row["wall_s"] / self.seconds)
        return min(1.0, spent)

    def seconds_for(self, rows: Sequence[Row]) -> float:
        """The seconds a run's budget stands for: its time limit, else the time its whole step budget takes at
        the pace of ``rows``."""
        if self.seconds:
            return self.seconds
        last = rows[-1]
        return last["wall_s"] * self.total_steps / max(1, last["env_steps"])


def score(rows: Sequence[Row], objective: Objective, budget: RunBudget) -> float | None:
    """The objective of a run whose metrics.csv holds ``rows``; None while (or when) no row has the metric."""
    readings = [(row, float(row[objective.metric])) for row in rows
                if row.get(objective.metric) is not None and math.isfinite(float(row[objective.metric]))]
    if not readings:
        return None
    values = [v for _, v in readings]
    if objective.value == "final":
        return values[-1]
    if objective.value == "mean_last":
        return statistics.fmean(values[-objective.last:])
    column = "env_steps" if objective.value == "env_steps_to" else "wall_s"
    threshold = float(objective.threshold)
    for row, value in readings:
        if value >= threshold:
            return float(row[column])
    # never reached: the whole budget, and more the further the run's best stayed below the threshold
    cost = budget.total_steps if column == "env_steps" else budget.seconds_for(rows)
    return cost * (1.0 + max(0.0, threshold - max(values)) / max(abs(threshold), 1e-12))


def aggregate(values: Sequence[float], how: str, maximize: bool) -> float:
    """The seeds' objectives as one: their mean, median, or the worst of them."""
    if how == "mean":
        return statistics.fmean(values)
    if how == "median":
        return statistics.median(values)
    return min(values) if maximize else max(values)
