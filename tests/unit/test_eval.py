"""``lockstep eval``: a trained run's policy played in one process, its results and its videos."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest
import torch

from lockstep import cli
from lockstep.config import Config
from lockstep.launch.local import train
from lockstep.learner.episodes import Episode
from lockstep.tools import eval as evaluation


def _train(run_dir, lstm_size: int = 0, critic_lstm: bool = False):
    config = Config()
    config.actors.count, config.actors.envs_per_actor = 1, 2
    config.ppo.steps_per_env, config.ppo.total_steps = 16, 2 * 16 * 3
    config.env.normalize_obs = True  # so that the checkpoint's obs_rms is used
    config.model.lstm_size, config.model.critic_lstm = lstm_size, critic_lstm
    config.actors.transport = "inprocess"
    config.learner.device = "cpu"
    config.run.progress = False
    config.run.thresholds = []
    train(config, run_dir)
    return run_dir


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("eval") / "run")


def test_eval_prints_each_episode_and_the_mean_and_writes_eval_json(run_dir, capsys):
    assert cli.main(["eval", str(run_dir), "--episodes", "3", "--seed", "4"]) == 0
    out, err = capsys.readouterr()
    result = json.loads((run_dir / "eval.json").read_text())
    assert result["warning"] is None and "warning" not in err  # the run completed
    returns = [e["return"] for e in result["episodes"]]
    assert len(returns) == 3 and result["env_id"] == "CartPole-v1" and result["iteration"] == 3
    assert result["checkpoint"].endswith("final.pt") and result["seed"] == 4 and not result["deterministic"]
    assert all(e["return"] == e["length"] for e in result["episodes"])  # CartPole: +1 per step
    assert result["return_mean"] == pytest.approx(np.mean(returns))
    assert result["return_std"] == pytest.approx(np.std(returns))
    for i, ret in enumerate(returns):
        assert f"episode {i + 1}: return {evaluation.number(ret)}, length {int(ret)}" in out
    assert (f"mean return {evaluation.number(np.mean(returns))} ± {evaluation.number(np.std(returns))} "
            "over 3 episodes") in out


@pytest.mark.parametrize(("change", "warning"), [
    ({"status": "failed", "error": "RuntimeError('every actor exited while training')", "time_limited": False},
     "failed (RuntimeError('every actor exited while training')) after 96 env steps"),
    ({"status": "stopped", "time_limited": True}, "was stopped after 96 env steps, before its step budget"),
    (None, "has no summary.json: the run is still training, or was killed before it finished"),
], ids=["failed", "stopped", "no-summary"])
def test_eval_of_a_failed_or_unfinished_run_warns_on_stderr_and_in_eval_json(run_dir, tmp_path, capsys, change,
                                                                              warning):
    """A run that failed once left a final.pt and a summary of a time-limited run; eval played it silently."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["env_steps"] == 96
    if change is None:
        (run / "summary.json").unlink()
    else:
        (run / "summary.json").write_text(json.dumps({**summary, **change}))
    assert cli.main(["eval", str(run), "--episodes", "1"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert lines == [f"lockstep: warning: {run} {warning}; final.pt is no finished run's policy"]
    assert json.loads((run / "eval.json").read_text())["warning"] == f"{run} {warning}"


@pytest.mark.parametrize(("value", "shown"), [
    (-0.048, "-0.0480"), (0.048, "0.0480"), (1.0, "1.00"), (-5.25, "-5.25"), (0.5, "0.500"), (47.26, "47.3"),
    (500.0, "500.0"), (1443.27, "1443.3"), (-123456.78, "-123456.8"), (0.0, "0.0"), (-4.8e-05, "-4.8e-05"),
])
def test_returns_are_printed_with_three_significant_digits_and_at_least_one_decimal(value, shown):
    assert evaluation.number(value) == shown


def test_a_small_mean_keeps_its_sign_and_size_in_the_summary_line():
    """A mean of -0.048 over returns of -1 and +1 once showed as -0.0 ± 1.0."""
    returns = [-1.0] * 131 + [1.0] * 119  # mean -0.048, std 0.9988
    report = evaluation.EvalReport("run", "final.pt", 1, "Game-v0", False, 0,
                                   episodes=[Episode(ret, 3) for ret in returns])
    assert report.returns.mean() == pytest.approx(-0.048)
    line = evaluation.summary_line(report)
    assert line.startswith("mean return -0.0480 ± 0.999 over 250 episodes (min -1.00, max 1.00;"), line


def test_eval_runs_torch_on_the_runs_torch_threads_or_on_torch_threads(run_dir, capsys):
    """Like the learner (learner.torch_threads, default 1): torch's default threads, one per core, made
    one-row passes four times slower on a busy machine."""
    before, seen = torch.get_num_threads(), []
    try:
        torch.set_num_threads(3)
        evaluation.evaluate(run_dir, episodes=1, on_episode=lambda i, e: seen.append(torch.get_num_threads()))
        assert seen == [1]  # the run's learner.torch_threads
        assert cli.main(["eval", str(run_dir), "--episodes", "1", "--torch-threads", "2"]) == 0
        assert torch.get_num_threads() == 2
        assert cli.main(["eval", str(run_dir), "--episodes", "1", "--torch-threads", "0"]) == 2
        assert "--torch-threads must be at least 1, got 0" in capsys.readouterr().err
    finally:
        torch.set_num_threads(before)


def test_eval_is_repeatable_for_a_seed_deterministic_or_sampled(run_dir, tmp_path):
    def returns(seed: int, deterministic: bool) -> list[float]:
        report = evaluation.evaluate(run_dir, episodes=3, deterministic=deterministic, seed=seed)
        return list(report.returns)

    assert returns(7, True) == returns(7, True)
    assert returns(7, False) == returns(7, False)


def test_video_has_a_frame_after_the_reset_and_after_every_step(run_dir, tmp_path, capsys):
    imageio = pytest.importorskip("imageio.v2")
    pytest.importorskip("imageio_ffmpeg")
    out = tmp_path / "eval.json"
    assert cli.main(["eval", str(run_dir), "--episodes", "1", "--deterministic", "--video", str(tmp_path / "v"),
                     "--out", str(out)]) == 0
    episode = json.loads(out.read_text())["episodes"][0]
    assert episode["video"] == str(tmp_path / "v" / "episode-000.mp4")
    reader = imageio.get_reader(episode["video"])
    frames = [frame for frame in reader]
    assert len(frames) == episode["frames"] == episode["length"] + 1
    assert frames[0].shape == (400, 600, 3) and reader.get_meta_data()["fps"] == 50
    assert frames[0].std() > 0  # a drawn cart, not a blank frame


def test_a_missing_video_extra_names_the_install_line(run_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "imageio", None)
    monkeypatch.setitem(sys.modules, "imageio.v2", None)
    with pytest.raises(evaluation.EvalError, match=r"pip install -e '\.\[video\]'"):
        evaluation.evaluate(run_dir, episodes=1, video_dir=tmp_path / "v")


@pytest.mark.parametrize("critic_lstm", [False, True], ids=["shared-lstm", "critic-lstm"])
def test_a_recurrent_run_evaluates_sampled_and_deterministic_repeatably(tmp_path, critic_lstm):
    run = _train(tmp_path / "lstm", lstm_size=8, critic_lstm=critic_lstm)
    sampled = evaluation.evaluate(run, episodes=2, seed=1)
    deterministic = evaluation.evaluate(run, episodes=2, seed=1, deterministic=True)
    assert len(sampled.episodes) == len(deterministic.episodes) == 2
    assert list(deterministic.returns) == list(evaluation.evaluate(run, episodes=2, seed=1,
                                                                   deterministic=True).returns)


def test_a_run_dir_without_checkpoints_or_config_is_a_clear_error(run_dir, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(run_dir / "config.yaml", bare / "config.yaml")
    assert cli.main(["eval", str(bare)]) == 2
    err = capsys.readouterr().err
    assert f"no checkpoint in {bare / 'checkpoints'}" in err and "--checkpoint FILE" in err
    assert cli.main(["eval", str(tmp_path)]) == 2
    assert "is not a lockstep run directory" in capsys.readouterr().err


def test_an_explicit_checkpoint_is_used(run_dir, tmp_path):
    copy = tmp_path / "elsewhere.pt"
    shutil.copy(run_dir / "checkpoints" / "final.pt", copy)
    report = evaluation.evaluate(run_dir, episodes=1, checkpoint=str(copy))
    assert report.checkpoint == str(copy)


def test_without_a_final_checkpoint_the_newest_periodic_one_is_used(run_dir, tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copy(run_dir / "config.yaml", run / "config.yaml")
    for iteration in (2, 10):
        shutil.copy(run_dir / "checkpoints" / "final.pt", run / "checkpoints" / f"iter_{iteration:06d}.pt")
    assert evaluation.evaluate(run, episodes=1).checkpoint == str(run / "checkpoints" / "iter_000010.pt")
