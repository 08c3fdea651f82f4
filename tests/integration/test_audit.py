"""The audit trail end to end: real training runs with ``run.audit``, then ``lockstep.tools.audit``
recomputes every stored behaviour log-prob from the policy file of the version stamped on it."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from lockstep import config as config_lib
from lockstep.launch.local import train
from lockstep.tools import audit

pytestmark = pytest.mark.slow


def _train(path: str, run_dir: Path, **overrides) -> Path:
    config = config_lib.load(path)
    for key, value in overrides.items():
        config_lib.set_value(config, key, value)
    config.run.audit = True
    config.run.progress = False
    config.run.run_dir = str(run_dir)
    train(config, run_dir)
    return run_dir


def _edit_batch(run_dir: Path, iteration: int, **changes) -> dict:
    """Rewrite one batch file with some arrays changed by ``changes[name](array)``; return the new arrays."""
    path = run_dir / "audit" / f"batch_{iteration:06d}.npz"
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    for name, change in changes.items():
        arrays[name] = change(arrays[name].copy())
    np.savez_compressed(path, **arrays)
    return arrays


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run_dir, tmp_path / "copy"))


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory) -> Path:
    """Strict CartPole, 2 actors x 2 envs x 128 steps: 4 iterations of 512 samples."""
    return _train("cartpole-cleanrl", tmp_path_factory.mktemp("cartpole") / "run",
                  **{"ppo.total_steps": 2048})


def test_strict_run_is_on_policy_in_every_iteration(cartpole_run, capsys):
    report = audit.check(cartpole_run)
    assert [it.iteration for it in report.iterations] == [1, 2, 3, 4]
    for it in report.iterations:
        assert (it.strategy, it.samples, it.trained_by, it.versions) == ("strict", 512, it.iteration - 1,
                                                                          [it.iteration - 1])
        assert (it.differing, it.off_version, it.lag_max, it.missing, it.problems) == (0, 0, 0, {}, [])
        assert it.max_abs_diff <= 1e-6
    assert report.differing == 0 and report.exit_code == 0

    assert audit.main(str(cartpole_run)) == 0
    out = capsys.readouterr().out
    assert "4 iteration(s) checked" in out
    assert out.strip().splitlines()[-1].startswith("PASS: 4 iteration(s), 2048 samples; strict: every sample produced")

    directory = cartpole_run / "audit"
    readme = (directory / "README.md").read_text()
    for term in ("policy_vNNNNNN.pt", "batch_NNNNNN.npz", "logprobs", "versions", "trained_by", "obs_mean"):
        assert term in readme
    # exactly one policy file per version that produced samples, each holding that version
    policies = sorted(directory.glob("policy_v*.pt"))
    assert [p.name for p in policies] == [f"policy_v{v:06d}.pt" for v in range(4)]
    for v, p in enumerate(policies):
        state = torch.load(p, weights_only=False)
        assert state["version"] == v and state["obs_mean"] is None and state["obs_var"] is None


def test_planted_off_policy_samples_fail_the_audit(cartpole_run, tmp_path, capsys):
    run = _copy(cartpole_run, tmp_path)

    def bump(logprobs):
        logprobs[7, 2] += 0.1
        return logprobs

    _edit_batch(run, 2, logprobs=bump)
    assert audit.main(str(run)) == 1
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1].startswith("FAIL: 1 of 4 iteration(s) failed the audit (iterations 2)")
    report = audit.check(run)
    assert [it.differing for it in report.iterations] == [0, 1, 0, 0]
    assert report.iteration(2).max_abs_diff == pytest.approx(0.1, rel=1e-3)

    # one version stamp of iteration 4 (trained by version 3) moved to version 2, whose policy exists
    run = _copy(cartpole_run, tmp_path / "stamp")

    def restamp(versions):
        versions[100, 0] = 2
        return versions

    _edit_batch(run, 4, versions=restamp)
    assert audit.main(str(run)) == 1
    assert "1 sample(s) not produced by version 3" in capsys.readouterr().out
    it = audit.check(run).iteration(4)
    assert (it.off_version, it.lag_max, it.versions, it.lag_violations) == (1, 1, [2, 3], 1)


def test_a_missing_policy_file_counts_every_sample_of_its_version(cartpole_run, tmp_path, capsys):
    run = _copy(cartpole_run, tmp_path)
    (run / "audit" / "policy_v000001.pt").unlink()
    assert audit.main(str(run)) == 1
    assert "no policy_v000001.pt for version 1 (512 samples)" in capsys.readouterr().out
    it = audit.check(run).iteration(2)
    assert (it.differing, it.missing) == (512, {1: 512})

    # a truncated batch file (a crash while writing it) is a finding too, not a crash of the audit
    path = run / "audit" / "batch_000003.npz"
    path.write_bytes(path.read_bytes()[:100])
    it = audit.check(run).iteration(3)
    assert it.strategy == "strict" and it.failed and "batch_000003.npz is unreadable" in it.problems[0]


def test_differences_in_in_place_runs_are_reported_without_failing(cartpole_run, tmp_path, capsys):
    run = _copy(cartpole_run, tmp_path)

    def bump(logprobs):
        logprobs[0, 0] -= 1.0
        return logprobs

    _edit_batch(run, 1, logprobs=bump, strategy=lambda _: np.str_("spin-flags"))
    assert audit.main(str(run)) == 0
    out = capsys.readouterr().out
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith("PASS") and "spin-flags" in verdict and "1 differing sample(s)" in verdict
    assert audit.check(run).iteration(1).differing == 1


def test_continuous_actions_with_observation_normalization(tmp_path):
    run = _train("pendulum", tmp_path / "run", **{
        "actors.count": 1, "actors.envs_per_actor": 4, "ppo.steps_per_env": 256, "ppo.total_steps": 2048,
        "env.normalize_obs": True,
    })
    report = audit.check(run)
    assert [(it.iteration, it.samples, it.versions) for it in report.iterations] == [(1, 1024, [0]), (2, 1024, [1])]
    assert report.differing == 0 and report.exit_code == 0
    assert audit.main(str(run)) == 0

    # the statistics are per version: version 1's include iteration 1's observations
    directory = run / "audit"
    v0, v1 = (torch.load(directory / f"policy_v{v:06d}.pt", weights_only=False) for v in (0, 1))
    assert v0["obs_mean"] is not None and not np.allclose(v0["obs_mean"], v1["obs_mean"])
    # so recomputing iteration 2 with version 0's statistics finds differences
    v1["obs_mean"], v1["obs_var"] = v0["obs_mean"], v0["obs_var"]
    torch.save(v1, directory / "policy_v000001.pt")
    report = audit.check(run)
    assert report.iteration(1).differing == 0 and report.iteration(2).differing > 0
    assert audit.main(str(run)) == 1


def test_a_run_without_an_audit_trail(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    assert audit.main(str(tmp_path / "run")) == 2
    err = capsys.readouterr().err
    assert "no audit/ directory" in err and "lockstep train --audit" in err
