"""``python -m lockstep_bench.parts``: the learner's per-message functions timed in thread CPU, over shared memory;
and ``lockstep_bench.pingpong``, the floor of that transport's wake-ups."""

from __future__ import annotations

import json
import subprocess
import sys

from lockstep_bench import roundtrip

from lockstep import config as config_lib


def test_parts_times_each_message_of_a_shared_memory_run_in_the_learner_only(tmp_path):
    messages = 1024
    config_lib.save(roundtrip.build_config(messages, time_limit_s=60.0), tmp_path / "c.yaml")
    done = subprocess.run([sys.executable, "-m", "lockstep_bench.parts", "--out", str(tmp_path / "parts.json"),
                           "--collect-only", "--config", str(tmp_path / "c.yaml"), "--transport", "shm",
                           "--run-dir", str(tmp_path / "run"), "--no-progress"],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {row["part"]: row for row in json.loads((tmp_path / "parts.json").read_text())}
    assert rows["PolicySnapshot.step"]["calls"] == messages  # one forward pass per message (1 env)
    for part in ("Session.step", "ShmFraming.decode", "server.check_step", "_Peer.send"):
        assert rows[part]["calls"] >= messages and rows[part]["seconds"] > 0, rows[part]
    assert rows["Session.step"]["seconds"] > rows["PolicySnapshot.step"]["seconds"]  # the one holds the other
    assert "EnvLoop.step" not in rows  # the env steps in the actor process, which is not timed
    assert "| `PolicySnapshot.step` | 1,024 |" in done.stderr


def test_the_ping_pong_floor_answers_every_frame_both_ways():
    from lockstep_bench import pingpong

    for mode in ("blocking", "asyncio"):
        row = pingpong.measure(300, mode)
        assert row["messages"] == 300 and row["round_trips_per_s"] > 0 and row["server_cpu_us_per_message"] > 0, row
