import os
import socket
import sys
from pathlib import Path

import pytest

VENV_BIN = Path(sys.executable).parent


def lockstep_cmd() -> list[str]:
    """The installed console script, run with the interpreter that runs the tests."""
    return [sys.executable, "-m", "lockstep"]


@pytest.fixture
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(autouse=True)
def _quiet_torch_threads():
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    yield
