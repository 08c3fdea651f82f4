"""``lockstep bench soak --rogue N``: hostile clients run beside the fleet, each refused as it must be, and
the report has the learner's memory and open files at the start and the end (a tiny soak)."""

from __future__ import annotations

import pytest
from lockstep_bench import soak


@pytest.mark.slow
def test_a_tiny_soak_with_rogue_clients_refuses_each_and_reports_the_learners_resources(tmp_path, monkeypatch):
    monkeypatch.delenv("LOCKSTEP_TOKEN", raising=False)  # the soak sets its own for the run
    report = soak.run(soak.SoakOptions(minutes=0.2, kill_every_s=6.0, actors=2, envs_per_actor=2, rogue=4),
                      tmp_path)
    tally = report["rogue"]
    assert report["rogue_clients"] == 4
    for kind in ("absurd", "steal"):
        assert tally[kind]["tried"] > 0 and tally[kind]["refused"] == tally[kind]["tried"], tally
    assert tally["idle"]["tried"] > 0 and tally["silent"]["tried"] > 0, tally
    assert not any(kind["unexpected"] for kind in tally.values()), report["rogue_unexpected"]
    for key in ("learner_rss_mb", "learner_open_files"):
        start, end = report[key]
        assert start > 0 and end > 0, report
    assert (tmp_path / "soak.json").is_file()
