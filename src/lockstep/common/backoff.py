"""Exponential backoff, shared by actors reconnecting to a learner and the supervisor restarting actors.

Imported by the actor, so it must not import torch.
"""

from __future__ import annotations

import random
import time


class Backoff:
    """Delays of ``base_s * 2**attempt``, capped at ``cap_s``, optionally with full jitter.

    ``budget_s`` bounds the total time from the first failure: once it is spent,
    ``delay()`` returns None and the caller gives up. ``reset()`` after a success.
    """

    def __init__(self, base_s: float = 0.5, cap_s: float = 10.0, budget_s: float | None = None,
                 jitter: bool = True, rng: random.Random | None = None,
                 clock=time.monotonic) -> None:
        self.base_s, self.cap_s, self.budget_s, self.jitter = base_s, cap_s, budget_s, jitter
        self._rng = rng or random.Random()
        self._clock = clock
        self.reset()

    def reset(self) -> None:
        self.attempt = 0
        self.since: float | None = None

    def delay(self) -> float | None:
        """The wait before the next attempt, or None when the budget is spent; counts the attempt."""
        now = self._clock()
        if self.since is None:
            self.since = now
        left = None if self.budget_s is None else self.budget_s - (now - self.since)
        if left is not None and left <= 0:
            return None
        ceiling = min(self.cap_s, self.base_s * 2 ** self.attempt)
        self.attempt += 1
        delay = self._rng.uniform(0, ceiling) if self.jitter else ceiling
        return delay if left is None else min(delay, left)

    def wait(self) -> bool:
        """Sleep before the next attempt; False (without sleeping) when the budget is spent."""
        delay = self.delay()
        if delay is None:
            return False
        time.sleep(delay)
        return True
