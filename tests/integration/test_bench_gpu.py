"""``lockstep bench gpu`` on the CPU at its quick sizes: every part runs for real (inference against batch size
through ``act``, strict Breakout and Hopper with their time split, audited strict MLP, CNN and LSTM runs that
``lockstep audit`` passes with no CUDA device visible, ``lockstep eval`` of the Hopper run, a bitwise repeat of
strict Breakout, peak memory), and ``--device cuda`` without CUDA is a clear error."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
import yaml
from conftest import lockstep_cmd
from lockstep_bench import gpu, syncs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu")
    result = subprocess.run([*lockstep_cmd(), "bench", "gpu", "--out", str(out), "--device", "cpu", "--quick"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out, json.loads((out / "gpu.json").read_text()), result.stdout


def test_inference_is_timed_for_every_model_and_batch_size(quick_report):
    _, report, _ = quick_report
    assert report["device"] == "cpu" and report["ok"] is True
    timed = {(r["model"], r["batch"]) for r in report["inference"]}
    for model in gpu.MODELS:
        batches = (1, 8) if model == "nature-cnn" else gpu.QUICK_BATCHES
        assert {(model, b) for b in batches} <= timed
    for r in report["inference"]:
        assert r["latency_ms"] > 0 and r["rows_per_s"] > 0 and r["calls"] >= 3
        assert r["device_ms"] is None  # CUDA events only on CUDA
    assert report["inference_peak_device_mb"] == {m: None for m in gpu.MODELS}
    assert report["host_syncs_per_update"] == {name: {"counted": 1, "reported": None} for name in syncs.CASES}


def test_breakout_and_hopper_train_with_their_time_split_and_peak_memory(quick_report):
    out, report, _ = quick_report
    runs = {r["run"]: r for r in report["training"]}
    assert set(runs) == {"breakout-strict", "hopper", "hopper-on-cpu"}
    for name, (preset, _, _, steps, _) in gpu.TRAINING.items():
        r = runs[name]
        assert r["error"] is None and r["device"] == "cpu" and r["preset"] == preset
        assert r["env_steps"] >= steps
        assert set(r["time_split_s"]) >= {"inference", "training", "other"}
        assert r["time_split_s"]["training"] > 0
        assert r["learner_peak_rss_mb"] > 0
        assert r["peak_device_mb"] is None  # written by the wrapper at exit: no CUDA here
        assert (out / "runs" / f"{name}.memory.json").is_file()
    assert "--sync strict" in runs["breakout-strict"]["command"]
    assert runs["hopper-on-cpu"]["command"].split("--device ")[1].startswith("cpu")
    assert (out / "runs" / "breakout-strict" / "config.yaml").read_text().count("BreakoutNoFrameskip-v4") == 1


def test_the_audited_mlp_cnn_and_lstm_runs_pass_the_audit_on_the_cpu(quick_report):
    out, report, _ = quick_report
    audits = {a["run"]: a for a in report["audits"]}
    assert set(audits) == set(gpu.AUDITS)
    for name, (preset, _, steps) in gpu.AUDITS.items():
        audit = audits[name]
        assert audit["error"] is None and audit["audit_passed"] and audit["audit_exit_code"] == 0, audit
        assert audit["preset"] == preset and audit["env_steps"] >= steps
        assert audit["audit_result"].startswith("PASS")
        assert any((out / "runs" / name / "audit").glob("batch_*.npz"))
    cnn = (out / "runs" / "audited-cnn" / "config.yaml").read_text()
    lstm = (out / "runs" / "audited-lstm" / "config.yaml").read_text()
    assert "nature-cnn" in cnn and "lstm_size: 64" in lstm
    md = (out / "gpu.md").read_text()
    assert "## Inference" in md and "## Training" in md and md.count("passed (exit code 0)") == len(gpu.AUDITS)
    assert "learner RSS on the CPU" in md


def test_the_hopper_run_is_evaluated_and_breakout_repeats_bit_for_bit(quick_report):
    out, report, _ = quick_report
    e = report["eval"]
    assert e["error"] is None and e["exit_code"] == 0 and e["device"] == "cpu"
    assert e["episodes"] == gpu.EVAL_EPISODES and e["return_mean"] > 0
    assert (out / "runs" / "hopper.eval.json").is_file()
    r = report["repro"]
    assert r["error"] is None and r["identical"] and r["parameters_identical"] and r["rows"] == [1, 1]
    assert (out / "runs" / "repro" / "repro.md").read_text().count("**identical: yes**") == 1
    assert yaml.safe_load((out / "runs" / "repro-breakout.yaml").read_text())["learner"]["device"] == "cpu"
    md = (out / "gpu.md").read_text()
    assert "**identical: yes**" in md and f"{gpu.EVAL_EPISODES} episodes, mean return" in md


def test_a_failed_audit_makes_the_report_fail(quick_report, tmp_path):
    # the audit of a run whose trail has been tampered with fails, and the markdown says so
    out, report, _ = quick_report
    run = out / "runs" / "audited-strict"
    (next(iter(sorted((run / "audit").glob("policy_v*.pt"))))).unlink()
    rc, line = gpu.audit_cpu(run, tmp_path / "audit.log")
    assert rc == 1 and line.startswith("FAIL")
    failed = {**report["audits"][0], "audit_exit_code": rc, "audit_result": line, "audit_passed": False}
    report = {**report, "audits": [failed, *report["audits"][1:]]}
    assert "FAILED (exit code 1)" in gpu.markdown(report)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_cuda_without_a_cuda_device_is_a_clear_error(tmp_path):
    result = subprocess.run([*lockstep_cmd(), "bench", "gpu", "--out", str(tmp_path / "out"), "--device", "cuda"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "--device cuda" in result.stderr and "sees no CUDA device" in result.stderr
    assert "Traceback" not in result.stderr
