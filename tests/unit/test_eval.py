"""``lockstep eval``: a trained run's policy played in one process, its results and its videos."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest

from lockstep import cli
from lockstep.config import Config
from lockstep.launch.local import train
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
    out = capsys.readouterr().out
    result = json.loads((run_dir / "eval.json").read_text())
    returns = [e["return"] for e in result["episodes"]]
    assert len(returns) == 3 and result["env_id"] == "CartPole-v1" and result["iteration"] == 3
    assert result["checkpoint"].endswith("final.pt") and result["seed"] == 4 and not result["deterministic"]
    assert all(e["return"] == e["length"] for e in result["episodes"])  # CartPole: +1 per step
    assert result["return_mean"] == pytest.approx(np.mean(returns))
    assert result["return_std"] == pytest.approx(np.std(returns))
    for i, ret in enumerate(returns):
        assert f"episode {i + 1}: return {ret:.1f}, length {int(ret)}" in out
    assert f"mean return {np.mean(returns):.1f} ± {np.std(returns):.1f} over 3 episodes" in out


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
