import socket
import sys

import pytest


def lockstep_cmd() -> list[str]:
    """The lockstep command, run with the interpreter that runs the tests."""
    return [sys.executable, "-m", "lockstep"]


@pytest.fixture
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
