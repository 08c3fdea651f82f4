"""Host syncs, counted on any device: the tensor calls that make the host wait for a GPU to finish.

A value read back (``item``, ``tolist``, ``bool``/``int``/``float`` of a tensor, ``cpu``) and a shape that
depends on values (``nonzero``, indexing with a boolean mask) wait for every kernel queued before them.
On a GPU ``torch.cuda.set_sync_debug_mode("warn")`` reports such waits as they happen; ``HostSyncs``
counts the same calls wherever the tensors are, so the count of a training update can be held fixed by a
test on the CPU, where nothing waits. It counts what Python calls: a sync inside one C++ op is not seen.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

READS = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "nonzero", "argwhere",
         "masked_select", "unique"}  # each waits for the device (on a GPU)


def _masked(index: Any) -> bool:
    """Whether an index holds a boolean tensor (a mask: the result's shape depends on its values)."""
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


class HostSyncs(TorchFunctionMode):
    """``with HostSyncs() as syncs: ...``; then ``syncs.count`` and ``syncs.by_name`` (call name -> count)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_name: Counter[str] = Counter()

    @property
    def count(self) -> int:
        return sum(self.by_name.values())

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in READS or (name in ("__getitem__", "__setitem__") and len(args) > 1 and _masked(args[1])):
            self.by_name[name] += 1
        return func(*args, **(kwargs or {}))
