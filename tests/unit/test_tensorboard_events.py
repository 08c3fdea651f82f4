"""The TensorBoard events a run writes: one event per metrics row, every numeric column a scalar tag."""

from __future__ import annotations

import math

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lockstep.observe.metrics import COLUMNS, MetricsWriter


def test_each_rows_numbers_reach_tensorboard_under_their_column_names(tmp_path):
    writer = MetricsWriter(tmp_path)
    rows = [{"iteration": i, "policy_version": i, "env_steps": 512 * i, "wall_s": 0.5 * i,
             "episode_return_mean": 10.0 * i, "policy_loss": -0.01 * i, "approx_kl": math.nan, "actors": 2}
            for i in (1, 2, 3)]
    for row in rows:
        writer.write(row)
    writer.close()

    events = EventAccumulator(str(tmp_path))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert tags == {"lockstep/wall_s", "lockstep/episode_return_mean", "lockstep/policy_loss", "lockstep/actors"}
    assert not {f"lockstep/{c}" for c in COLUMNS[:3]} & tags  # iteration, version and steps are the axes
    returns = events.Scalars("lockstep/episode_return_mean")
    assert [(e.step, e.value) for e in returns] == [(512, 10.0), (1024, 20.0), (1536, 30.0)]
    assert [e.value for e in events.Scalars("lockstep/policy_loss")] == pytest.approx([-0.01, -0.02, -0.03])
