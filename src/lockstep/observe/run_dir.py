"""Reading a run directory: ``metrics.csv`` rows with typed columns, ``summary.json`` and the resolved config.

The one reader of what a run leaves behind (``lockstep plot``, ``lockstep eval``, the benchmarks and the
tests all read through it); ``observe.metrics`` writes these files.

Types. A ``metrics.csv`` cell is an ``int`` in the columns that count (``INTEGER_COLUMNS``), a ``float``
elsewhere, and ``None`` where it is empty (a mean before the first finished episode). The file may be
read while the learner appends to it: a last line without its newline is a row being written and is
left out, so every row returned is whole.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import yaml

from lockstep import config as config_lib

Value = int | float | None

# metrics.csv columns that count things (observe.metrics.COLUMNS names them all)
INTEGER_COLUMNS = frozenset({
    "iteration", "policy_version", "env_steps", "episodes", "off_policy_samples", "policy_lag_max",
    "dropped_transitions", "actors", "wasted_forward_passes", "rejected_rpcs", "torn_reads", "stalls",
    "torn_reads_used", "evicted_actors", "games", "games_decided_before_move", "policy_lag_p50", "policy_lag_p90",
})


class NotARunDir(FileNotFoundError):
    """A file a run writes is missing: the message says which, and what writes it."""


class RunDir:
    """The files of one run directory ``runs/<name>/``, read when asked for (each call reads afresh)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.csv"

    @property
    def summary_path(self) -> Path:
        return self.path / "summary.json"

    @property
    def config_path(self) -> Path:
        return self.path / "config.yaml"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    def columns(self) -> list[str]:
        """The header of ``metrics.csv``; a ``NotARunDir`` when there is none."""
        return next(csv.reader(io.StringIO(self._metrics_text(required=True))), [])

    def metrics(self) -> list[dict[str, Value]]:
        """The whole rows of ``metrics.csv`` written so far, typed (module docstring); none before the file exists."""
        return [{k: _typed(k, v) for k, v in row.items()} for row in csv.DictReader(io.StringIO(self._metrics_text()))]

    def column(self, name: str) -> list[Value]:
        """One column of ``metrics``, in row order."""
        return [row.get(name) for row in self.metrics()]

    def summary(self) -> dict[str, Any] | None:
        """``summary.json``, or None before the run has finished (it is written at the end)."""
        if not self.summary_path.is_file():
            return None
        return json.loads(self.summary_path.read_text())

    def config(self) -> config_lib.Config:
        """The resolved config the run was started with."""
        self._require(self.config_path)
        return config_lib.load(self.config_path)

    def config_dict(self) -> dict[str, Any]:
        """``config.yaml`` as plain data, as written (empty when there is none): for comparing runs' configs."""
        if not self.config_path.is_file():
            return {}
        return yaml.safe_load(self.config_path.read_text()) or {}

    def _metrics_text(self, required: bool = False) -> str:
        if not self.metrics_path.is_file():
            if required:
                self._require(self.metrics_path)
            return ""
        text = self.metrics_path.read_text()
        if text and not text.endswith("\n"):  # a row the learner is writing right now
            text = text[:text.rfind("\n") + 1]
        return text

    def _require(self, path: Path) -> None:
        if not path.is_file():
            raise NotARunDir(f"no {path.name} in {self.path}: it is not a lockstep run directory (one that "
                             "`lockstep train` or `lockstep learner` writes), or its run has not written it yet")


def _typed(column: str, text: str | None) -> Value:
    if text is None or text == "":
        return None
    return int(text) if column in INTEGER_COLUMNS else float(text)
