"""The in-process baseline runs the LSTM preset, so ``lockstep bench learn`` can compare it with its baseline
(it used to stop at the first step: the baseline asked the policy for actions without a state)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[2] / "src" / "lockstep" / "presets"


def test_the_baseline_trains_the_masked_cartpole_lstm_preset(tmp_path):
    out = tmp_path / "baseline.json"
    subprocess.run([sys.executable, "-m", "lockstep_bench.baseline", str(CONFIGS / "cartpole-masked-lstm.yaml"),
                    str(out), "--set", "ppo.total_steps=4096"], check=True, timeout=300)
    result = json.loads(out.read_text())
    assert result["env"] == "masked:CartPole-v1"
    assert result["env_steps"] == 4096 and result["iterations"] == 4096 // (8 * 32)
    assert result["episodes"] > 0 and result["episode_return_mean"] is not None
