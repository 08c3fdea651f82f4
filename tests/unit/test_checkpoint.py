"""Checkpoints: atomic, loadable without running pickled code, and the every-N / keep-K policy."""

from __future__ import annotations

import collections
import dataclasses
import pickle

import numpy as np
import pytest
import torch

from lockstep.common.files import atomic_write
from lockstep.config import Config
from lockstep.learner import checkpoint
from lockstep.learner.checkpoint import Checkpointer


def _state(iteration: int) -> dict:
    return {"trainer": {"iteration": iteration, "model": {"w": torch.arange(3.0)}, "rms": np.array([0.5, 2.0]),
                        "returns": {0: np.zeros(4), 3: np.ones(2)}, "generator": torch.Generator().get_state()},
            "counters": {"dropped_transitions": np.int64(7)}, "config": dataclasses.asdict(Config())}


def test_a_checkpoint_round_trips_arrays_tensors_and_the_config_as_plain_data(tmp_path):
    path = checkpoint.save(_state(4), tmp_path / "c.pt")
    state = checkpoint.load(path)
    trainer = state["trainer"]
    assert isinstance(trainer["rms"], np.ndarray) and trainer["rms"].tolist() == [0.5, 2.0]
    assert trainer["returns"][3].tolist() == [1.0, 1.0] and trainer["returns"][0].shape == (4,)
    assert torch.equal(trainer["model"]["w"], torch.arange(3.0))
    assert state["counters"]["dropped_transitions"] == 7
    assert state["config"]["ppo"]["steps_per_env"] == Config().ppo.steps_per_env


def test_loading_refuses_a_checkpoint_that_would_run_pickled_code(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"trainer": {"iteration": 1}, "payload": collections.OrderedDict, "obj": Config()}, path)
    with pytest.raises(pickle.UnpicklingError):
        checkpoint.load(path)


def test_the_checkpointer_saves_every_n_iterations_keeps_the_newest_k_and_resumes_from_the_newest(tmp_path):
    keeper = Checkpointer(tmp_path, every=2, keep=2)
    for iteration in range(1, 8):
        if keeper.due(iteration):
            keeper.save_periodic(_state(iteration), iteration)
    assert sorted(p.name for p in tmp_path.glob("iter_*.pt")) == ["iter_000004.pt", "iter_000006.pt"]
    keeper.save_final(_state(7))
    path, state = keeper.newest()
    assert path.name == "final.pt" and state["trainer"]["iteration"] == 7
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        Checkpointer(tmp_path / "empty").newest()


def test_atomic_write_leaves_the_old_file_whole_when_writing_fails(tmp_path):
    path = atomic_write(tmp_path / "f.txt", "old")

    def failing(f):
        f.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        atomic_write(path, failing)
    assert path.read_text() == "old"
