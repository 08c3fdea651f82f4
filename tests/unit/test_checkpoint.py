"""Checkpoints: atomic, loadable without running pickled code, always to the CPU, found by one rule, and the
every-N / keep-K policy."""

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


def _saved_on_another_device(state: dict, path, device: bytes = b"cuda:0"):
    """``state`` as torch.save writes it on ``device``: the pickled storage location names it."""
    torch.save(state, path, _use_new_zipfile_serialization=False)  # one pickle stream: the location is visible
    data = path.read_bytes()
    cpu = b"X" + (3).to_bytes(4, "little") + b"cpu"  # BINUNICODE "cpu"
    assert data.count(cpu) >= 1
    path.write_bytes(data.replace(cpu, b"X" + len(device).to_bytes(4, "little") + device))
    return path


def test_a_checkpoint_saved_on_a_gpu_with_numpy_arrays_loads_on_the_cpu(tmp_path):
    # an audit policy file: a state dict and plain numpy arrays (not packed as tensors)
    state = {"version": 3, "model": {"w": torch.arange(4.0)}, "obs_mean": np.arange(2.0), "obs_var": None}
    path = _saved_on_another_device(state, tmp_path / "policy_v000003.pt")
    loaded = checkpoint.load(path)
    assert loaded["model"]["w"].device == torch.device("cpu") and torch.equal(loaded["model"]["w"], torch.arange(4.0))
    assert isinstance(loaded["obs_mean"], np.ndarray) and loaded["obs_mean"].tolist() == [0.0, 1.0]


def _periodic_and_final(directory, periodic: tuple[int, ...], final: int | None) -> None:
    for iteration in periodic:
        checkpoint.save(_state(iteration), checkpoint.periodic_path(directory, iteration))
    if final is not None:
        checkpoint.save(_state(final), directory / "final.pt")


def test_newest_is_the_highest_iteration_and_final_is_final_pt_even_when_a_periodic_one_is_newer(tmp_path):
    # a finished run (final at 6) resumed and stopped after periodic checkpoint 8: resume continues from 8,
    # eval plays what the finished run trained to
    _periodic_and_final(tmp_path, (4, 8), final=6)
    assert checkpoint.find(tmp_path) == tmp_path / "iter_000008.pt"
    assert checkpoint.find(tmp_path, checkpoint.FINAL) == tmp_path / "final.pt"


def test_final_falls_back_to_the_newest_periodic_and_newest_counts_final(tmp_path):
    _periodic_and_final(tmp_path, (2, 10), final=None)
    assert checkpoint.find(tmp_path, checkpoint.FINAL) == tmp_path / "iter_000010.pt"
    checkpoint.save(_state(12), tmp_path / "final.pt")
    assert checkpoint.find(tmp_path) == tmp_path / "final.pt"


def test_a_named_checkpoint_is_found_by_path_or_by_name_and_a_missing_one_is_named(tmp_path):
    _periodic_and_final(tmp_path, (2, 4), final=4)
    assert checkpoint.find(tmp_path, "iter_000002.pt") == tmp_path / "iter_000002.pt"
    assert checkpoint.find(tmp_path / "elsewhere", str(tmp_path / "iter_000002.pt")) == tmp_path / "iter_000002.pt"
    with pytest.raises(FileNotFoundError, match="checkpoint iter_000003.pt does not exist"):
        checkpoint.find(tmp_path, "iter_000003.pt")
    for which in (checkpoint.NEWEST, checkpoint.FINAL):
        with pytest.raises(FileNotFoundError, match="no checkpoint in .*checkpoint-every"):
            checkpoint.find(tmp_path / "empty", which)


def test_atomic_write_leaves_the_old_file_whole_when_writing_fails(tmp_path):
    path = atomic_write(tmp_path / "f.txt", "old")

    def failing(f):
        f.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        atomic_write(path, failing)
    assert path.read_text() == "old"
