"""``--device`` on machines with GPUs, without one: the device count and the calls that need a GPU are faked
(nothing else can show two GPUs on a CPU machine); the decisions under test are the real ones."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from lockstep.config import ConfigError
from lockstep.learner import device as device_lib
from lockstep.learner.device import prepare_device, resolve_device
from lockstep.learner.distributed import Ranks


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"NVIDIA H200 #{i}")
    monkeypatch.delenv("LOCAL_RANK", raising=False)


def test_auto_is_the_cpu_without_a_gpu_and_cuda_without_one_is_refused_at_start(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu") and resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match="--device cuda was asked for, but torch .* sees no CUDA device"):
        resolve_device("cuda")


def test_a_gpu_past_the_last_one_is_refused_naming_the_gpus_there_are(two_gpus):
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ConfigError, match=r"--device cuda:2 is cuda:2, but this machine has 2 GPUs: "
                                          r"cuda:0 \(NVIDIA H200 #0\), cuda:1 \(NVIDIA H200 #1\)"):
        resolve_device("cuda:2")


def test_under_torchrun_auto_and_cuda_mean_the_ranks_own_gpu(two_gpus, monkeypatch):
    assert resolve_device("cuda") == torch.device("cuda", 0)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert resolve_device("auto") == resolve_device("cuda") == torch.device("cuda", 1)
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(ConfigError, match="LOCAL_RANK 2 asks for cuda:2, but this machine has 2 GPUs"):
        resolve_device("cuda")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="--device cuda:1 would put every torchrun rank of this node on one GPU"):
        resolve_device("cuda:1")


def test_a_cuda_rank_sets_its_device_before_the_process_group_starts_and_passes_it(two_gpus, monkeypatch):
    calls = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    monkeypatch.setattr(dist, "init_process_group",
                        lambda backend, **kw: calls.append(("init", backend, kw.get("device_id"))))
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_backend", lambda: "nccl")
    ranks = Ranks.from_env(resolve_device("auto"))
    cuda1 = torch.device("cuda", 1)
    assert calls == [("set_device", cuda1), ("init", "nccl", cuda1)] and ranks.device == cuda1


@pytest.fixture
def numerics():
    """Restore the process-wide switches ``prepare_device`` sets."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision(), torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
             torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    yield
    (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, precision,
     torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark, enabled, warn_only) = saved
    torch.set_float32_matmul_precision(precision)
    torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def test_a_cuda_learner_computes_in_float32_and_a_deterministic_one_fixes_its_kernels(two_gpus, numerics,
                                                                                      monkeypatch):
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # restored as it was after the test
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True  # cuDNN's own default
    torch.set_float32_matmul_precision("high")
    assert prepare_device("cuda:0") == torch.device("cuda", 0)
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert torch.get_float32_matmul_precision() == "highest" and not torch.are_deterministic_algorithms_enabled()
    prepare_device("cuda:1", deterministic=True)
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == device_lib.CUBLAS_WORKSPACE


def test_a_cpu_learner_leaves_the_process_numerics_alone(numerics):
    torch.backends.cudnn.allow_tf32 = True
    prepare_device("cpu", deterministic=True)
    assert torch.backends.cudnn.allow_tf32 and not torch.are_deterministic_algorithms_enabled()
