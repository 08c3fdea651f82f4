"""Experiment tracking with Weights & Biases, beside metrics.csv and TensorBoard (``--wandb``).

Optional and never required: ``pip install -e '.[wandb]'``. The run's config goes in at the start,
every metrics row as it is written (its ``env_steps`` as the step; an evaluation's ``eval_return_*``
against its own ``eval_env_steps``), and summary.json at the end.
W&B's own settings apply: ``WANDB_MODE=offline`` keeps everything in RUN_DIR/wandb (``wandb sync``
uploads it later), ``WANDB_PROJECT`` / ``WANDB_ENTITY`` choose where it goes; lockstep itself never
contacts anything: what wandb does with the network is wandb's (and off in offline mode).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class MissingExtra(RuntimeError):
    """An optional package lockstep needs for what was asked is not installed."""


def _logged_in() -> bool:
    """Whether ``wandb login`` stored credentials (~/.netrc, as wandb keeps them)."""
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    return netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="replace")


class WandbRun:
    """One W&B run for one lockstep run."""

    def __init__(self, run_dir: Path, name: str, project: str, config: dict[str, Any], resume: bool) -> None:
        try:
            import wandb
        except ImportError as err:
            raise MissingExtra("--wandb needs Weights & Biases: pip install -e '.[wandb]' "
                               "(or pip install wandb)") from err
        self._wandb = wandb
        if "WANDB_MODE" not in os.environ and not os.environ.get("WANDB_API_KEY") and not _logged_in():
            os.environ["WANDB_MODE"] = "offline"  # no credentials: never prompt, keep the run in RUN_DIR/wandb
            log.warning("no Weights & Biases API key: logging offline to %s/wandb (upload later with wandb sync)",
                        run_dir)
        # the W&B run id is the run's name, so a resumed run continues the same W&B run
        self.run = wandb.init(project=project, name=name, id=name.replace("/", "-"), dir=str(run_dir),
                              config=config, resume="allow" if resume else None, reinit="finish_previous")
        # evaluation while training: its figures belong to the version of eval_env_steps, plotted against it
        self.run.define_metric("eval_env_steps")
        self.run.define_metric("eval_return_*", step_metric="eval_env_steps")
        log.info("logging to Weights & Biases: project %s, run %s (%s)", project, name,
                 os.environ.get("WANDB_MODE", "online"))

    def log(self, row: dict[str, Any]) -> None:
        self.run.log({k: v for k, v in row.items() if isinstance(v, (int, float))}, step=int(row["env_steps"]))

    def finish(self, summary: dict[str, Any]) -> None:
        for key, value in summary.items():
            if isinstance(value, (int, float, str)) or value is None:
                self.run.summary[key] = value
        self.run.finish()
