"""``EpisodeTracker``: one definition of "the running mean reached a target" for the early stop
(``run.stop_at_return``) and for ``first_reached``: the mean of the last ``window`` episodes,
only once ``window`` episodes have finished."""

from __future__ import annotations

import math

import numpy as np

from lockstep.observe.metrics import EpisodeTracker


def _add(tracker: EpisodeTracker, returns: list[float], env_steps: int = 0) -> None:
    tracker.add(np.array(returns, np.float64), np.full(len(returns), 10, np.int64), env_steps, wall_s=1.0)


def test_a_partial_window_never_reaches_a_target():
    tracker = EpisodeTracker([195.0], window=20)
    _add(tracker, [500.0] * 5)
    # the old early-stop check read the mean of the episodes so far, 5 of them here
    assert tracker.stats()["episode_return_mean20"] >= 195.0
    assert math.isnan(tracker.running_mean())
    assert not tracker.reached(195.0)
    assert tracker.first_reached == {"195": None}


def test_a_full_window_reaches_exactly_when_its_mean_does():
    tracker = EpisodeTracker([195.0], window=4)
    _add(tracker, [100.0, 200.0, 200.0], env_steps=30)
    assert not tracker.reached(150.0)
    _add(tracker, [280.0], env_steps=40)
    assert tracker.running_mean() == 195.0
    assert tracker.reached(195.0) and not tracker.reached(195.5)
    assert tracker.first_reached["195"] == {"env_steps": 40, "wall_s": 1.0}
    _add(tracker, [0.0], env_steps=50)  # the window slides: the oldest return (100) leaves it
    assert tracker.running_mean() == (200.0 + 200.0 + 280.0 + 0.0) / 4
    assert not tracker.reached(195.0)
    assert tracker.first_reached["195"] == {"env_steps": 40, "wall_s": 1.0}  # the first crossing is kept


def test_first_reached_and_reached_agree_on_every_prefix():
    rng = np.random.default_rng(0)
    returns = rng.uniform(0, 300, size=60).tolist()
    tracker = EpisodeTracker([150.0], window=20)
    crossed_at = None
    for i, r in enumerate(returns):
        _add(tracker, [r], env_steps=i)
        if crossed_at is None and tracker.reached(150.0):
            crossed_at = i
    recorded = tracker.first_reached["150"]
    assert (recorded is None and crossed_at is None) or recorded["env_steps"] == crossed_at


def test_metrics_column_keeps_the_mean_of_up_to_window_episodes():
    tracker = EpisodeTracker([], window=20)
    assert math.isnan(tracker.stats()["episode_return_mean20"])
    _add(tracker, [1.0, 2.0, 3.0])
    assert tracker.stats()["episode_return_mean20"] == 2.0


def test_the_window_survives_a_checkpoint():
    tracker = EpisodeTracker([195.0], window=3)
    _add(tracker, [200.0, 200.0])
    restored = EpisodeTracker([195.0], window=3)
    restored.load_state_dict(tracker.state_dict())
    assert not restored.reached(195.0)
    _add(restored, [200.0])
    assert restored.reached(195.0) and restored.running_mean() == 200.0
