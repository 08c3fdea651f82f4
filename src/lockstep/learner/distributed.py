"""Several learners, one policy: data-parallel training with torch.distributed.

Started by ``torchrun --nproc_per_node N -m lockstep train ...`` (or ``... learner``), each rank is a
whole learner: its own actors, gate, batcher, rollout store, run directory (``RUN_DIR/rankR``) and
audit trail. The ranks share the training:

* Every rank starts from rank 0's parameters and closes its phases on its own; its trainer then
  joins the others for the update. Each minibatch's gradients are summed over the ranks weighted by
  their sample counts and divided by the total (a rank with an empty minibatch adds zeros), so every
  rank takes the same optimizer step and the parameters stay identical: ``check_identical`` compares
  a fingerprint of them on every rank after every update and fails the run if they differ.
* The ranks agree on everything that decides a step: the global number of env steps (the
  learning-rate schedule, the budget), early stopping on the approximate KL, the observation and
  reward statistics (their batch moments are gathered from every rank), and when to stop.
* All ranks publish version v+1 after the same update, so a sample's version stamp means the same
  policy on every rank, and strict on-policy holds across ranks.

* One collective after every update decides, for every rank at once, whether the run is done (any
  rank's budget, time limit, return target, or a stop asked of any rank: SIGINT/SIGTERM) and whether
  a periodic checkpoint is due (rank 0's clock and count decide): the ranks stop after the same
  iteration and save the same iterations.
* A resumed job continues from the newest iteration that every rank has a checkpoint of
  (``newest_common``), each rank from its own file of it, never from each rank's own newest.

A rank whose actors are all gone still takes part: its gate closes each phase empty once the phase's
version is published (the gate's ``close_empty``) and it trains on an empty batch (zero gradients),
so the others do not wait for it; actors that join again collect in the next phase. A rank that has
never had an actor keeps waiting for its first phase, and so does every other rank at its first
update; the stall watchdog logs which rank's actors are missing. ``gloo`` on the CPU, ``nccl`` on GPUs: one
GPU per rank, ``cuda:LOCAL_RANK`` (``learner.device.resolve_device``), made the current device before the
process group starts.
"""

from __future__ import annotations

import hashlib
import logging
import os
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from lockstep.learner import checkpoint

log = logging.getLogger(__name__)


SEED_STRIDE = 10_000  # rank r's envs and action noise use run seed + r * SEED_STRIDE


def ranks_run(ranks: Ranks, run_dir: Path, seed: int) -> tuple[Path, int]:
    """Rank r's run directory (rank 0's RUN_DIR/rankR: the ranks may have named their runs a second
    apart) and seed: distinct env seeds and action noise for its actors, whose ids repeat on every rank."""
    base = Path(ranks.share(str(run_dir)))
    return base / f"rank{ranks.rank}", seed + ranks.rank * SEED_STRIDE


class ParametersDiverged(RuntimeError):
    """The ranks' parameters differ after an update: data-parallel training is broken."""


class Ranks:
    """This process's place among the learners, and the collective operations training needs."""

    def __init__(self, rank: int, world: int, device: torch.device) -> None:
        self.rank, self.world, self.device = rank, world, device
        self.checks = 0  # parameter fingerprints compared so far

    @classmethod
    def from_env(cls, device: torch.device, timeout_s: float = 1800.0) -> Ranks | None:
        """The process group torchrun set up (``WORLD_SIZE`` > 1), or None for a single learner."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return None
        if not dist.is_initialized():
            if device.type == "cuda":  # cuda:LOCAL_RANK (resolve_device): NCCL binds each rank to the current device
                torch.cuda.set_device(device)
                dist.init_process_group("nccl", timeout=timedelta(seconds=timeout_s), device_id=device)
            else:
                dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
        rank = dist.get_rank()
        log.info("learner rank %d of %d (%s)", rank, world, dist.get_backend())
        return cls(rank, world, device)

    def share(self, value):
        """Rank 0's ``value`` (any picklable object), on every rank."""
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def broadcast(self, model: nn.Module) -> None:
        """Every rank starts from rank 0's parameters."""
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)

    def total(self, count: int) -> int:
        """The sum of ``count`` over the ranks."""
        t = torch.tensor([count], dtype=torch.int64, device=self.device)
        dist.all_reduce(t)
        return int(t.item())

    def agree(self, done: bool, checkpoint_due: bool) -> tuple[bool, bool]:
        """(any rank is done, rank 0 checkpoints now), in one collective after every update: the ranks stop
        after the same iteration, and save the same iterations whatever their own clocks say."""
        t = torch.tensor([int(done), int(checkpoint_due and self.rank == 0)], dtype=torch.int64, device=self.device)
        dist.all_reduce(t)
        return bool(t[0].item()), bool(t[1].item())

    def newest_common(self, checkpointer: checkpoint.Checkpointer, config: dict | None = None) -> tuple[Path, dict]:
        """What every rank resumes from: its own checkpoint of the newest iteration that every rank has one
        of (ranks killed between their saves hold different newest ones). A ``FileNotFoundError`` on every
        rank when they have no iteration in common; with ``config`` (the resumed run's, as a plain dict) a
        ``ConfigError`` if it changes what the checkpoint needs (``checkpoint.check_resume``)."""
        mine = checkpoint.by_iteration(checkpointer.directory)
        gathered: list = [None] * self.world
        dist.all_gather_object(gathered, sorted(mine))
        common = set.intersection(*(set(iterations) for iterations in gathered))
        if not common:
            held = "; ".join(f"rank {r}: {its or 'none'}" for r, its in enumerate(gathered))
            raise FileNotFoundError(f"nothing to resume: no checkpoint iteration is present on every rank "
                                    f"({held}); {checkpoint.HINT}")
        iteration = max(common)
        if iteration != max(mine):
            log.warning("rank %d resumes from iteration %d, the newest that every rank has a checkpoint of "
                        "(its own newest: %d)", self.rank, iteration, max(mine))
        path, state = mine[iteration], checkpoint.load(mine[iteration])
        if config is not None:
            checkpoint.check_resume(state.get("config"), config, path)
        return path, state

    def mean(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return float(t.item()) / self.world

    def reduce_gradients(self, model: nn.Module, samples: int) -> None:
        """Replace each rank's gradients by the sample-weighted mean over the ranks:
        sum_r(n_r * g_r) / sum_r(n_r). A rank with no samples (no gradient) contributes zeros."""
        params = [p for p in model.parameters() if p.requires_grad]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
        flat = flat.double() * samples
        count = torch.tensor([float(samples)], dtype=torch.float64, device=flat.device)
        dist.all_reduce(flat)
        dist.all_reduce(count)
        flat = (flat / max(count.item(), 1.0)).to(params[0].dtype)
        offset = 0
        for p in params:  # into the gradients in place: the update's bound tensors stay the model's (``algo.optim``)
            n = p.numel()
            mean = flat[offset:offset + n].view_as(p)
            if p.grad is None:
                p.grad = mean.clone()
            else:
                p.grad.copy_(mean)
            offset += n

    def moments(self, x: np.ndarray, shape: tuple[int, ...]) -> list[tuple[np.ndarray, np.ndarray, int]]:
        """(mean, variance, count) of each rank's rows of ``x`` [n, *shape], in rank order."""
        x = np.asarray(x, np.float64).reshape(-1, *shape)
        mine = (x.mean(0), x.var(0), len(x)) if len(x) else (np.zeros(shape), np.ones(shape), 0)
        gathered: list = [None] * self.world
        dist.all_gather_object(gathered, mine)
        return gathered

    def check_identical(self, model: nn.Module) -> None:
        """Compare a fingerprint of the parameters (their bytes) across the ranks; raise if any differs."""
        digest = hashlib.blake2b(digest_size=8)
        for tensor in model.state_dict().values():
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        mine = int.from_bytes(digest.digest(), "little", signed=True)
        prints = [torch.zeros(1, dtype=torch.int64, device=self.device) for _ in range(self.world)]
        dist.all_gather(prints, torch.tensor([mine], dtype=torch.int64, device=self.device))
        values = [int(p.item()) for p in prints]
        if len(set(values)) != 1:
            raise ParametersDiverged(f"rank {self.rank}: the ranks' parameters differ after an update "
                                     f"(fingerprints {values})")
        self.checks += 1

    def describe(self) -> dict:
        """For summary.json."""
        return {"rank": self.rank, "world": self.world, "identical_parameter_checks": self.checks}

    def close(self) -> None:
        """Leave the process group together: a rank that tears its side down while another still talks to
        it can abort that one (gloo), so every rank first waits for all the others."""
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
