"""Which torch device ``--device`` names, and the numerics the learner's CUDA work runs with.

``resolve_device`` decides at start whether the device exists, so a wrong ``--device`` fails with the
GPUs there are rather than at the first tensor moved. Under torchrun (``LOCAL_RANK`` set) ``auto`` and
``cuda`` mean this rank's own GPU, ``cuda:LOCAL_RANK``: every rank on ``cuda:0`` makes NCCL fail
("Duplicate GPU detected") or hang at the first collective, which is also why ``cuda:N`` is refused
with several ranks per node.

``prepare_device`` also sets what a CUDA learner computes with (docs/performance.md, "On a GPU"):

* float32, never TF32, for matmuls and convolutions (cuDNN's default is TF32, 10 bits of mantissa):
  the audit recomputes every log-prob on the CPU in float32 within float32's rounding of its terms,
  which a TF32 forward pass of a CNN or an LSTM exceeds;
* with ``deterministic`` (``learner.deterministic``, what ``bench repro`` sets), the same kernels and
  reduction orders on every run: ``cudnn.deterministic``, no cuDNN autotuning, cuBLAS's fixed workspace
  (``CUBLAS_WORKSPACE_CONFIG``, read when cuBLAS starts, so set before any CUDA work) and
  ``torch.use_deterministic_algorithms`` in its warning mode: an op with no deterministic CUDA kernel
  warns once, naming itself, and the promise of bitwise repeats does not cover a run that warned.
"""

from __future__ import annotations

import os

import torch

from lockstep.config import ConfigError

CUBLAS_WORKSPACE = ":4096:8"  # one of the two settings NVIDIA documents for deterministic cuBLAS


def _gpus() -> str:
    return ", ".join(f"cuda:{i} ({torch.cuda.get_device_name(i)})" for i in range(torch.cuda.device_count()))


def resolve_device(name: str) -> torch.device:
    """``--device``: auto (CUDA when torch sees it, else the CPU), cpu, cuda or cuda:N; a ``ConfigError``
    for a GPU that is not there (none at all, or N past the last one), naming the GPUs there are."""
    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"--device {name} was asked for, but torch {torch.__version__} sees no CUDA device; "
                          f"use --device auto or cpu")
    local_rank = os.environ.get("LOCAL_RANK")  # torchrun: this rank's place on its node
    if ":" in name and int(os.environ.get("LOCAL_WORLD_SIZE", "1")) > 1:
        raise ConfigError(f"--device {name} would put every torchrun rank of this node on one GPU (NCCL fails or "
                          f"hangs); use --device cuda or auto: each rank takes cuda:LOCAL_RANK")
    index = int(name.split(":", 1)[1]) if ":" in name else int(local_rank or 0)
    count = torch.cuda.device_count()
    if index >= count:
        asked = (f"--device {name} is cuda:{index}" if ":" in name
                 else f"torchrun's LOCAL_RANK {local_rank} asks for cuda:{index}")
        raise ConfigError(f"{asked}, but this machine has {count} GPU{'s' * (count != 1)}: {_gpus()}; "
                          f"use one of them (or fewer ranks per node than GPUs)")
    return torch.device("cuda", index)


def prepare_device(name: str, deterministic: bool = False) -> torch.device:
    """``resolve_device(name)``, with the learner's CUDA numerics set when it is a GPU (module docstring)."""
    device = resolve_device(name)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        if deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
            torch.backends.cudnn.deterministic = True
            torch.backends.cudnn.benchmark = False
            torch.use_deterministic_algorithms(True, warn_only=True)
    return device
