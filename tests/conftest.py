"""What many tests share: the lockstep command, a free port, a learner config, a running learner, a run's reader.

``running_learner`` starts a real ``Learner`` in a thread of the test process: it serves real gRPC on a free
loopback port and the same-host transport (a unix socket and shared memory) at once, until the test ends or
calls ``stop()``. Clients in the test talk to it as actors do.
"""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import pytest

from lockstep import config as config_lib
from lockstep.observe.run_dir import RunDir

Transport = Literal["grpc", "shm"]


def lockstep_cmd() -> list[str]:
    """The lockstep command, run with the interpreter that runs the tests."""
    return [sys.executable, "-m", "lockstep"]


def unused_port() -> int:
    """A loopback port no one listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def free_port() -> int:
    return unused_port()


def learner_config(overrides: Mapping[str, Any] | None = None) -> config_lib.Config:
    """CartPole for a learner a test serves: one actor, no progress display and a step budget no test reaches
    (the test stops the learner); then ``overrides``, dotted keys as ``--set`` takes them."""
    config = config_lib.Config()
    config.run.progress = False
    config.ppo.total_steps = 10**9
    config.actors.count = 1
    return with_settings(config, overrides)


def with_settings(config: config_lib.Config, overrides: Mapping[str, Any] | None) -> config_lib.Config:
    """``config`` with ``overrides`` set, dotted keys as ``--set`` takes them."""
    for key, value in (overrides or {}).items():
        config_lib.set_value(config, key, value)
    return config


def preset_config(name: str, run_dir: Path, overrides: Mapping[str, Any] | None = None) -> config_lib.Config:
    """The preset ``name`` for a run in ``run_dir``, without the progress display; then ``overrides``."""
    config = config_lib.load(name)
    config.run.progress = False
    config.run.run_dir = str(run_dir)
    return with_settings(config, overrides)


@pytest.fixture
def tiny_config() -> config_lib.Config:
    """The smallest CartPole run a learner trains to its end: one actor with one env, one phase of 8 steps,
    one minibatch, an 8-unit network on the CPU."""
    return learner_config({"actors.envs_per_actor": 1, "ppo.steps_per_env": 8, "ppo.total_steps": 8,
                           "ppo.minibatches": 1, "model.hidden": [8], "learner.device": "cpu"})


@pytest.fixture
def run_dir(tmp_path) -> RunDir:
    """The reader of ``tmp_path / "run"``: where the test's run (and ``running_learner``'s first learner) writes."""
    return RunDir(tmp_path / "run")


class RunningLearner:
    """A real learner serving in a thread until ``stop()`` or the end of its step budget.

    ``address`` is where an actor of ``transport`` connects: ``127.0.0.1:PORT`` (gRPC) or ``unix:PATH``
    (the same-host transport); the learner serves both, at ``port`` and ``local_address``.
    """

    def __init__(self, config: config_lib.Config, run_dir: Path, transport: Transport = "grpc",
                 token: str | None = None) -> None:
        from lockstep.learner.wiring import Learner  # torch: imported by the tests that start a learner only

        self.learner = Learner(config, Path(run_dir), token=token)
        self.run = RunDir(run_dir)
        self.summary: dict[str, Any] | None = None  # what ``serve`` returned, once it has
        self._raised: BaseException | None = None
        self.thread = threading.Thread(target=self._serve, name="test-learner", daemon=True)
        self.thread.start()
        self.port = self.learner.wait_ready(timeout=60)
        self.local_address = self.learner.local_address
        if transport == "grpc":
            self.address = f"127.0.0.1:{self.port}"
        else:
            assert self.local_address and self.local_address.startswith("unix:"), self.local_address
            self.address = self.local_address

    @property
    def socket_path(self) -> str:
        """The file of the same-host server's unix socket."""
        return self.local_address.removeprefix("unix:")

    def _serve(self) -> None:
        try:
            self.summary = self.learner.serve()
        except BaseException as err:  # handed to the test by wait_finished
            self._raised = err

    def wait_finished(self, timeout: float = 60.0) -> dict[str, Any]:
        """Wait until serving ends; its summary, or what it raised, raised here (once)."""
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the learner still serves {timeout:.0f} s later"
        if self._raised is not None:
            raised, self._raised = self._raised, None
            raise raised
        return self.summary

    def stop(self, timeout: float = 30.0) -> dict[str, Any]:
        """Ask the learner to finish; wait for it (``wait_finished``)."""
        self.learner.stop()
        return self.wait_finished(timeout)


@pytest.fixture
def running_learner(run_dir) -> Iterator[Callable[..., RunningLearner]]:
    """Start learners (``RunningLearner``) that are stopped when the test ends.

    ``running_learner(overrides, transport="grpc", token=None)`` serves ``learner_config(overrides)``;
    ``config=`` serves that config instead (``overrides`` then change it). The first learner writes into
    ``run_dir``, later ones beside it (``run2``, ...).
    """
    started: list[RunningLearner] = []

    def start(overrides: Mapping[str, Any] | None = None, *, config: config_lib.Config | None = None,
              transport: Transport = "grpc", token: str | None = None) -> RunningLearner:
        if config is None:
            config = learner_config(overrides)
        else:
            for key, value in (overrides or {}).items():
                config_lib.set_value(config, key, value)
        path = run_dir.path if not started else run_dir.path.with_name(f"run{len(started) + 1}")
        started.append(RunningLearner(config, path, transport, token))
        return started[-1]

    yield start
    errors = []
    for running in started:
        try:
            running.stop()
        except BaseException as err:  # stop every learner before reporting the first failure
            errors.append(err)
    if errors:
        raise errors[0]


def _group_of(nodeid: str) -> str:
    """Which tests run together on one pytest-xdist worker, in order: a file's tests (so that a module's fixture is
    built once), and every test that starts Ray (so that no two Ray instances start on this host at once)."""
    path = nodeid.split("::", 1)[0]
    return "ray" if "ray" in path.rsplit("/", 1)[-1] or "[ray]" in nodeid else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``make test`` runs two workers with ``--dist loadgroup``: each group of ``_group_of`` is one unit of work.
    (xdist's own loadgroup reads ``xdist_group`` marks into the test ids, which pytest 9.2 no longer lets a
    plugin rewrite: its groups came apart, and a module's fixture was built on both workers.)"""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    # Units in the order of ``pytest_collection_modifyitems`` (xdist's default puts the files with the most
    # tests first: the many quick unit tests, and the few slow end-to-end ones last, one worker idle meanwhile)
    config.option.loadscopereorder = False

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group_of(nodeid)

    return ByGroup(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The Ray tests first (the longest unit of work, one after the other on one worker), then the end-to-end
    tests, then the unit tests: short units last, so that both workers finish together."""
    items.sort(key=lambda item: (_group_of(item.nodeid) != "ray", "/unit/" in item.nodeid))
