"""The sweep spec: what it accepts, what it refuses before any trial starts (naming the field), the objective a
run's rows score, how trials are sized to the cores, and docs/sweeps.md's table of the spec's fields."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lockstep import cli
from lockstep.sweep import objective as objective_lib
from lockstep.sweep import spec as spec_lib
from lockstep.sweep.spec import SpecError

REPO = Path(__file__).resolve().parents[2]

MINIMAL = {
    "base": "cartpole-cleanrl",
    "trials": 20,
    "seed": 1,
    "objective": {"metric": "episode_return_mean", "direction": "maximize"},
    "budget": {"total_steps": 50000},
    "space": {
        "ppo.lr": {"low": 1.0e-4, "high": 3.0e-3, "log": True},
        "ppo.ent_coef": {"low": 0.0, "high": 0.02},
        "ppo.minibatches": [4, 8, 16],
    },
}


def _spec(**changes) -> dict:
    data = yaml.safe_load(yaml.safe_dump(MINIMAL))
    for dotted, value in changes.items():
        *path, last = dotted.split("/")
        node = data
        for part in path:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return data


def test_the_issues_form_reads_with_float_log_and_choice_parameters_over_the_base():
    spec = spec_lib.from_dict(_spec())
    params = {p.key: p for p in spec.params()}
    assert (params["ppo.lr"].kind, params["ppo.lr"].log) == ("float", True)
    assert params["ppo.ent_coef"].kind == "float" and params["ppo.minibatches"].choices == (4, 8, 16)
    base = spec.base_config()
    assert base.ppo.total_steps == 50000 and base.actors.count == 2  # the preset, with the budget
    assert spec.objective.value == "final" and spec.objective.maximize
    assert spec.run_seeds(base) == [base.run.seed]


def test_an_integer_field_gets_an_integer_range_and_a_number_of_seeds_counts_up_from_the_bases():
    spec = spec_lib.from_dict(_spec(**{"space/ppo.epochs": {"low": 2, "high": 8}, "seeds": 3}))
    assert next(p for p in spec.params() if p.key == "ppo.epochs").kind == "int"
    assert spec.seeds == [1, 2, 3]


def test_a_steps_to_threshold_objective_minimizes_and_stops_runs_at_the_threshold():
    spec = spec_lib.from_dict(_spec(objective={"metric": "episode_return_mean20", "value": "env_steps_to",
                                               "threshold": 475}))
    assert spec.objective.direction == "minimize"
    assert spec.base_config().run.stop_at_return == 475


def test_a_base_file_is_found_beside_the_spec(tmp_path):
    (tmp_path / "base.yaml").write_text("ppo: {lr: 0.001}\n")
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(_spec(base="base.yaml")))
    assert spec_lib.load(tmp_path / "spec.yaml").base_config().ppo.lr == 0.001


def test_list_choices_travel_through_optuna_as_yaml_text():
    spec = spec_lib.from_dict(_spec(**{"space/model.hidden": [[64, 64], [32]]}))
    p = next(p for p in spec.params() if p.key == "model.hidden")
    assert [spec_lib.encode(c) for c in p.choices] == ["[64, 64]", "[32]"]
    assert spec_lib.decode(p, "[32]") == [32]


@pytest.mark.parametrize("changes, field", [
    ({"budgets": {"total_steps": 1}}, "budgets: unknown field"),
    ({"objective/metrc": "x"}, "objective.metrc: unknown field"),
    ({"space/ppo.learning_rate": {"low": 1e-4, "high": 1e-3}}, "space.ppo.learning_rate: unknown config key"),
    ({"space/optim.lr": {"low": 1e-4, "high": 1e-3}}, "space.optim.lr: unknown config section"),
    ({"space/ppo.lr": {"low": 1e-3, "high": 1e-3}}, "space.ppo.lr: the range is empty"),
    ({"space/ppo.lr": {"low": 3e-3, "high": 1e-4}}, "space.ppo.lr: the range is empty"),
    ({"space/ppo.lr": {"low": 0.0, "high": 1e-3, "log": True}}, "space.ppo.lr: a log range needs low > 0"),
    ({"space/ppo.minibatches": []}, "space.ppo.minibatches: an empty list of choices"),
    ({"space/ppo.minibatches": [4, 0]}, "space.ppo.minibatches: ppo.minibatches must be >= 1"),
    ({"space/ppo.epochs": {"low": 1, "high": 2.5}}, "space.ppo.epochs.high: ppo.epochs is an integer field"),
    ({"space/ppo.anneal_lr": {"low": 0, "high": 1}}, "space.ppo.anneal_lr: ppo.anneal_lr is a bool"),
    ({"space/sync.strategy": ["strict", "eventual"]}, "space.sync.strategy: sync.strategy must be one of"),
    ({"space/run.eval_video_every": [0, 5], "set": {"run.eval_every": 0}}, "space.run.eval_video_every: with 5"),
    ({"objective/metric": "episode_reward"}, "objective.metric: 'episode_reward' is not a metrics.csv column"),
    ({"objective/direction": "up"}, "objective.direction: must be one of maximize, minimize"),
    ({"objective/value": "seconds_to"}, "objective.threshold: objective.value seconds_to needs the threshold"),
    ({"objective": {"value": "env_steps_to", "threshold": 475, "direction": "maximize"}}, "objective.direction"),
    ({"trials": 0}, "trials: must be at least 1"),
    ({"trials": 2.5}, "trials: expected an integer"),
    ({"seeds": [1, "two"]}, "seeds: expected a list of integer seeds"),
    ({"base": "cartpole-slow"}, "base: unknown preset 'cartpole-slow'"),
    ({"base": None}, "base: give a preset name"),
    ({"space": None}, "space: give at least one config key"),
    ({"set": {"ppo.lr": 0.1}}, "set.ppo.lr: also in space"),
    ({"set": {"ppo.epochs": 0}}, "set.ppo.epochs: ppo.epochs must be >= 1"),
    ({"sampler": "grid"}, "space.ppo.ent_coef: sampler grid needs a list of choices or a range with step"),
    ({"first": [{"ppo.gamma": 0.9}]}, "first[0].ppo.gamma: not a key of space"),
    ({"first": [{"ppo.lr": 0.1}]}, "first[0].ppo.lr: 0.1 is outside space.ppo.lr's range"),
    ({"pruner/kind": "percentile"}, "pruner.kind: must be one of median, hyperband, none"),
    ({"pruner/warmup": 1.0}, "pruner.warmup: a fraction of the budget"),
    ({"budget/total_steps": 0}, "budget.total_steps: must be at least 1"),
    ({"seeds": [3, -1]}, "seeds: run.seed must be >= 0"),  # every run of every trial would be refused
    ({"objective/metric": "policy/predator/episode_return_mean"},
     "objective.metric: 'policy/predator/episode_return_mean' is a column of a run of several policies"),
])
def test_a_bad_spec_is_refused_naming_the_field(changes, field):
    with pytest.raises(SpecError) as err:
        spec_lib.from_dict(_spec(**changes))
    assert str(err.value).startswith(field), str(err.value)


def test_a_first_parameter_set_whose_combination_no_run_accepts_is_refused_before_any_trial(tmp_path):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({"run": {"eval_every": 5}}))
    data = _spec(base="base.yaml", space={"run.eval_every": [0, 5], "run.eval_video_every": [0, 2]},
                 first=[{"run.eval_every": 0, "run.eval_video_every": 2}])  # each alone is a valid trial
    with pytest.raises(SpecError, match=r"^first\[0\]: run[.]eval_video_every records evaluations while training"):
        spec_lib.from_dict(data, tmp_path / "spec.yaml")


KINDS_BASE = {"env": {"id": "pettingzoo:lockstep.envs.kinds"},
              "policies": {"scouts": {"agents": ["scout_*"]}, "pilots": {"agents": ["pilot_*"]}}}


@pytest.mark.parametrize("metric, refused", [
    ("policy/scouts/episode_return_mean", None),
    ("policy/pilots/approx_kl", None),
    ("policy/pilots/skipped", None),
    ("policy/scout/episode_return_mean", "names the policy 'scout', which is not one of the base's policies "
                                         "(scouts, pilots)"),
    ("policy/scouts/return", "'return' is not a column metrics.csv writes for each policy; policy/scouts/ has "
                             "version, samples, episode_return_mean"),
    ("policy/scouts", "'' is not a column metrics.csv writes for each policy"),
])
def test_an_objective_may_be_one_policys_column_of_the_bases_policies_and_other_names_are_refused(
        tmp_path, metric, refused):
    (tmp_path / "kinds.yaml").write_text(yaml.safe_dump(KINDS_BASE, sort_keys=False))
    data = _spec(base="kinds.yaml", objective={"metric": metric, "value": "mean_last", "last": 2})
    if refused is None:
        assert spec_lib.from_dict(data, tmp_path / "spec.yaml").objective.metric == metric
        return
    with pytest.raises(SpecError) as err:
        spec_lib.from_dict(data, tmp_path / "spec.yaml")
    assert str(err.value).startswith(f"objective.metric: {metric!r}") and refused in str(err.value), str(err.value)


def test_a_policys_column_is_scored_from_the_rows_of_a_runs_metrics_csv(tmp_path):
    from lockstep.observe.metrics import MetricsWriter
    from lockstep.observe.run_dir import RunDir

    column = "policy/scouts/episode_return_mean"
    writer = MetricsWriter(tmp_path, tensorboard=False, extra=[column, "policy/pilots/episode_return_mean"])
    for i, (scouts, pilots) in enumerate([(2.0, 7.0), (4.0, 7.5), (6.0, 8.0)]):
        writer.write({"iteration": i + 1, "env_steps": 100 * (i + 1), "wall_s": float(i + 1), column: scouts,
                      "policy/pilots/episode_return_mean": pilots})
    writer.close()
    objective = spec_lib.Objective(metric=column, value="mean_last", last=2)
    assert objective_lib.score(RunDir(tmp_path).metrics(), objective, BUDGET) == 5.0


def test_a_grid_has_a_combination_for_every_trial():
    data = _spec(sampler="grid", space={"ppo.minibatches": [4, 8], "ppo.epochs": {"low": 1, "high": 3}})
    with pytest.raises(SpecError, match="^trials: the grid has 6 combinations, fewer than 20 trials"):
        spec_lib.from_dict(data)
    data["trials"] = 6
    spec = spec_lib.from_dict(data)
    assert [p.grid() for p in spec.params()] == [[4, 8], [1, 2, 3]]


def test_the_command_refuses_a_bad_spec_before_any_trial_with_the_spec_and_the_field(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_spec(**{"space/ppo.lr": {"low": 1e-3, "high": 1e-4}})))
    assert cli.main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    assert f"lockstep: {path}: space.ppo.lr: the range is empty" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# --- the objective ------------------------------------------------------------------------------------

ROWS = [{"env_steps": 1000 * (i + 1), "wall_s": 0.5 * (i + 1), "episode_return_mean20": r}
        for i, r in enumerate([None, 20.0, 100.0, 300.0, 480.0, 450.0])]
BUDGET = objective_lib.RunBudget(total_steps=10_000)


def _objective(**fields) -> spec_lib.Objective:
    return spec_lib.from_dict(_spec(objective={"metric": "episode_return_mean20", **fields})).objective


def test_final_and_mean_last_read_the_rows_that_have_the_metric():
    assert objective_lib.score(ROWS, _objective(), BUDGET) == 450.0
    assert objective_lib.score(ROWS, _objective(value="mean_last", last=2), BUDGET) == 465.0
    assert objective_lib.score(ROWS[:1], _objective(), BUDGET) is None


def test_steps_and_seconds_to_a_threshold_are_the_first_row_that_reaches_it():
    assert objective_lib.score(ROWS, _objective(value="env_steps_to", threshold=475), BUDGET) == 5000
    assert objective_lib.score(ROWS, _objective(value="seconds_to", threshold=475), BUDGET) == 2.5


def test_a_run_that_misses_the_threshold_scores_more_than_the_budget_and_nearer_misses_less():
    objective = _objective(value="env_steps_to", threshold=475)
    near = objective_lib.score(ROWS[:4], objective, BUDGET)  # best 300
    far = objective_lib.score(ROWS[:3], objective, BUDGET)  # best 100
    assert BUDGET.total_steps < near < far
    # a miss without a time limit scores the seconds its whole step budget takes at its pace
    assert objective_lib.score(ROWS[:4], _objective(value="seconds_to", threshold=475), BUDGET) > 5.0


def test_seeds_aggregate_by_mean_median_or_the_worst_in_the_objectives_direction():
    assert objective_lib.aggregate([1.0, 2.0, 6.0], "mean", True) == 3.0
    assert objective_lib.aggregate([1.0, 2.0, 6.0], "median", True) == 2.0
    assert objective_lib.aggregate([1.0, 2.0, 6.0], "worst", True) == 1.0
    assert objective_lib.aggregate([1.0, 2.0, 6.0], "worst", False) == 6.0


def test_the_budget_fraction_is_the_larger_of_steps_and_seconds():
    assert objective_lib.RunBudget(10_000).fraction({"env_steps": 2500, "wall_s": 99.0}) == 0.25
    assert objective_lib.RunBudget(10_000, 10.0).fraction({"env_steps": 2500, "wall_s": 5.0}) == 0.5


# --- Optuna stays out of the way until a sweep runs -----------------------------------------------------


def test_the_command_line_loads_no_optuna_until_a_sweep_runs():
    code = ("import sys\nfrom lockstep import cli\ncli.build_parser().parse_args(['sweep', 'x.yaml', '--out', 'o'])\n"
            "from lockstep.sweep import spec, objective\nassert 'optuna' not in sys.modules, 'optuna was imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_a_missing_optuna_is_one_line_that_names_the_extra(tmp_path, capsys, monkeypatch):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(_spec()))
    monkeypatch.setitem(sys.modules, "optuna", None)  # what an environment without the extra imports
    assert cli.main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "pip install -e '.[sweep]'" in capsys.readouterr().err


# --- sizing, seeding, the reference ------------------------------------------------------------------


def test_trials_that_would_not_fit_the_cores_run_their_actors_in_process_and_say_so():
    pytest.importorskip("optuna")
    from lockstep.sweep.runner import layout

    spec = spec_lib.from_dict(_spec())
    base = spec.base_config()  # 2 actor processes and a learner per run
    assert layout(base, spec, jobs=1, cores=4).transport is None
    sized = layout(base, spec, jobs=2, cores=4)
    assert sized.transport == "inprocess" and "in the learner process" in sized.note
    kept = spec_lib.from_dict(_spec(set={"actors.transport": "shm"}))
    assert layout(kept.base_config(), kept, jobs=2, cores=4).transport is None


@pytest.mark.parametrize("changes", [{"set": {"actors.vector": "async"}},  # the base's envs in processes
                                     {"space/actors.vector": ["sync", "async"]}])  # some trials' envs
def test_crowded_trials_whose_envs_step_in_processes_of_their_own_keep_their_transport_and_say_why(changes):
    """The in-process transport cannot hold envs that each step in a process of their own: moving such trials
    there to fit the cores would make every one of them fail; they keep the base's shared memory instead."""
    pytest.importorskip("optuna")
    from lockstep.sweep.runner import layout

    spec = spec_lib.from_dict(_spec(**changes))
    sized = layout(spec.base_config(), spec, jobs=2, cores=4)
    assert sized.transport is None, sized.note
    assert "kept, since the runs cannot step their envs in the learner process" in sized.note
    assert "actors.vector async" in sized.note
    for vector in ("sync", "async"):  # what each trial trains is a config lockstep train accepts
        config = spec.trial_config({"actors.vector": vector}, 1, sized.transport)
        assert config.actors.transport == "shm"
    with pytest.raises(SpecError, match=r"\(with actors.transport inprocess, which the sweep gives its runs\): "
                                        r"actors.vector async steps each env in a process of its own"):
        spec.check_trials("inprocess")


def test_trial_n_proposes_the_same_parameters_for_the_same_seed_whichever_process_asks():
    optuna = pytest.importorskip("optuna")
    from lockstep.sweep.runner import SeededByTrial

    def proposals(seed: int, skip: int = 0) -> list[dict]:
        spec = spec_lib.from_dict(_spec(seed=seed))
        study = optuna.create_study(sampler=SeededByTrial(spec), direction="maximize")
        found = []
        for number in range(3):
            trial = study.ask()
            params = {p.key: getattr(trial, f"suggest_{'float' if p.kind == 'float' else 'categorical'}")(
                p.key, *((p.low, p.high) if p.kind == "float" else (list(p.choices),))) for p in spec.params()}
            study.tell(trial, float(number))
            found.append(params)
        return found

    assert proposals(1) == proposals(1)
    assert proposals(1)[0] != proposals(2)[0]
    first = proposals(1)
    assert first[0] != first[1]  # seeded per trial, not one stream replayed


def test_the_docs_table_of_the_spec_fields_is_what_the_declarations_write():
    doc = (REPO / "docs" / "sweeps.md").read_text()
    stale = "docs/sweeps.md is stale: python -m lockstep.sweep.spec --markdown docs/sweeps.md"
    assert spec_lib.reference() in doc, stale
    for name in spec_lib._names(spec_lib.Spec):
        assert f"| `{name}` |" in doc


def test_a_grid_proposes_every_combination_once_in_as_many_trials():
    optuna = pytest.importorskip("optuna")
    from lockstep.sweep.runner import SeededByTrial

    spec = spec_lib.from_dict(_spec(sampler="grid", trials=6, space={"ppo.minibatches": [4, 8],
                                                                     "ppo.epochs": {"low": 1, "high": 3}}))
    study = optuna.create_study(sampler=SeededByTrial(spec), direction="maximize")
    seen = []

    def objective(trial) -> float:  # the grid stops the study when it is done: from inside optimize, as a sweep runs
        seen.append((trial.suggest_categorical("ppo.minibatches", [4, 8]), trial.suggest_int("ppo.epochs", 1, 3)))
        return 0.0

    for _ in range(6):
        study.optimize(objective, n_trials=1)
    assert sorted(seen) == [(m, e) for m in (4, 8) for e in (1, 2, 3)]


def test_the_pruners_compare_every_seeds_reports_as_steps_of_one_curve():
    optuna = pytest.importorskip("optuna")
    from lockstep.sweep.runner import pruner

    median = pruner(spec_lib.from_dict(_spec(pruner={"kind": "median", "startup_trials": 2})))
    assert isinstance(median, optuna.pruners.MedianPruner)
    hyperband = pruner(spec_lib.from_dict(_spec(seeds=[1, 2], pruner={"kind": "hyperband", "reports": 10,
                                                                      "warmup": 0.2})))
    assert isinstance(hyperband, optuna.pruners.HyperbandPruner)
    assert (hyperband._min_resource, hyperband._max_resource) == (2, 20)  # 10 points per seed, 2 seeds
    assert isinstance(pruner(spec_lib.from_dict(_spec(pruner={"kind": "none"}))), optuna.pruners.NopPruner)


# A stand-in for `lockstep train --config FILE` that writes its whole run at once and exits before the sweep reads
# anything: 16 rows of 512 env steps, returns growing with ppo.lr (10x slower at lr 1e-8).
INSTANT_RUN = """
import csv, json, sys
from pathlib import Path
import yaml
config = yaml.safe_load(Path(sys.argv[sys.argv.index("--config") + 1]).read_text())
run_dir = Path(config["run"]["run_dir"])
pace = 10.0 if config["ppo"]["lr"] > 1e-4 else 1.0
with (run_dir / "metrics.csv").open("w", newline="") as f:
    rows = csv.writer(f)
    rows.writerow(["iteration", "env_steps", "wall_s", "episode_return_mean"])
    for i in range(1, 17):
        rows.writerow([i, 512 * i, 0.01 * i, pace * i])
(run_dir / "summary.json").write_text(json.dumps({"env_steps": 512 * 16}))
"""


def test_a_run_that_finishes_before_the_sweep_reads_it_is_judged_on_every_row_as_one_still_training(tmp_path):
    """The pruner's verdict depends on the rows alone: each point of the budget is scored on the rows up to the
    first that reached it and reported before the trial completes, however fast the run was."""
    optuna = pytest.importorskip("optuna")
    from lockstep.sweep.runner import Sweep

    script = tmp_path / "instant_run.py"
    script.write_text(INSTANT_RUN)
    spec = spec_lib.from_dict(_spec(space={"ppo.lr": [5.0e-3, 1.0e-8]}, first=[{"ppo.lr": 5.0e-3}, {"ppo.lr": 1.0e-8}],
                                    trials=2, budget={"total_steps": 8192},
                                    pruner={"kind": "median", "startup_trials": 1, "warmup": 0.25, "reports": 8}))
    study = Sweep(spec, tmp_path / "out", lockstep=[sys.executable, str(script)]).run()
    complete, pruned = study.get_trials()
    assert complete.state == optuna.trial.TrialState.COMPLETE and complete.value == 160.0
    # every point of its budget, each scored on the rows up to the first that reached it (2 rows a point)
    assert complete.intermediate_values == {k: 20.0 * k for k in range(1, 9)}
    assert pruned.state == optuna.trial.TrialState.PRUNED, pruned.intermediate_values
    assert pruned.intermediate_values == {1: 2.0, 2: 4.0}  # judged at the first point past the warmup, as a slow run is
    summary = json.loads((tmp_path / "out" / "trials" / "trial-0001" / "summary.json").read_text())
    assert summary["sweep"]["state"] == "pruned" and summary["sweep"]["pruned_at"]["env_steps"] == 2048
