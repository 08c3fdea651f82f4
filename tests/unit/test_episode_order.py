"""``EpisodeTracker`` orders episodes by key, not by arrival: its windows are a function of the set of
(key, return, length) added, whatever order ``add`` was called in, and ``first_reached`` names the same
crossing when the statistics are read at the same points."""

from __future__ import annotations

import math

import numpy as np

from lockstep.observe.metrics import EpisodeTracker

Message = tuple[tuple[int, int], list[float], list[int]]  # key (step counter, actor), returns, lengths


def _messages(seed: int = 0, actors: int = 3, steps: int = 120) -> list[Message]:
    """Messages of ``actors`` actors over ``steps`` steps, most with no finished episode, some with several."""
    rng = np.random.default_rng(seed)
    out = []
    for counter in range(steps):
        for actor in range(actors):
            e = int(rng.choice([0, 0, 0, 1, 2]))
            if e:
                out.append(((counter, actor), rng.uniform(0, 300, e).round(3).tolist(),
                            rng.integers(5, 500, e).tolist()))
    return out


def _feed(tracker: EpisodeTracker, messages: list[Message]) -> None:
    for i, (key, returns, lengths) in enumerate(messages):
        tracker.add(np.array(returns), np.array(lengths), env_steps=i, wall_s=float(i), key=key)


def _shuffled(messages: list[Message], seed: int) -> list[Message]:
    order = np.random.default_rng(seed).permutation(len(messages))
    return [messages[i] for i in order]


def _snapshot(tracker: EpisodeTracker) -> tuple:
    stats = tracker.stats()
    return (tuple(stats.values()), tracker.running_mean(), tracker.state_dict()["returns"],
            tracker.state_dict()["lengths"])


def test_windows_do_not_depend_on_the_order_of_add():
    messages = _messages()
    reference = EpisodeTracker([150.0], window=20)
    _feed(reference, messages)
    expected = _snapshot(reference)
    assert expected[0][0] > 100  # more episodes than the 100-episode window: membership matters
    for seed in range(5):
        tracker = EpisodeTracker([150.0], window=20)
        _feed(tracker, _shuffled(messages, seed))
        assert _snapshot(tracker) == expected  # exact: the same floats summed in the same order


def test_windows_do_not_depend_on_when_statistics_are_read():
    messages = _messages(seed=1)
    reference = EpisodeTracker([], window=20)
    _feed(reference, messages)
    tracker = EpisodeTracker([], window=20)
    for i, message in enumerate(_shuffled(messages, seed=9)):
        _feed(tracker, [message])
        if i % 7 == 0:
            tracker.stats()  # a read between arrivals merges what has come so far
    assert _snapshot(tracker) == _snapshot(reference)


def test_first_reached_names_the_same_crossing_when_reads_happen_at_the_same_points():
    """Reads after each phase (the strict learner's metrics row): arrival order within a phase varies."""
    messages = _messages(seed=2, steps=200)
    phases = [[m for m in messages if 16 * p < m[0][0] <= 16 * (p + 1)] for p in range(-1, 13)]

    def run(seed: int | None) -> tuple[dict, list[float]]:
        tracker = EpisodeTracker([140.0, 150.0], window=20)
        means = []
        for phase in phases:
            arrived = phase if seed is None else _shuffled(phase, seed)
            for key, returns, lengths in arrived:
                # env_steps: where the crossing episode's key was, so the comparison sees which one crossed
                tracker.add(np.array(returns), np.array(lengths), env_steps=key[0] * 10 + key[1], wall_s=0.0,
                            key=key)
            means.append(tracker.running_mean())
        return tracker.first_reached, means

    expected = run(None)
    assert any(v is not None for v in expected[0].values())
    for seed in range(4):
        got = run(seed)
        assert got[0] == expected[0]
        assert [m if not math.isnan(m) else None for m in got[1]] == [
            m if not math.isnan(m) else None for m in expected[1]]


def test_reached_uses_the_ordered_window():
    tracker = EpisodeTracker([100.0], window=2)
    # the later key arrives first: in key order the window is (0, 200) -> mean 100, in arrival order (200, 0)
    tracker.add(np.array([0.0]), np.array([1]), env_steps=0, wall_s=0.0, key=(2, 0))
    tracker.add(np.array([200.0]), np.array([1]), env_steps=0, wall_s=0.0, key=(1, 0))
    tracker.add(np.array([300.0]), np.array([1]), env_steps=0, wall_s=0.0, key=(0, 0))
    assert tracker.running_mean() == 100.0  # the last two by key: 200 (key 1) and 0 (key 2)
    assert tracker.reached(100.0) and not tracker.reached(100.5)
    assert tracker.first_reached["100"] is not None


def test_a_resumed_tracker_continues_the_order():
    messages = _messages(seed=3)
    half = len(messages) // 2
    whole = EpisodeTracker([], window=20)
    _feed(whole, messages)
    first = EpisodeTracker([], window=20)
    _feed(first, messages[:half])
    resumed = EpisodeTracker([], window=20)
    resumed.load_state_dict(first.state_dict())
    _feed(resumed, _shuffled(messages[half:], seed=4))
    assert _snapshot(resumed) == _snapshot(whole)


def test_a_state_without_keys_loads_before_every_new_episode():
    tracker = EpisodeTracker([], window=2)
    tracker.load_state_dict({"returns": [1.0, 2.0, 3.0], "lengths": [1, 1, 1], "recent": [2.0, 3.0], "count": 3,
                             "first_reached": {}})
    assert tracker.running_mean() == 2.5
    tracker.add(np.array([5.0]), np.array([1]), env_steps=0, wall_s=0.0, key=(0, 0))
    assert tracker.running_mean() == 4.0 and tracker.stats()["episodes"] == 4
