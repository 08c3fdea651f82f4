"""``lockstep audit``'s verdict and exit code agree, and follow the synchronization strategy's rules.

A real pipelined run (``lockstep train --sync pipelined --max-lag 1 --audit``) is audited with
the real command; copies of it with planted changes must fail with exit 1. What a strategy may
do comes from ``lockstep.sync.strategy``: snapshot strategies must recompute every log-prob and
keep every lag within ``max_lag``; in-place (reference) strategies fail only on a broken trail
or an impossible stamp.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import lockstep_cmd

from lockstep.config import load as load_config
from lockstep.envs import env_spec
from lockstep.models import ActorCritic
from lockstep.tools import audit

pytestmark = pytest.mark.slow

ITERATIONS = 6


def _audit_cli(run_dir: Path, *extra: str) -> tuple[int, str]:
    """Run ``lockstep audit RUN_DIR``; return its exit code and its verdict (the last line it prints)."""
    result = subprocess.run([*lockstep_cmd(), "audit", str(run_dir), *extra], capture_output=True, text=True,
                            timeout=120, check=False)
    lines = result.stdout.strip().splitlines()
    return result.returncode, lines[-1] if lines else result.stderr


def _verdict(run_dir: Path, capsys) -> tuple[int, str]:
    """``audit.main`` in this process (faster than the command): exit code and verdict line."""
    code = audit.main(str(run_dir))
    return code, capsys.readouterr().out.strip().splitlines()[-1]


def _edit_batch(run_dir: Path, iteration: int, **changes) -> None:
    path = run_dir / "audit" / f"batch_{iteration:06d}.npz"
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    for name, change in changes.items():
        arrays[name] = change(arrays[name].copy())
    np.savez_compressed(path, **arrays)


def _put(index: tuple[int, ...], value):
    """An edit for ``_edit_batch``: set one element of the array."""
    def change(array: np.ndarray) -> np.ndarray:
        array[index] = value
        return array
    return change


def _copy(run_dir: Path, tmp_path: Path, name: str = "copy") -> Path:
    return Path(shutil.copytree(run_dir, tmp_path / name))


@pytest.fixture(scope="module")
def pipelined_run(tmp_path_factory) -> Path:
    """Pipelined K=1 CartPole with --audit: 2 actors x 2 envs x 16 steps, 6 iterations."""
    run_dir = tmp_path_factory.mktemp("pipelined") / "run"
    result = subprocess.run([
        *lockstep_cmd(), "train", "--env", "CartPole-v1", "--actors", "2", "--envs-per-actor", "2",
        "--steps-per-env", "16", "--total-steps", str(2 * 2 * 16 * ITERATIONS), "--sync", "pipelined",
        "--max-lag", "1", "--seed", "3", "--audit", "--no-progress", "--run-dir", str(run_dir),
    ], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def test_a_pipelined_run_passes_its_audit_with_exit_0(pipelined_run):
    code, verdict = _audit_cli(pipelined_run)
    assert code == 0, verdict
    assert verdict.startswith("PASS") and "pipelined" in verdict and "not a failure" not in verdict
    report = audit.check(pipelined_run)
    assert [it.iteration for it in report.iterations] == list(range(1, ITERATIONS + 1))
    for it in report.iterations:
        assert (it.strategy, it.max_lag, it.failures) == ("pipelined", 1, [])
        assert 0 <= it.lag_max <= 1 and it.differing == 0 and it.samples == 64
    with np.load(pipelined_run / "audit" / "batch_000001.npz") as data:
        assert int(data["max_lag"]) == 1  # each batch file records the bound it was trained under


def test_a_planted_logprob_change_in_a_pipelined_batch_fails_with_exit_1(pipelined_run, tmp_path):
    run = _copy(pipelined_run, tmp_path)

    def bump(logprobs):
        logprobs[3, 1] += 0.05
        return logprobs

    _edit_batch(run, 4, logprobs=bump)
    code, verdict = _audit_cli(run)
    assert code == 1, verdict
    assert verdict.startswith("FAIL") and "iteration 4" in verdict and "not a failure" not in verdict
    it = audit.check(run).iteration(4)
    assert it.failed and it.differing == 1 and "does not recompute" in it.failures[0]


def _logprob(run: Path, version: int, obs: np.ndarray, action: np.ndarray) -> np.float32:
    config = load_config(run / "audit" / "config.yaml")
    spec = env_spec(config.env.id)
    model = ActorCritic(spec.observation, spec.action, config.model.hidden, config.model.activation)
    model.load_state_dict(torch.load(run / "audit" / f"policy_v{version:06d}.pt", weights_only=False)["model"])
    with torch.inference_mode():
        one = torch.zeros(1, 1, dtype=torch.bool)  # one step of one slot, a feedforward policy's empty state
        logprob = model.evaluate(torch.as_tensor(obs[None, None]), torch.as_tensor(action[None, None]), one,
                                 torch.zeros(1, 0))[0]
        return logprob.numpy()[0, 0]


def test_a_sample_lagging_beyond_max_lag_fails_even_when_its_logprob_recomputes(pipelined_run, tmp_path, capsys):
    """Iteration 5 is trained by version 4; a sample stamped 2 (lag 2 > max_lag 1) whose log-prob
    is exactly what version 2 computes is recomputable, but no pipelined K=1 run can produce it."""
    run = _copy(pipelined_run, tmp_path)
    with np.load(run / "audit" / "batch_000005.npz") as data:
        obs, actions, trained_by = data["obs"][0, 0], data["actions"][0, 0], int(data["trained_by"])
    assert trained_by == 4
    stored = _logprob(run, 2, obs, actions)

    def restamp(versions):
        versions[0, 0] = 2
        return versions

    def relog(logprobs):
        logprobs[0, 0] = stored
        return logprobs

    _edit_batch(run, 5, versions=restamp, logprobs=relog)
    it = audit.check(run).iteration(5)
    assert (it.differing, it.lag_max, it.lag_violations) == (0, 2, 1)
    assert it.failures == ["1 sample(s) lag the version that trained them by more than max_lag 1 (lag up to 2)"]
    code, verdict = _verdict(run, capsys)
    assert code == 1 and verdict.startswith("FAIL") and "iteration 5" in verdict


def test_a_stamp_newer_than_the_training_version_fails_every_strategy(pipelined_run, tmp_path, capsys):
    """No strategy can train a sample before the version that produced it exists."""
    for strategy in ("pipelined", "seqlock"):
        run = _copy(pipelined_run, tmp_path, strategy)

        def future(versions):
            versions[1, 0] = 5  # iteration 3 is trained by version 2; version 5's policy file exists
            return versions

        _edit_batch(run, 3, versions=future, strategy=lambda _, s=strategy: np.str_(s))
        it = audit.check(run).iteration(3)
        assert it.lag_violations == 1 and any("newer than" in f for f in it.failures), it.failures
        code, verdict = _verdict(run, capsys)
        assert code == 1 and verdict.startswith("FAIL"), verdict


def test_in_place_strategies_report_differences_and_lag_without_failing(pipelined_run, tmp_path, capsys):
    run = _copy(pipelined_run, tmp_path)

    def bump(logprobs):
        logprobs[0, 0] -= 1.0
        return logprobs

    def stale(versions):
        versions[2, 1] = 0  # lag 4 from version 4: unbounded for in-place strategies
        return versions

    for iteration in range(1, ITERATIONS + 1):  # as if the whole run had used an in-place strategy
        _edit_batch(run, iteration, strategy=lambda _: np.str_("reject-retry"))
    _edit_batch(run, 5, logprobs=bump, versions=stale)
    it = audit.check(run).iteration(5)
    assert (it.max_lag, it.snapshots, it.failures, it.lag_max) == (None, False, [], 4) and it.differing >= 1
    code, verdict = _verdict(run, capsys)
    assert code == 0 and verdict.startswith("PASS") and "reject-retry" in verdict and "reported" in verdict

    # but a broken trail is a failure for them too: iteration 1's samples are all from version 0
    (run / "audit" / "policy_v000000.pt").unlink()
    code, verdict = _verdict(run, capsys)
    assert code == 1 and verdict.startswith("FAIL") and "iteration 1: no policy_v000000.pt" in verdict


def test_an_unknown_strategy_in_a_batch_file_is_a_failure(pipelined_run, tmp_path, capsys):
    run = _copy(pipelined_run, tmp_path)
    _edit_batch(run, 2, strategy=lambda _: np.str_("optimistic"))
    it = audit.check(run).iteration(2)
    assert it.failed and "unknown synchronization 'optimistic'" in it.failures[0]
    code, verdict = _verdict(run, capsys)
    assert code == 1 and verdict.startswith("FAIL")


def test_a_trail_without_batches_is_nothing_checked_with_exit_2(pipelined_run, tmp_path, capsys):
    run = _copy(pipelined_run, tmp_path)
    for path in (run / "audit").glob("batch_*.npz"):
        path.unlink()
    code, verdict = _verdict(run, capsys)
    assert code == 2 and verdict.startswith("NOTHING CHECKED")


@pytest.fixture(scope="module")
def async_run(tmp_path_factory) -> Path:
    """Async CartPole with --audit, lag bound 2 (V-trace on, async's default): 2 actor processes x 2 envs x 16
    steps, 8 iterations."""
    run_dir = tmp_path_factory.mktemp("async") / "run"
    result = subprocess.run([
        *lockstep_cmd(), "train", "--env", "CartPole-v1", "--actors", "2", "--envs-per-actor", "2",
        "--steps-per-env", "16", "--total-steps", str(2 * 2 * 16 * 8), "--sync", "async", "--max-lag", "2",
        "--seed", "3", "--audit", "--no-progress", "--run-dir", str(run_dir),
    ], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def test_an_async_run_passes_with_its_lag_distribution_and_a_planted_stale_sample_fails(async_run, tmp_path):
    """The async trail passes within its bound and prints the lag's distribution; a sample restamped to a version
    3 behind the one that trained it, its log-prob made exactly that version's, fails: no async run with lag
    bound 2 can produce it, however well it recomputes."""
    result = subprocess.run([*lockstep_cmd(), "audit", str(async_run)], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0, result.stdout[-2000:]
    assert "async: every sample within lag 2 of the version that trained on it" in result.stdout
    report = audit.check(async_run)
    assert {(it.strategy, it.max_lag) for it in report.iterations} == {("async", 2)}
    assert sum(report.lag_counts) == report.samples and len(report.lag_counts) <= 3
    assert "lag (versions: samples): 0: " in result.stdout

    run = _copy(async_run, tmp_path)
    late = max(it.iteration for it in report.iterations if it.trained_by >= 3)
    with np.load(run / "audit" / f"batch_{late:06d}.npz") as data:
        obs, actions, trained_by = data["obs"][0, 0], data["actions"][0, 0], int(data["trained_by"])
    stale = trained_by - 3
    stored = _logprob(run, stale, obs, actions)
    _edit_batch(run, late, versions=_put((0, 0), stale), logprobs=_put((0, 0), stored))
    it = audit.check(run).iteration(late)
    assert (it.differing, it.lag_max, it.lag_violations) == (0, 3, 1)
    assert it.failures == ["1 sample(s) lag the version that trained them by more than max_lag 2 (lag up to 3)"]
    code, verdict = _audit_cli(run)
    assert code == 1 and verdict.startswith("FAIL") and f"iteration {late}" in verdict


@pytest.fixture(scope="module")
def recurrent_run(tmp_path_factory) -> Path:
    """Pipelined K=1 CartPole with an LSTM, episodes cut at 12 steps (a truncation in most unrolls) and --audit:
    2 actors x 2 envs x 16 steps, 6 iterations."""
    run_dir = tmp_path_factory.mktemp("recurrent") / "run"
    result = subprocess.run([
        *lockstep_cmd(), "train", "--env", "CartPole-v1", "--env.kwargs", "{max_episode_steps: 12}",
        "--set", "model.lstm_size=16", "--actors", "2", "--envs-per-actor", "2", "--steps-per-env", "16",
        "--total-steps", str(2 * 2 * 16 * ITERATIONS), "--sync", "pipelined", "--max-lag", "1", "--seed", "3",
        "--audit", "--no-progress", "--run-dir", str(run_dir),
    ], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def test_the_states_values_were_bootstrapped_from_recompute_and_a_planted_one_fails(recurrent_run, tmp_path, capsys):
    """The trainer bootstraps a recurrent policy's values from the states inference left after each slot's last
    step and after each truncated episode's end (``Batch.after``): the audit recomputes every one of them with
    the versions stamped on the slot's steps. A changed state, after a truncation or at a slot's end, fails."""
    report = audit.check(recurrent_run)
    trails = [np.load(recurrent_run / "audit" / f"batch_{it.iteration:06d}.npz") for it in report.iterations]
    truncations = sum(len(data["final_n"]) for data in trails)
    assert truncations > 0
    assert report.states == ITERATIONS * 4 + truncations
    assert not report.failed and sum(it.states_mismatched for it in report.iterations) == 0
    code, _ = _verdict(recurrent_run, capsys)
    assert code == 0

    late = max(it.iteration for it, data in zip(report.iterations, trails) if len(data["final_n"]))
    run = _copy(recurrent_run, tmp_path, "final")
    with np.load(run / "audit" / f"batch_{late:06d}.npz") as data:
        moved = data["final_state"][0, 0] + np.float32(1e-3)
    _edit_batch(run, late, final_state=_put((0, 0), moved))
    it = audit.check(run).iteration(late)
    assert it.states_mismatched == 1 and it.differing == 0
    assert it.failures == [f"1 of {it.states} bootstrapped state(s) that the versions stamped on their slots' "
                           "steps do not recompute"]
    run = _copy(recurrent_run, tmp_path, "last")
    _edit_batch(run, late, bootstrap_state=_put((3, 5), 0.5))
    code, verdict = _verdict(run, capsys)
    assert code == 1 and f"iteration {late}" in verdict
