"""Writing the audit trail: every training batch and every policy version, each file whole or absent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from lockstep.common.files import atomic_write
from lockstep.config import Config
from lockstep.config import save as save_config
from lockstep.learner.rollout import Batch
from lockstep.sync import Strategy

FORMAT = """\
policy_vNNNNNN.pt   torch.save of {"version", "model" (state dict), "obs_mean", "obs_var"}
                    for policy version N (obs_* are None without observation normalization)
batch_NNNNNN.npz    iteration N's training batch: obs [T, N, *obs], actions [T, N, *act],
                    logprobs [T, N], versions [T, N] (the version that produced each action),
                    lengths [N] (steps of each slot; a slot cut short by the phase cut-off
                    has fewer than T, and its rows past that hold no sample),
                    trained_by (the version the update started from), strategy (the sync name),
                    max_lag (the strategy's bound on trained_by - version; -1: unbounded);
                    recurrent policies also: initial_state [N, S] (each slot's state at
                    its first step), starts [T, N] (steps whose state was reset: an episode began),
                    and the states inference left where values were bootstrapped: bootstrap_state
                    [N, S] (after each slot's last step), final_t, final_n [M] and final_state
                    [M, S] (after the step of each truncated episode's end);
                    a Dict or Tuple observation: obs/PATH [T, N, *leaf] for each leaf instead of obs
config.yaml         the run's configuration (environment, model, synchronization)

A sample recomputes when |recomputed - stored| <= tolerance (--tolerance, 1e-5) + 2^-18 x M, M the magnitude
of its log-prob's terms: float32 rounds the two computations differently (docs/reliability.md).
"""

UNBOUNDED = -1  # max_lag in a batch file of a strategy that does not bound the lag


def observation_arrays(obs: np.ndarray) -> dict[str, np.ndarray]:
    """The batch file's observation arrays: ``obs``, or ``obs/PATH`` per leaf for the records of a tree."""
    if obs.dtype.names:
        return {f"obs/{path}": obs[path] for path in obs.dtype.names}
    return {"obs": obs}


class AuditWriter:
    """Writes the audit trail; each file atomically (``files.atomic_write``: whole or absent)."""

    def __init__(self, directory: Path, config: Config, fresh: bool = True) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        if fresh:  # a new run in a reused directory must not be audited with an older run's files
            for old in [*directory.glob("batch_*.npz"), *directory.glob("policy_v*.pt")]:
                old.unlink()
        atomic_write(directory / "README.md",
                     "# audit\n\nWritten by `lockstep train --audit`; checked by `lockstep audit RUN_DIR`.\n\n```\n"
                     + FORMAT + "```\n")
        save_config(config, directory / "config.yaml")

    def policy(self, version: int, state_dict: dict, obs_mean: np.ndarray | None, obs_var: np.ndarray | None) -> None:
        state = {k: v.detach().cpu().clone() for k, v in state_dict.items()}
        atomic_write(self.directory / f"policy_v{version:06d}.pt", lambda f: torch.save(
            {"version": version, "model": state, "obs_mean": obs_mean, "obs_var": obs_var}, f))

    def batch(self, iteration: int, trained_by: int, strategy: Strategy, batch: Batch) -> None:
        # the bound is recorded with each batch: a resumed run may have been given another --max-lag
        bound = strategy.max_lag
        # a feedforward policy's state holds no floats: its batches keep the format they always had
        has_state = batch.initial_state.shape[1] > 0
        recurrent = {"initial_state": batch.initial_state, "starts": batch.starts} if has_state else {}
        if has_state and batch.bootstrap_state is not None:
            recurrent.update(bootstrap_state=batch.bootstrap_state, final_t=batch.final_t, final_n=batch.final_n,
                             final_state=batch.final_state)
        atomic_write(self.directory / f"batch_{iteration:06d}.npz", lambda f: np.savez_compressed(
            f, **observation_arrays(batch.obs), actions=batch.actions, logprobs=batch.logprobs, versions=batch.versions,
            lengths=batch.lengths, trained_by=np.int64(trained_by), strategy=np.str_(strategy.name),
            max_lag=np.int64(UNBOUNDED if bound is None else bound), **recurrent,
        ))
