"""Atomic file writes: checkpoints, summaries and audit files are either whole or absent."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def atomic_write(path: Path, write: Callable[[BinaryIO], object] | bytes | str) -> Path:
    """Write ``path`` through a temporary file in the same folder, fsync it, then rename it over.

    ``write`` is the content (bytes or text) or a function that writes to the open binary file.
    A reader (or a resumed run after a crash) sees the old file or the new one, never a torn one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("wb") as f:
            if isinstance(write, str):
                f.write(write.encode())
            elif isinstance(write, bytes):
                f.write(write)
            else:
                write(f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
