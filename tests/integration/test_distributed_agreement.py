"""The ranks' one collective after every update (``Ranks.agree``): the run is done when any rank is done
(its budget, or a stop asked of it), and a periodic checkpoint is due when rank 0 says so, whatever the
other ranks' clocks say; so every rank stops after the same iteration and saves the same iterations.
On resume (``Ranks.newest_common``) every rank takes its own file of the newest iteration all ranks have,
and with none in common every rank fails, naming each rank's iterations."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.multiprocessing as mp
from conftest import unused_port

from lockstep.learner import checkpoint
from lockstep.learner.distributed import Ranks


def _rank_main(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      GLOO_SOCKET_IFNAME="lo")
    ranks = Ranks.from_env(torch.device("cpu"), timeout_s=60)
    decisions = [
        ranks.agree(done=False, checkpoint_due=rank == 1),  # only rank 1's clock says "due": no checkpoint
        ranks.agree(done=False, checkpoint_due=rank == 0),  # rank 0's says so: every rank checkpoints
        ranks.agree(done=rank == 1, checkpoint_due=True),  # rank 1 was asked to stop: every rank stops
        ranks.agree(done=False, checkpoint_due=False),
    ]
    resumed = []
    for case, held in {"differ": [[1, 2, 3], [1, 2]][rank], "disjoint": [[2], [1]][rank]}.items():
        keeper = checkpoint.Checkpointer(Path(out) / case / f"rank{rank}")
        for iteration in held:
            path = checkpoint.periodic_path(keeper.directory, iteration)
            checkpoint.save({"trainer": {"iteration": iteration}}, path)
        checkpoint.save({"trainer": {"iteration": held[-1]}}, keeper.directory / "final.pt")
        try:
            path, state = ranks.newest_common(keeper)
            resumed.append((path.name, state["trainer"]["iteration"]))
        except FileNotFoundError as err:
            resumed.append(str(err))
    torch.save({"decisions": decisions, "resumed": resumed}, Path(out) / f"rank{rank}.pt")
    ranks.close()


def test_every_rank_gets_the_same_decisions_and_resumes_from_the_same_iteration(tmp_path):
    mp.spawn(_rank_main, args=(unused_port(), str(tmp_path)), nprocs=2, join=True)
    expected = [(False, False), (False, True), (True, True), (False, False)]
    got = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    assert [g["decisions"] for g in got] == [expected, expected]
    for g in got:
        assert g["resumed"][0] == ("iter_000002.pt", 2)  # rank 0's newest (3) is not on rank 1
        assert "no checkpoint iteration is present on every rank (rank 0: [2]; rank 1: [1])" in g["resumed"][1]
