"""The live progress display: a rich panel on a terminal, a plain line every few seconds elsewhere."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass

from rich.console import Console
from rich.live import Live
from rich.table import Table

from lockstep.config import Config


@dataclass
class Status:
    """What the progress display shows."""

    iteration: int = 0
    policy_version: int = 0
    env_steps: int = 0
    sps: float = 0.0
    episode_return_mean: float = math.nan
    episodes: int = 0
    actors: int = 0
    started: bool = False
    finished: bool = False
    eval_return_mean: float = math.nan  # the newest evaluation while training (run.eval_every) ...
    eval_iteration: int = 0  # ... of the version trained at this iteration


class Progress:
    def __init__(self, config: Config, enabled: bool = True, interval_s: float = 5.0) -> None:
        self.total = config.ppo.total_steps
        self.enabled = enabled
        self.console = Console(stderr=True)
        self.live: Live | None = None
        self.interval_s = interval_s
        self._last_line = 0.0
        self._last_iteration = -1

    def __enter__(self) -> Progress:
        if self.enabled and self.console.is_terminal:
            self.live = Live(console=self.console, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def update(self, status: Status) -> None:
        if not self.enabled:
            return
        if self.live is not None:
            self.live.update(self._table(status))
            return
        now = time.monotonic()
        if status.iteration != self._last_iteration and now - self._last_line >= self.interval_s:
            self._last_line, self._last_iteration = now, status.iteration
            print(self._line(status), file=sys.stderr, flush=True)

    def _line(self, s: Status) -> str:
        ret = "n/a" if math.isnan(s.episode_return_mean) else f"{s.episode_return_mean:.1f}"
        evaluated = ("" if math.isnan(s.eval_return_mean)
                     else f" | eval {s.eval_return_mean:.1f} (iter {s.eval_iteration})")
        return (f"iter {s.iteration} | version {s.policy_version} | steps {s.env_steps:,}/{self.total:,} "
                f"| {s.sps:,.0f} steps/s | return(20) {ret} | episodes {s.episodes} | actors {s.actors}{evaluated}")

    def _table(self, s: Status) -> Table:
        table = Table(title="lockstep", show_header=False, box=None)
        if not s.started:
            table.add_row("waiting for actors", f"{s.actors} connected")
            return table
        ret = "n/a" if math.isnan(s.episode_return_mean) else f"{s.episode_return_mean:.1f}"
        frac = min(1.0, s.env_steps / self.total) if self.total else 0.0
        bar = "█" * int(30 * frac) + "·" * (30 - int(30 * frac))
        table.add_row("env steps", f"{s.env_steps:,} / {self.total:,}  {bar} {100 * frac:.0f}%")
        table.add_row("steps/s", f"{s.sps:,.0f}")
        table.add_row("mean return (last 20)", ret)
        if not math.isnan(s.eval_return_mean):
            table.add_row(f"eval return (iter {s.eval_iteration})", f"{s.eval_return_mean:.1f}")
        table.add_row("episodes", f"{s.episodes:,}")
        table.add_row("policy version", str(s.policy_version))
        table.add_row("actors", str(s.actors))
        return table
