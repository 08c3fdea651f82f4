"""The learner's event loop (``learner.event_loop``): asyncio's own, or uvloop's (``auto``, the default: uvloop
where it is installed).

uvloop runs the loop itself in C (libuv): a wake-up for an actor's message costs less Python work
(docs/performance.md measures it on the shared-memory path). Everything the learner runs on it is
plain asyncio (tasks, futures, ``add_reader``, ``call_soon_threadsafe``, grpc.aio), so the choice
changes speed, not behaviour. uvloop is an optional package (``lockstep[fast]``; Linux and macOS):
``Config.validate`` refuses ``uvloop`` where it is not installed, before anything starts.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)


def runner(kind: str) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    """What runs the learner's main coroutine to its end on the event loop ``kind`` names (asyncio.run's
    contract)."""
    if kind == "asyncio":
        return asyncio.run
    try:
        import uvloop
    except ImportError:
        if kind == "uvloop":  # Config.validate refuses this before it gets here
            raise
        return asyncio.run  # auto without uvloop
    return lambda main: uvloop.run(_announced(main))


async def _announced(main: Coroutine[Any, Any, Any]) -> Any:
    loop = asyncio.get_running_loop()
    log.info("event loop: %s.%s", type(loop).__module__, type(loop).__name__)
    return await main
