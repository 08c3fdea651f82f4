"""Generated configs end to end: config trees drawn by hypothesis from the declarations in ``lockstep.config``
(``lockstep_bench.configs``), each run through ``lockstep train``: refused at start with a message that names a
field it sets, or trained, resumed with a larger budget (iterations and versions continue), evaluated and
audited (PASS). Anything else (a traceback, a hang, a refusal after training started, a value outside its
declaration that trains) fails the example, which is printed whole as YAML.

Seeded (``derandomize``): the suite runs the same few examples every time; ``lockstep bench configs --examples N``
runs many more. ``lockstep_bench.configs.replay(YAML)`` and ``run_case`` replay a printed case.
"""

from __future__ import annotations

import json
import math
import subprocess

import pytest
from conftest import lockstep_cmd
from hypothesis import HealthCheck, Phase, given, settings
from lockstep_bench import configs
from lockstep_bench.configs import Case, cases, field_draws, run_case

from lockstep import cli
from lockstep import config as config_lib

TIMEOUT_S = 90.0  # per example: a run that hangs is a failure of that example, not of the suite
# no shrinking: every smaller example is another training run; the failing case is printed whole instead
SUITE = settings(derandomize=True, database=None, deadline=None, phases=[Phase.explicit, Phase.generate],
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@settings(SUITE, max_examples=16)
@given(case=cases())
def test_a_generated_config_is_refused_at_start_by_name_or_trains_resumes_evaluates_and_audits(case,
                                                                                               tmp_path_factory):
    outcome = run_case(case, tmp_path_factory.mktemp("case"), TIMEOUT_S)
    assert outcome.result in ("passed", "refused"), f"{outcome.message}\ncase:\n{outcome.case}"
    if case.invalid:
        assert outcome.result == "refused", f"{case.invalid} outside the declaration, yet: {outcome.message}"


def test_the_values_drawn_for_a_field_come_from_its_declaration():
    def draws(dotted: str) -> list[configs.Draw]:  # without the edge flag, to compare with Draw(value, valid)
        return [configs.Draw(d.value, d.valid) for d in field_draws(config_lib.setting_of(dotted))]

    cutoff = draws("sync.phase_cutoff")  # > 0 and <= 1: both edges, each side, NaN, and a string
    assert configs.Draw(0.0, False) in cutoff and configs.Draw(1.0, True) in cutoff
    assert configs.Draw(1.001, False) in cutoff and configs.Draw(0.001, True) in cutoff
    assert any(not d.valid and isinstance(d.value, float) and math.isnan(d.value) for d in cutoff)
    assert configs.Draw("fast", False) in cutoff
    count = draws("actors.count")  # an int >= 1: its edge, one below it, and what no int is
    assert {configs.Draw(1, True), configs.Draw(0, False), configs.Draw(1.5, False)} <= set(count)
    # a field without a declared range: only values known to be sensible, besides the wrong type
    lr = draws("ppo.lr")
    assert config_lib.setting_of("ppo.lr").range() or all(d.valid for d in lr if not isinstance(d.value, str))
    strategy = draws("actors.transport")
    assert {d.value for d in strategy if d.valid} == {"shm", "grpc", "inprocess"}
    assert [d for d in strategy if not d.valid] == [configs.Draw("no-such-transport", False)]


def test_bench_configs_writes_its_results(tmp_path):
    done = subprocess.run([*lockstep_cmd(), "bench", "configs", "--examples", "2", "--sweeps", "0",
                           "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    report = json.loads((tmp_path / "configs.json").read_text())
    assert report["examples"] == 2 and len(report["outcomes"]) == 2, done.stderr[-3000:]
    assert report["passed"] + report["refused"] + report["defects"] == 2
    assert done.returncode == (1 if report["defects"] else 0), done.stderr[-3000:]
    assert all(isinstance(configs.replay(o["case"]), Case) for o in report["outcomes"])
    assert "2 examples:" in (tmp_path / "configs.md").read_text()


def test_learner_min_actors_above_the_actors_train_starts_is_refused_at_start(tmp_path):
    """learner.min_actors 3 of 2 actors: the first phase would wait forever for an actor no one starts."""
    done = subprocess.run([*lockstep_cmd(), "train", "--env", "CartPole-v1", "--transport", "inprocess",
                           "--actors", "2", "--min-actors", "3", "--no-progress", "--run-dir", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "config error: learner.min_actors is 3, but lockstep train starts actors.count 2" in done.stderr
    assert not (tmp_path / "run" / "metrics.csv").exists()


@pytest.mark.parametrize("setting, value, actors, refusal", [
    ("learner.max_envs_per_actor", "1", "1", "the learner would refuse the actors lockstep train starts: "
                                             "hello.num_envs: 2 envs, over the limit of 1 per actor"),
    ("learner.max_connections", "3", "2 --splits 2", "learner.max_connections is 3, but the 2 actor(s) lockstep "
                                                     "train starts hold 4 connection(s)"),
    ("learner.max_space_elements", "1", "1", "the learner would refuse the actors lockstep train starts: "
                                             "hello.observation_space: 4 elements"),
    ("learner.max_id_length", "8", "1", "the learner would refuse the actors lockstep train starts: "
                                        "hello.run_id: 32 characters, over the limit of 8"),
    ("learner.max_connections", "1", "2", "learner.max_connections is 1, but the 2 actor(s) lockstep train starts "
                                          "hold 2 connection(s)"),
    ("learner.max_observation", "0.001", "1", "learner.max_observation is 0.001, but the env's observation space "
                                              "reaches 4.8"),
])
def test_learner_limits_that_refuse_the_actors_train_starts_are_refused_at_start(setting, value, actors, refusal,
                                                                                 tmp_path, capsys):
    """Limits within their ranges that lockstep train's own actors break (the hello of each, or the connections
    they hold, one per split of each):
    refused by name before anything starts, not a run whose actors are refused and that then fails or waits
    for them forever."""
    code = cli.main(["train", "--env", "CartPole-v1", "--transport", "shm", "--actors", *actors.split(),
                     "--envs-per-actor", "2", "--no-progress", "--run-dir", str(tmp_path / "run"),
                     "--set", f"{setting}={value}"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"config error: {refusal}" in err and setting in err
    assert not (tmp_path / "run" / "metrics.csv").exists()
