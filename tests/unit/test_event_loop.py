"""``learner.event_loop``: the learner's main coroutine on asyncio's loop or uvloop's, and a clear refusal
when uvloop is asked for and not installed."""

from __future__ import annotations

import asyncio
import sys

import pytest

from lockstep.config import Config, ConfigError
from lockstep.learner import event_loop


async def _which_loop() -> str:
    await asyncio.sleep(0)
    return type(asyncio.get_running_loop()).__module__.split(".")[0]


@pytest.mark.parametrize("kind, expected", [("asyncio", "asyncio"), ("uvloop", "uvloop"), ("auto", "uvloop")])
def test_the_runner_runs_the_coroutine_on_the_loop_it_names(kind, expected):
    assert event_loop.runner(kind)(_which_loop()) == expected  # make test installs uvloop (lockstep[fast])


def test_auto_without_uvloop_is_asyncio(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if not installed: its import raises ImportError
    config = Config()
    assert config.learner.event_loop == "auto"
    config.validate()
    assert event_loop.runner("auto")(_which_loop()) == "asyncio"


def test_uvloop_asked_for_and_missing_is_refused_by_the_config_by_name(monkeypatch):
    config = Config()
    config.learner.event_loop = "uvloop"
    config.validate()  # installed here (make test installs lockstep[fast])
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if not installed: find_spec finds nothing
    with pytest.raises(ConfigError, match=r"uvloop package is not installed: pip install 'lockstep\[fast\]'"):
        config.validate()


def test_an_unknown_event_loop_is_refused_by_the_config():
    config = Config()
    config.learner.event_loop = "trio"
    with pytest.raises(ConfigError, match="learner.event_loop must be one of auto, asyncio, uvloop"):
        config.validate()
