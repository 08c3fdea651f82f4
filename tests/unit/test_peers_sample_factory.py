"""``lockstep bench peers`` against Sample Factory (lockstep_bench.peers_sf): reading its console log, its command
line at the lockstep preset's shape, its cached venv and the table of its workloads.

Sample Factory itself is installed and run by the benchmark (``lockstep bench peers --only doom``), never here."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import pytest
from lockstep_bench import peers, peers_sf

from lockstep import config as config_lib

# Sample Factory 2.1.1's console lines as a doom_basic run printed them into a pipe, colour codes and all. Their
# format: sample_factory/utils/utils.py:36 ("%(log_color)s[%(asctime)s][%(process)05d] %(message)s"), and
# sample_factory/algo/runners/runner.py:348 (Fps), :362 (Avg episode reward) and :783 (Collected). The line stamped
# 18:08:29,852 is the 18:08:24,852 one with a later time and count, as the next report of a longer run would be.
CAPTURED = """\
\x1b[36m[2026-12-05 18:08:13,090][19294] Fps is (10 sec: nan, 60 sec: nan, 300 sec: nan). Total num frames: 0. \
Throughput: 0: nan. Samples: 0. Policy #0 lag: (min: -1.0, avg: -1.0, max: -1.0)\x1b[0m
\x1b[37m\x1b[1m[2026-12-05 18:08:18,003][19294] Heartbeat connected on Batcher_0\x1b[0m
\x1b[36m[2026-12-05 18:08:19,887][19294] Fps is (10 sec: 0.0, 60 sec: 0.0, 300 sec: 0.0). Total num frames: 0. \
Throughput: 0: 106.5. Samples: 724. Policy #0 lag: (min: -1.0, avg: -1.0, max: -1.0)\x1b[0m
\x1b[36m[2026-12-05 18:08:19,887][19294] Avg episode reward: [(0, '-1.483')]\x1b[0m
\x1b[36m[2026-12-05 18:08:24,852][19294] Fps is (10 sec: 821.2, 60 sec: 696.5, 300 sec: 696.5). Total num frames: \
8192. Throughput: 0: 302.7. Samples: 3560. Policy #0 lag: (min: 0.0, avg: 0.0, max: 0.0)\x1b[0m
\x1b[36m[2026-12-05 18:08:24,852][19294] Avg episode reward: [(0, '-1.445')]\x1b[0m
\x1b[36m[2026-12-05 18:08:29,852][19294] Fps is (10 sec: 821.2, 60 sec: 696.5, 300 sec: 696.5). Total num frames: \
12288. Throughput: 0: 302.7. Samples: 3560. Policy #0 lag: (min: 0.0, avg: 0.0, max: 0.0)\x1b[0m
\x1b[36m[2026-12-05 18:08:29,852][19294] Avg episode reward: [(0, '-0.520')]\x1b[0m
\x1b[37m\x1b[1m[2026-12-05 18:08:36,003][19294] Collected {0: 16384}, FPS: 431.6\x1b[0m
"""


def _read(text: str) -> peers_sf.SfOutput:
    output = peers_sf.SfOutput()
    for line in text.splitlines(keepends=True):
        output.feed(0.0, line)
    return output


def test_sample_factorys_coloured_log_is_read_by_its_own_time_stamps():
    output = _read(CAPTURED)
    assert [frames for _, frames in output.frames] == [0, 0, 8192, 12288]
    assert output.frames[3][0] - output.frames[2][0] == pytest.approx(5.0)
    assert output.rewards == [-1.483, -1.445, -0.52]
    assert (output.collected, output.main_loop_fps) == (16384, 431.6)
    assert output.steady_frames_per_s() == pytest.approx(4096 / 5.0)  # first report with frames to the last
    # each reward with the report before it: the curve, from frames 0 on
    assert [(frames, reward) for _, frames, reward in output.curve] == [(0, -1.483), (8192, -1.445), (12288, -0.52)]


def test_fewer_than_two_reports_with_frames_give_no_steady_rate():
    head = "".join(CAPTURED.splitlines(keepends=True)[:6])
    output = _read(head)
    assert output.collected is None and output.steady_frames_per_s() is None


def test_a_run_counts_agent_steps_and_undoes_the_reward_scaling(tmp_path, monkeypatch):
    """run_sf on a real subprocess that prints the captured lines: its frames / 4 are agent steps, so are its
    rates, and doom_basic's returns are scaled back by 100."""
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "fake_sf.py").write_text(f"import sys\nprint(sys.argv[1:])\nsys.stdout.write({CAPTURED!r})\n")
    monkeypatch.setattr(peers_sf, "peer_env", lambda threads: {**os.environ, "PYTHONPATH": str(modules)})
    workload = dataclasses.replace(peers.WORKLOADS["doom"], script="fake_sf")
    row = peers_sf.run_sf(workload, 3, 2000, sys.executable, tmp_path / "run", 60.0, 1, "cpu")
    assert row["error"] is None and row["side"] == "samplefactory" and row["seed"] == 3
    assert row["env_steps"] == 4096 and row["env_steps_per_s"] == 107.9 and row["steady_steps_per_s"] == 204.8
    assert row["final_return"] == -52.0 and row["process_steps_per_s"] > 0
    assert "'--train_for_env_steps=8000'" in (tmp_path / "run" / "stdout.log").read_text()
    # its curve in agent steps, seconds since its first report and unscaled returns, as plot reads a run's
    curve = peers_sf.read_curve(tmp_path / "run" / peers_sf.CURVE, "sf")
    assert curve.env_steps.tolist() == [0, 2048, 3072] and curve.values.tolist() == [-148.3, -144.5, -52.0]
    assert curve.wall_s.tolist() == pytest.approx([6.797, 11.762, 16.762])
    (modules / "fake_sf.py").write_text(f"import sys\nsys.stdout.write({CAPTURED[:600]!r})\nsys.exit(3)\n")
    row = peers_sf.run_sf(workload, 3, 2000, sys.executable, tmp_path / "run", 60.0, 1, "cpu")
    assert row["error"].startswith("exit code 3") and row["env_steps"] is None


def test_the_command_carries_the_budget_in_frames_the_seed_and_the_shape():
    workload = peers.WORKLOADS["doom"]
    cmd = peers_sf.command("py", workload.script, workload.env_id, workload.peer_args, 7, 2000, workload.frameskip,
                           peers_sf.Path("/t"), "cpu")
    assert cmd[:4] == ["py", "-m", "sf_examples.vizdoom.train_vizdoom", "--env=doom_basic"]
    assert "--train_for_env_steps=8000" in cmd and "--seed=7" in cmd and "--device=cpu" in cmd
    assert "--train_dir=/t" in cmd and "--experiment=doom_basic-s7" in cmd and "--stats_avg=20" in cmd
    assert cmd.count("--restart_behavior=overwrite") == 1


def _flag(workload: peers.Workload, name: str) -> int:
    (value,) = [a.split("=", 1)[1] for a in workload.peer_args if a.startswith(f"--{name}=")]
    return int(value)


@pytest.mark.parametrize("name", ["doom", "breakout-sf"])
def test_sample_factorys_shape_is_the_presets(name):
    workload = peers.WORKLOADS[name]
    config = config_lib.load(workload.preset)
    envs = config.actors.count * config.actors.envs_per_actor
    assert _flag(workload, "num_workers") * _flag(workload, "num_envs_per_worker") == envs
    assert _flag(workload, "rollout") == config.ppo.steps_per_env
    assert _flag(workload, "num_epochs") == config.ppo.epochs
    assert _flag(workload, "num_batches_per_epoch") == config.ppo.minibatches
    assert _flag(workload, "batch_size") * config.ppo.minibatches == envs * config.ppo.steps_per_env
    assert workload.batch == envs * config.ppo.steps_per_env and workload.peer == "samplefactory"


def test_a_ready_venv_is_used_as_it_is(tmp_path):
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("")
    wanted = {"sample-factory": peers_sf.SF_VERSION, "packages": [peers_sf.torch_range(), *peers_sf.SF_PACKAGES],
              "pth": peers_sf.ALE_PTH[1]}
    (tmp_path / "ready.json").write_text(json.dumps(wanted))
    assert peers_sf.prepare(tmp_path) == python
    assert peers_sf.torch_range().startswith("torch>=2.2,<=")


def test_a_failed_install_names_its_log_and_leaves_no_ready_mark(tmp_path, monkeypatch):
    monkeypatch.setattr(peers_sf, "SF_PACKAGES", ["not a requirement!"])  # pip refuses it before any download
    (tmp_path / "ready.json").write_text("{}")
    with pytest.raises(RuntimeError, match=f"pip exit 1\\); see {tmp_path / 'install.log'}"):
        peers_sf.prepare(tmp_path)
    assert not (tmp_path / "ready.json").exists()
    assert "not a requirement!" in (tmp_path / "install.log").read_text()


def test_the_table_compares_steady_and_whole_process_rates_and_returns():
    rows = []
    for seed, (sf_rate, lk_rate) in enumerate([(200.0, 300.0), (100.0, 300.0)], start=1):
        for side, rate, ret in (("samplefactory", sf_rate, -150.0), ("lockstep", lk_rate, -100.0)):
            row = peers.blank_row(peers.WORKLOADS["doom"], seed, side)
            row.update(env_steps=2048, env_steps_per_s=rate, steady_steps_per_s=rate, process_steps_per_s=rate / 2,
                       final_return=ret)
            rows.append(row)
    summary = peers.summarize(rows, ["doom"])["doom"]
    assert summary["peer"] == "samplefactory" and summary["samplefactory"]["steady_steps_per_s"] == 150.0
    assert summary["ratio_steady_steps_per_s"] == 2.0 and summary["ratio_process_steps_per_s"] == 2.0
    assert summary["ratio_seconds_to_threshold"] is None
    workloads = {"doom": {"script": "m", "env": "doom_basic", "preset": "doom-basic", "steps": 2048}}
    table = peers_sf.table({"doom": summary}, workloads)
    assert "SF steady" in table[1] and len(table) == 4
    assert table[-1] == "| doom (m doom_basic / doom-basic) | 2,048 | 150 | 300 | 2 | 75 | 150 | 2 | -150 | -100 |"
