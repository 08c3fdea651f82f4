"""Checkpoints past iteration 999,999 (issue 20, item 10): ``iter_1000000.pt`` has seven digits and sorts
before ``iter_999999.pt`` as a name, so pruning and ``find`` order periodic checkpoints by the iteration
in the name, never by the name."""

from __future__ import annotations

import torch

from lockstep.learner import checkpoint
from lockstep.learner.checkpoint import Checkpointer


def _state(iteration: int) -> dict:
    return {"trainer": {"iteration": iteration, "model": {"w": torch.full((1,), float(iteration))}}}


def test_pruning_across_iteration_999999_keeps_the_newest_and_find_picks_iteration_1000000(tmp_path):
    keeper = Checkpointer(tmp_path, every=1, keep=2)
    for iteration in (999_998, 999_999, 1_000_000):
        keeper.save_periodic(_state(iteration), iteration)
    assert sorted(p.name for p in tmp_path.glob("iter_*.pt")) == ["iter_1000000.pt", "iter_999999.pt"]
    assert checkpoint.find(tmp_path, checkpoint.NEWEST).name == "iter_1000000.pt"
    assert checkpoint.find(tmp_path, checkpoint.FINAL).name == "iter_1000000.pt"  # no final.pt: the newest
    path, state = keeper.newest()
    assert path.name == "iter_1000000.pt" and state["trainer"]["iteration"] == 1_000_000

    keeper.save_periodic(_state(1_000_001), 1_000_001)
    assert sorted(p.name for p in tmp_path.glob("iter_*.pt")) == ["iter_1000000.pt", "iter_1000001.pt"]


def test_periodic_lists_by_iteration_and_ignores_names_that_hold_none(tmp_path):
    for name in ("iter_1000000.pt", "iter_000007.pt", "iter_999999.pt", "iter_latest.pt", ".iter_000008.pt.tmp"):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in checkpoint.periodic(tmp_path)] == ["iter_000007.pt", "iter_999999.pt", "iter_1000000.pt"]
