"""Learning curves: reading metrics.csv, the mean and spread across runs, and the PNG that ``lockstep plot`` writes."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import yaml

from lockstep import cli
from lockstep.observe import plot
from lockstep.observe.metrics import COLUMNS

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _run(tmp_path, name: str, rows: list[tuple[int, float, float | None]], env: str = "CartPole-v1"):
    """A run directory with a metrics.csv of (env_steps, wall_s, episode_return_mean20) rows and a config.yaml."""
    run_dir = tmp_path / name
    run_dir.mkdir()
    with (run_dir / "metrics.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS, restval="0")
        writer.writeheader()
        for i, (steps, wall, ret) in enumerate(rows, start=1):
            writer.writerow({"iteration": i, "env_steps": steps, "wall_s": wall,
                             "episode_return_mean20": "" if ret is None else ret})
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"env": {"id": env}, "ppo": {"lr": 1e-3},
                                                         "run": {"seed": len(name), "name": name}}))
    return run_dir


def test_a_curve_leaves_out_the_rows_before_the_first_finished_episode(tmp_path):
    run = _run(tmp_path, "a", [(100, 1.0, None), (200, 2.0, 10.0), (300, 3.0, 30.0)])
    curve = plot.read_curve(run)
    assert curve.env_steps.tolist() == [200, 300] and curve.wall_s.tolist() == [2.0, 3.0]
    assert curve.values.tolist() == [10.0, 30.0]


def test_a_directory_without_metrics_names_itself(tmp_path):
    with pytest.raises(FileNotFoundError, match="no metrics.csv in .*nothing"):
        plot.read_curve(tmp_path / "nothing")


def test_the_band_over_env_steps_is_the_exact_mean_min_max_and_std_of_the_seeds(tmp_path):
    a = plot.read_curve(_run(tmp_path, "a", [(100, 1.0, 0.0), (200, 2.0, 10.0), (300, 3.0, 20.0)]))
    b = plot.read_curve(_run(tmp_path, "b", [(100, 1.5, 4.0), (200, 3.0, 30.0), (300, 4.5, 50.0)]))
    band = plot.band([a, b], "steps")
    assert band.x.tolist() == [100, 200, 300] and band.runs == 2
    np.testing.assert_allclose(band.mean, [2.0, 20.0, 35.0])
    np.testing.assert_allclose(band.low, [0.0, 10.0, 20.0])
    np.testing.assert_allclose(band.high, [4.0, 30.0, 50.0])
    np.testing.assert_allclose(band.std, [2.0, 10.0, 15.0])  # population std of two values: half their distance


def test_the_band_over_wall_time_interpolates_each_run_where_all_of_them_have_data(tmp_path):
    a = plot.read_curve(_run(tmp_path, "a", [(100, 1.0, 0.0), (200, 2.0, 10.0), (300, 3.0, 20.0)]))
    b = plot.read_curve(_run(tmp_path, "b", [(100, 1.5, 4.0), (200, 3.0, 30.0), (300, 4.5, 50.0)]))
    band = plot.band([a, b], "time")
    assert band.x.tolist() == [1.5, 2.0, 3.0]  # from the later start to the earlier end
    # a at 1.5 s: 5.0 (between 0 and 10); b at 2.0 s: 4 + (30 - 4) / 3 = 12.667; both exact where they have a row
    np.testing.assert_allclose(band.mean, [(5.0 + 4.0) / 2, (10.0 + 4.0 + 26.0 / 3) / 2, (20.0 + 30.0) / 2])
    np.testing.assert_allclose(band.low, [4.0, 10.0, 20.0])
    np.testing.assert_allclose(band.high, [5.0, 4.0 + 26.0 / 3, 30.0])


def test_curves_that_do_not_overlap_are_refused(tmp_path):
    a = plot.read_curve(_run(tmp_path, "a", [(100, 1.0, 0.0), (200, 2.0, 1.0)]))
    b = plot.read_curve(_run(tmp_path, "b", [(300, 3.0, 0.0), (400, 4.0, 1.0)]))
    with pytest.raises(ValueError, match="do not overlap"):
        plot.band([a, b], "steps")


def test_runs_group_by_config_apart_from_their_run_section(tmp_path):
    runs = [_run(tmp_path, "s1", [(100, 1.0, 1.0)]), _run(tmp_path, "s22", [(100, 1.0, 2.0)]),
            _run(tmp_path, "other", [(100, 1.0, 3.0)], env="Acrobot-v1")]
    groups = plot.group_runs(runs)
    assert [(g.label, [c.name for c in g.curves]) for g in groups] == [
        ("CartPole-v1", ["s1", "s22"]), ("Acrobot-v1", ["other"])]


def test_lockstep_plot_writes_a_png_of_the_mean_and_spread(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    a = _run(tmp_path, "a", [(100, 1.0, 0.0), (200, 2.0, 10.0), (300, 3.0, 20.0)])
    b = _run(tmp_path, "b", [(100, 1.5, 4.0), (200, 3.0, 30.0), (300, 4.5, 50.0)])
    out = tmp_path / "figs" / "curves.png"
    assert cli.main(["plot", str(a), str(b), "--out", str(out)]) == 0
    data = out.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000
    printed = capsys.readouterr().out
    assert "CartPole-v1: 2 runs: 35.0 at x = 300.0" in printed and f"wrote {out}" in printed
    assert cli.main(["plot", str(a), "--x", "time", "--out", str(tmp_path / "one.png")]) == 0
    assert (tmp_path / "one.png").read_bytes().startswith(PNG_SIGNATURE)


def test_lockstep_plot_of_a_folder_that_is_no_run_exits_2(tmp_path, capsys):
    assert cli.main(["plot", str(tmp_path), "--out", str(tmp_path / "x.png")]) == 2
    assert "no metrics.csv" in capsys.readouterr().err


def test_without_matplotlib_the_error_names_the_install_command(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(plot.PlotUnavailable, match=r"pip install -e '\.\[plot\]'"):
        plot.require_matplotlib()
