"""``lockstep bench peers``: reading CleanRL's output (time-stamped returns, its SPS lines), the interleaving
of CleanRL and lockstep runs per seed, and the report with its ratios and load averages.

Fetching CleanRL into its throwaway virtual environment takes minutes (torch, gym, gymnasium, MuJoCo), too
long for the suite, so the end-to-end test here runs a CleanRL-like script: a real subprocess stepping real
CartPole with the command line and the output lines of CleanRL's ppo.py, against a real ``lockstep train``.
CleanRL itself runs in the benchmark: ``lockstep bench peers --only cartpole --steps 2048 --out DIR``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import lockstep_cmd
from lockstep_bench import peers

pytestmark = pytest.mark.slow

# ppo.py's command line and output lines (an update of 4 envs x 128 steps, an SPS line after each), with a
# random policy on the real CartPole-v1 and a "learning" return: 10 x the update number once past the second
CLEANRL_LIKE = textwrap.dedent('''
    import argparse, time
    import gymnasium as gym
    import numpy as np
    parser = argparse.ArgumentParser()
    parser.add_argument("--env-id"); parser.add_argument("--total-timesteps", type=int)
    parser.add_argument("--seed", type=int); parser.add_argument("--cuda")
    args = parser.parse_args()
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(args.env_id) for _ in range(4)])
    envs.reset(seed=args.seed)
    rng = np.random.default_rng(args.seed)
    start_time, global_step = time.time(), 0
    for update in range(1, args.total_timesteps // 512 + 1):
        for _ in range(128):
            global_step += 4
            _, _, term, trunc, _ = envs.step(rng.integers(0, 2, 4))
            for done in term | trunc:
                if done:
                    print(f"global_step={global_step}, episodic_return={10.0 * update}")
        print("SPS:", int(global_step / (time.time() - start_time)))
''')


def _lines(output: peers.PeerOutput, text: str, stamps: list[float]) -> None:
    for stamp, line in zip(stamps, text.strip().splitlines()):
        output.feed(stamp, line + "\n")


def test_cleanrls_lines_are_parsed_with_brackets_and_without():
    output = peers.PeerOutput()
    _lines(output, "global_step=60, episodic_return=15.0\nglobal_step=2048, episodic_return=[-3.5]\n"
                   "SPS: 1024\nglobal_step=4096, episodic_return=[1e2]\nother line\nSPS: 900", [1, 2, 3, 4, 5, 6])
    assert output.returns == [(1, 60, 15.0), (2, 2048, -3.5), (4, 4096, 100.0)]
    assert output.sps == [(3, 1024), (6, 900)]
    assert output.training_start(batch=2048) == 1.0  # stamp 3 less 2048 steps at 1024/s


def test_the_threshold_is_the_first_time_the_mean_of_20_returns_reaches_it():
    output = peers.PeerOutput()
    output.feed(10.0, "SPS: 100\n")  # 500 steps at 100/s: training began at 5.0
    for i in range(30):  # returns 0, 10, 20, ...: the mean of the last 20 reaches 95 at the 20th (index 19)
        output.feed(11.0 + i, f"global_step={100 * (i + 1)}, episodic_return={10.0 * i}\n")
    assert output.first_reached(95.0, batch=500) == (25.0, 2000)  # stamp 30.0 less the start at 5.0
    assert output.first_reached(1000.0, batch=500) is None
    assert output.final_return() == round(sum(10.0 * i for i in range(10, 30)) / 20, 2)
    assert peers.PeerOutput().first_reached(0.0, batch=500) is None  # no SPS line: no start to count from


def test_a_hung_peer_is_killed_at_its_timeout_with_its_children(tmp_path):
    script = "import subprocess, sys, time; print('SPS: 1', flush=True); subprocess.Popen([sys.executable, " \
             "'-c', 'import time; time.sleep(60)']); time.sleep(60)"
    began = time.perf_counter()
    rc, seconds, output = peers.run_stamped([sys.executable, "-c", script], tmp_path / "log", 3.0, tmp_path)
    assert rc is None and time.perf_counter() - began < 30
    assert output.sps and output.sps[0][1] == 1
    assert (tmp_path / "log").read_text() == "SPS: 1\n"


def test_cleanrl_like_and_lockstep_runs_interleave_per_seed_into_one_report(tmp_path):
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "ppo.py").write_text(CLEANRL_LIKE)
    out = tmp_path / "out"
    result = subprocess.run([*lockstep_cmd(), "bench", "peers", "--only", "cartpole", "--steps", "1024",
                             "--seeds", "2", "--python", sys.executable, "--scripts", str(scripts), "--out", str(out)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "peers.json").read_text())
    order = [(r["seed"], r["side"]) for r in report["runs"]]
    assert order == [(1, "cleanrl"), (1, "lockstep"), (2, "cleanrl"), (2, "lockstep")]
    for r in report["runs"]:
        assert r["error"] is None and r["workload"] == "cartpole"
        assert r["env_steps"] == 1024 and r["env_steps_per_s"] > 0
        assert r["loadavg_start"] is not None and r["loadavg_end"] is not None
    cleanrl = [r for r in report["runs"] if r["side"] == "cleanrl"]
    lockstep = [r for r in report["runs"] if r["side"] == "lockstep"]
    # the script's returns are 10 x the update, 20 episodes at least 10: the running mean passes 195 only
    # once they are 200 or more, which 2 updates never reach
    assert all(r["seconds_to_threshold"] is None for r in cleanrl)
    assert all("cartpole-cleanrl" in r["command"] and "run.thresholds=[195]" in r["command"] for r in lockstep)
    summary = report["summary"]["cartpole"]
    assert summary["cleanrl"]["runs"] == summary["lockstep"]["runs"] == 2
    expected = round(summary["lockstep"]["env_steps_per_s"] / summary["cleanrl"]["env_steps_per_s"], 3)
    assert summary["ratio_env_steps_per_s"] == expected
    assert summary["ratio_seconds_to_threshold"] is None
    md = (out / "peers.md").read_text()
    assert "| cartpole (ppo.py CartPole-v1 / cartpole-cleanrl) | 1,024 | 195 |" in md
    assert md.count("| cartpole | ") == 4 and "load 1m start / end" in md


def test_an_unknown_workload_is_named(tmp_path):
    with pytest.raises(ValueError,
                       match="unknown workload 'pong'; workloads: cartpole, hopper, halfcheetah, doom, breakout-sf"):
        peers.run(peers.PeersOptions(workloads=["pong"], python=sys.executable, scripts=tmp_path), tmp_path, "x")


@pytest.mark.parametrize("flag, value, least", [("--seeds", "0", 1), ("--steps", "-5", 1), ("--peer-threads", "-1", 0)])
def test_counts_below_their_least_are_refused_by_name(tmp_path, flag, value, least):
    result = subprocess.run([*lockstep_cmd(), "bench", "peers", flag, value, "--out", str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert f"{flag} must be at least {least}, got {value}" in result.stderr
    assert not (tmp_path / "out").exists()


# Sample Factory's command line and console lines (formats: sample_factory/algo/runners/runner.py:348, :362, :783
# of 2.1.1, behind colorlog's "[%(asctime)s][%(process)05d] " of sample_factory/utils/utils.py:36): a report of 4,096
# frames, then one more batch than asked, as its asynchronous learner overshoots, and the closing line
SF_LIKE = textwrap.dedent('''
    import sys, time
    args = dict(a[2:].split("=", 1) for a in sys.argv[1:])
    frames = int(args["train_for_env_steps"]) + 4096
    def say(message):
        stamp = time.strftime("%Y-%m-%d %H:%M:%S") + ",000"
        print(f"\\x1b[36m[{stamp}][00042] {message}\\x1b[0m", flush=True)
    for total in (4096, frames):
        say(f"Fps is (10 sec: 409.6, 60 sec: 409.6, 300 sec: 409.6). Total num frames: {total}. Throughput: 0: "
            f"102.4. Samples: {total // 4}. Policy #0 lag: (min: 0.0, avg: 0.0, max: 0.0)")
        say(f"Avg episode reward: [(0, '{total / 4096:.3f}')]")
        time.sleep(1.1)
    say(f"Collected {{0: {frames}}}, FPS: 409.6")
''')


def test_sample_factory_like_and_lockstep_runs_end_at_equal_agent_steps(tmp_path):
    """--sf-python: an interpreter wrapper that finds a Sample Factory-like sf_examples.atari.train_atari; lockstep's
    breakout preset trains, for real, for the agent steps the peer took (its frames / 4)."""
    package = tmp_path / "modules" / "sf_examples" / "atari"
    package.mkdir(parents=True)
    for init in (package.parent / "__init__.py", package / "__init__.py"):
        init.write_text("")
    (package / "train_atari.py").write_text(SF_LIKE)
    wrapper = tmp_path / "sf-python"
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path / 'modules'} exec {sys.executable} \"$@\"\n")
    wrapper.chmod(0o755)
    out = tmp_path / "out"
    result = subprocess.run([*lockstep_cmd(), "bench", "peers", "--only", "breakout-sf", "--steps", "1024",
                             "--sf-python", str(wrapper), "--out", str(out)], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "peers.json").read_text())
    assert [r["side"] for r in report["runs"]] == ["samplefactory", "lockstep"]
    sf, lockstep = report["runs"]
    assert "--train_for_env_steps=4096" in sf["command"] and "--num_envs_per_worker=4" in sf["command"]
    assert sf["env_steps"] == 2048 and sf["steady_steps_per_s"] > 0 and sf["final_return"] == 2.0
    assert lockstep["error"] is None and lockstep["env_steps"] == 2048 and "ppo.total_steps=2048" in lockstep["command"]
    assert lockstep["final_return"] is not None and lockstep["steady_steps_per_s"] > 0
    summary = report["summary"]["breakout-sf"]
    assert summary["peer"] == "samplefactory" and summary["ratio_process_steps_per_s"] is not None
    md = (out / "peers.md").read_text()
    assert "| breakout-sf (sf_examples.atari.train_atari atari_breakout / breakout) | 1,024 |" in md
    assert "Sample Factory 2.1.1" not in md and str(wrapper) in md
    # both sides' learning curves, drawn from the peer's reports and lockstep's metrics.csv
    assert report["figures"] == ["learning-breakout-sf.png"] and (out / "learning-breakout-sf.png").stat().st_size
    assert "![learning-breakout-sf.png](learning-breakout-sf.png)" in md
