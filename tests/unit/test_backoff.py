"""``Backoff``: doubling delays up to a cap, full jitter, a time budget on a fake clock, and reset."""

from __future__ import annotations

import random

from lockstep.common import backoff as backoff_module
from lockstep.common.backoff import Backoff


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_delays_double_up_to_the_cap():
    b = Backoff(base_s=0.5, cap_s=3.0, jitter=False)
    assert [b.delay() for _ in range(7)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0, 3.0]
    assert b.attempt == 7


def test_jitter_stays_between_zero_and_the_ceiling():
    b = Backoff(base_s=1.0, cap_s=8.0, jitter=True, rng=random.Random(1))
    ceilings = [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    for _ in range(50):
        b.reset()
        delays = [b.delay() for _ in ceilings]
        assert all(0.0 <= d <= c for d, c in zip(delays, ceilings)), delays
    assert len({b.delay() for _ in range(20)}) > 1  # jittered, not the ceiling every time


def test_jitter_draws_uniformly_below_the_ceiling():
    b = Backoff(base_s=1.0, cap_s=8.0, jitter=True, rng=random.Random(7))
    twin = random.Random(7)
    assert [b.delay() for _ in range(5)] == [twin.uniform(0, c) for c in (1.0, 2.0, 4.0, 8.0, 8.0)]


def test_budget_bounds_the_delays_and_then_returns_none():
    clock = FakeClock()
    b = Backoff(base_s=1.0, cap_s=4.0, budget_s=10.0, jitter=False, clock=clock)
    assert b.delay() == 1.0  # the budget runs from this first failure, at t = 100
    clock.now += 1.0
    assert b.delay() == 2.0
    clock.now += 2.0
    assert b.delay() == 4.0
    clock.now += 4.0
    assert b.delay() == 3.0  # 7 s of the 10 spent: the cap of 4 is cut to what is left
    clock.now += 3.0
    assert b.delay() is None
    clock.now += 60.0
    assert b.delay() is None


def test_zero_budget_gives_up_at_once():
    b = Backoff(base_s=1.0, budget_s=0.0, clock=FakeClock())
    assert b.delay() is None


def test_no_budget_never_gives_up():
    clock = FakeClock()
    b = Backoff(base_s=1.0, cap_s=2.0, budget_s=None, jitter=False, clock=clock)
    delays = []
    for _ in range(5):
        delays.append(b.delay())
        clock.now += 1e6
    assert delays == [1.0, 2.0, 2.0, 2.0, 2.0]


def test_reset_starts_the_delays_and_the_budget_again():
    clock = FakeClock()
    b = Backoff(base_s=1.0, cap_s=8.0, budget_s=5.0, jitter=False, clock=clock)
    assert [b.delay(), b.delay(), b.delay()] == [1.0, 2.0, 4.0]
    clock.now += 5.0
    assert b.delay() is None
    b.reset()  # a success: the next failure starts over
    clock.now += 1.0
    assert b.attempt == 0
    assert b.delay() == 1.0
    clock.now += 4.5
    assert b.delay() == 0.5  # the new budget runs from the first failure after the reset


def test_wait_sleeps_the_delay_and_refuses_once_the_budget_is_spent(monkeypatch):
    clock = FakeClock()
    slept = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.now += seconds

    monkeypatch.setattr(backoff_module.time, "sleep", sleep)
    b = Backoff(base_s=1.0, cap_s=4.0, budget_s=6.0, jitter=False, clock=clock)
    assert [b.wait(), b.wait(), b.wait(), b.wait()] == [True, True, True, False]
    assert slept == [1.0, 2.0, 3.0]  # the third delay is cut to the 3 s left
