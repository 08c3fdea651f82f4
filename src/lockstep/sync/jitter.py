"""Adversarial timing: random delays at the points where a real scheduler could preempt a thread."""

from __future__ import annotations

import random
import threading
import time


class Jitter:
    """Random delays up to ``max_ms`` (``--jitter-ms``, adversarial testing); free when ``max_ms`` is 0.

    Thread-safe; ``seconds()`` draws a delay for code that waits its own way (an
    event loop awaits it), calling the object sleeps it.
    """

    def __init__(self, max_ms: float, seed: int) -> None:
        self.max_s = max_ms / 1000.0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def seconds(self) -> float:
        if not self.max_s:
            return 0.0
        with self._lock:
            return self._rng.uniform(0.0, self.max_s)

    def __call__(self) -> None:
        delay = self.seconds()
        if delay:
            time.sleep(delay)
