"""``lockstep bench scale``: simulated actors against a real learner, and the publish-to-release timer."""

from __future__ import annotations

import json

import numpy as np
import pytest
from lockstep_bench import scale
from lockstep_bench.scale_client import step_messages

from lockstep.cli import build_parser
from lockstep.envs import env_spec
from lockstep.observe.counters import ReleaseLatency
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.messages import step_from_proto


def test_release_latency_keeps_the_last_resumption_of_each_published_version():
    timer = ReleaseLatency()
    timer.resumed(0)  # released by the first phase's start, not by a publish: not counted
    timer.published(1)
    for _ in range(3):
        timer.resumed(1)
    timer.published(2)
    timer.resumed(2)
    timer.published(3)  # nothing held at this publish: no figure for it
    summary = timer.summary()
    assert summary["phases"] == 2 and summary["released"] == 4
    assert 0 <= summary["p50_ms"] <= summary["p99_ms"] <= summary["max_ms"]
    assert all(seconds >= 0 for seconds in timer.per_phase)


def test_release_latency_settles_a_version_two_publishes_later():
    timer = ReleaseLatency()
    timer.published(1)
    timer.published(2)
    timer.resumed(1)  # a pipelined run may resume a release of 1 after publishing 2
    timer.published(3)
    assert len(timer.per_phase) == 1
    assert timer.summary()["phases"] == 1


def test_simulated_steps_pass_the_learners_checks():
    spec = env_spec(scale.ENV_ID)
    hello = pb.Hello.FromString(scale.hello_template(scale.ENV_ID, 3))
    for message in step_messages(hello, episode_length=32, seed=1):
        step = step_from_proto(pb.ActorMessage.FromString(message).step, 3, spec.observation)
        assert step.obs.shape == (3, 4) and np.isfinite(step.obs).all()
    ended = step_from_proto(pb.ActorMessage.FromString(message).step, 3, spec.observation)
    assert ended.terminated.all() and ended.episode_return.tolist() == [32.0] * 3


def test_the_command_line_takes_sizes_and_envs_as_lists():
    args = build_parser().parse_args(["bench", "scale", "--sizes", "10,100", "--envs", "1,8", "--quick"])
    assert args.sizes == [10, 100] and args.envs == [1, 8] and args.quick
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "scale", "--sizes", "10,0"])


@pytest.mark.slow
def test_four_simulated_actors_in_two_processes_balance_the_learners_books(tmp_path):
    opts = scale.ScaleOptions(sizes=[4], envs=[2], seconds=1.5, actors_per_process=2, stuck_s=30, startup_s=60)
    scale.run(opts, tmp_path, "test")
    report = json.loads((tmp_path / "scale.json").read_text())
    assert (tmp_path / "scale.md").exists()
    [row] = report["rows"]
    assert set(scale.KEYS) <= set(row)
    assert row["errors"] == [] and row["client_processes"] == 2
    assert row["phases"] > 0 and row["stalls"] == 0 and row["dropped_transitions"] == 0
    # every Step is answered but each stream's last, held one; the learner counted what the clients got
    assert row["messages_match"] and row["learner_messages"] == row["client_replies"] == row["messages"] > 0
    assert row["client_sent"] == row["client_replies"] + 4
    assert row["messages_per_s"] > 0 and row["learner_cpu_us_per_message"] > 0
    assert row["learner_rss_mb"] > 0 and row["learner_rss_idle_mb"] > 0
    # strict: every publish releases all four actors, each held after its T-th step
    summary = json.loads((tmp_path / "runs" / "actors4-envs2" / "run" / "summary.json").read_text())
    release = summary["publish_release_ms"]
    assert release["phases"] == summary["iterations"] - 1  # the last phase ends the run: no publish after it
    assert release["released"] == 4 * release["phases"] and row["released_per_phase"] == 4
    assert 0 <= release["p50_ms"] <= release["p99_ms"] <= release["max_ms"]
