"""Configuration: CleanRL defaults, command-line coercion, YAML merge and save, presets, validation,
allowed values and ranges as declared, moved keys, and the generated reference."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import yaml

from lockstep import config as config_lib
from lockstep.config import (
    DEFAULT_PRESET,
    MOVED,
    SETTINGS,
    Config,
    ConfigError,
    apply_sets,
    default_config,
    from_dict,
    load,
    preset_names,
    save,
    set_value,
    to_dict,
)

REPO = Path(__file__).resolve().parents[2]


def test_defaults_are_cleanrl_cartpole_settings():
    c = Config()
    assert c.env.id == "CartPole-v1"
    assert c.ppo.lr == 2.5e-4
    assert c.ppo.epochs == 4
    assert c.ppo.minibatches == 4
    assert c.ppo.clip_coef == 0.2
    assert c.ppo.ent_coef == 0.01
    assert c.ppo.vf_coef == 0.5
    assert c.ppo.max_grad_norm == 0.5
    assert c.ppo.gamma == 0.99
    assert c.ppo.gae_lambda == 0.95
    assert c.ppo.steps_per_env == 128
    assert c.ppo.adam_eps == 1e-5
    assert c.ppo.total_steps == 500_000
    assert c.ppo.anneal_lr is True
    assert c.ppo.norm_adv is True
    assert c.ppo.clip_vloss is True
    assert c.ppo.target_kl is None
    assert c.model.hidden == [64, 64]
    assert c.model.activation == "tanh"
    # CleanRL's num_envs=4, here spread over actors
    assert c.actors.count * c.actors.envs_per_actor == 4
    assert c.batch_size == 4 * 128


def test_default_list_fields_are_not_shared_between_instances():
    a, b = Config(), Config()
    a.model.hidden.append(32)
    a.run.thresholds.append(100.0)
    assert b.model.hidden == [64, 64]
    assert b.run.thresholds == []


def test_min_actors_zero_means_all_actors():
    c = Config()
    c.actors.count = 3
    assert c.min_actors == 3
    c.learner.min_actors = 1
    assert c.min_actors == 1


# --- set_value --------------------------------------------------------------------------------


@pytest.mark.parametrize("dotted, text, expected", [
    ("ppo.lr", "1e-3", 1e-3),
    ("ppo.gamma", "0.995", 0.995),
    ("ppo.anneal_lr", "false", False),
    ("ppo.norm_adv", "False", False),
    ("ppo.clip_vloss", "no", False),
    ("env.normalize_obs", "true", True),
    ("env.normalize_reward", "1", True),
    ("model.hidden", "64,64", [64, 64]),
    ("model.hidden", "[32, 16, 8]", [32, 16, 8]),
    ("model.hidden", "128", [128]),
    ("run.thresholds", "100,475.5", [100.0, 475.5]),
    ("ppo.target_kl", "none", None),
    ("ppo.target_kl", "null", None),
    ("ppo.target_kl", "0.015", 0.015),
    ("run.stop_at_return", "None", None),
    ("ppo.steps_per_env", "256", 256),
    ("ppo.total_steps", "1e6", 1_000_000),
    ("run.seed", "42", 42),
    ("learner.device", "cpu", "cpu"),
    ("run.name", "none", "none"),  # a plain str field keeps the text
])
def test_set_value_coerces_command_line_strings(dotted, text, expected):
    c = Config()
    set_value(c, dotted, text)
    section, key = dotted.split(".")
    got = getattr(getattr(c, section), key)
    assert got == expected
    assert type(got) is type(expected)
    if isinstance(got, list):
        assert all(type(v) is type(e) for v, e in zip(got, expected))


def test_set_value_accepts_already_typed_values():
    c = Config()
    set_value(c, "ppo.epochs", 10)
    set_value(c, "ppo.lr", 1)  # an int where a float is expected
    set_value(c, "ppo.total_steps", 5.0e5)  # an integral float where an int is expected
    set_value(c, "model.hidden", [8, "16"])
    set_value(c, "ppo.target_kl", None)
    assert c.ppo.epochs == 10
    assert c.ppo.lr == 1.0 and type(c.ppo.lr) is float
    assert c.ppo.total_steps == 500_000 and type(c.ppo.total_steps) is int
    assert c.model.hidden == [8, 16]
    assert c.ppo.target_kl is None


@pytest.mark.parametrize("dotted, value", [
    ("ppo.lr", "fast"),
    ("ppo.lr", "none"),  # not Optional
    ("ppo.anneal_lr", "maybe"),
    ("ppo.epochs", 2.5),
    ("model.hidden", "64,wide"),
])
def test_set_value_rejects_values_that_do_not_fit_the_type(dotted, value):
    c = Config()
    before = to_dict(c)
    with pytest.raises(ConfigError, match=dotted.replace(".", r"\.")):
        set_value(c, dotted, value)
    assert to_dict(c) == before


def test_set_value_rejects_non_integer_string_for_int_field():
    with pytest.raises(ConfigError, match=r"ppo\.epochs"):
        set_value(Config(), "ppo.epochs", "2.5")


def test_set_value_unknown_key_names_the_key():
    with pytest.raises(ConfigError, match=r"ppo\.learning_rate"):
        set_value(Config(), "ppo.learning_rate", "1e-3")


def test_set_value_unknown_section_names_the_section():
    with pytest.raises(ConfigError, match="optim"):
        set_value(Config(), "optim.lr", "1e-3")


def test_set_value_rejects_non_section_attributes_of_config():
    with pytest.raises(ConfigError, match="batch_size"):
        set_value(Config(), "batch_size.x", "1")


# --- YAML ------------------------------------------------------------------------------------


def test_load_merges_yaml_over_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"ppo": {"lr": 0.001, "epochs": 10}, "actors": {"count": 3}}))
    c = load(path)
    assert c.ppo.lr == 0.001
    assert c.ppo.epochs == 10
    assert c.actors.count == 3
    # untouched fields keep their defaults
    assert c.ppo.minibatches == 4
    assert c.actors.envs_per_actor == 2
    assert c.model.hidden == [64, 64]


def test_load_coerces_yaml_strings(tmp_path):
    """PyYAML reads 1e-3 (no dot) as a string; it must still become a float."""
    path = tmp_path / "c.yaml"
    path.write_text("ppo:\n  lr: 1e-3\n  total_steps: 1e6\n  target_kl: null\nmodel:\n  hidden: [32, 32]\n")
    c = load(path)
    assert c.ppo.lr == 1e-3 and type(c.ppo.lr) is float
    assert c.ppo.total_steps == 1_000_000
    assert c.ppo.target_kl is None
    assert c.model.hidden == [32, 32]


def test_load_merges_over_a_given_base(tmp_path):
    base = Config()
    base.ppo.epochs = 7
    path = tmp_path / "c.yaml"
    path.write_text("ppo:\n  lr: 0.01\n")
    c = load(path, base)
    assert c.ppo.epochs == 7 and c.ppo.lr == 0.01


def test_load_of_empty_file_gives_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert load(path) == Config()


def test_load_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="nope.yaml"):
        load(tmp_path / "nope.yaml")


def test_load_unknown_key_names_the_key(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("ppo:\n  clip: 0.1\n")
    with pytest.raises(ConfigError, match=r"ppo\.clip"):
        load(path)


def test_from_dict_unknown_section_names_the_section():
    with pytest.raises(ConfigError, match="trainer"):
        from_dict({"trainer": {"lr": 1.0}})


def test_from_dict_section_must_be_a_mapping():
    with pytest.raises(ConfigError, match="ppo"):
        from_dict({"ppo": 3})


def test_save_then_load_round_trips(tmp_path):
    c = Config()
    c.env.id = "Pendulum-v1"
    c.actors.count = 3
    c.env.normalize_obs = True
    c.ppo.lr = 3e-4
    c.ppo.anneal_lr = False
    c.ppo.target_kl = 0.02
    c.model.hidden = [256, 128]
    c.model.activation = "relu"
    c.run.thresholds = [100.0, 500.0]
    c.run.stop_at_return = None
    c.learner.max_wait_ms = 0.5
    path = tmp_path / "config.yaml"
    save(c, path)
    loaded = load(path)
    assert loaded == c
    assert loaded != Config()
    assert yaml.safe_load(path.read_text())["ppo"]["lr"] == 3e-4


def test_save_writes_every_section(tmp_path):
    path = tmp_path / "config.yaml"
    save(Config(), path)
    assert set(yaml.safe_load(path.read_text())) == {"env", "actors", "ppo", "model", "learner", "sync", "selfplay",
                                                      "run", "policies"}  # policies: a mapping, empty by default


# --- presets ---------------------------------------------------------------------------------


def test_presets_ship_with_the_package_and_include_the_default():
    assert {"cartpole-fast", "cartpole-cleanrl", "pendulum"} <= set(preset_names())
    assert DEFAULT_PRESET == "cartpole-fast"


def test_a_preset_loads_by_name_as_by_path():
    by_name = load("cartpole-fast")
    assert by_name == load("src/lockstep/presets/cartpole-fast.yaml")
    assert by_name.env.id == "CartPole-v1" and by_name.run.stop_at_return == 475
    assert load("cartpole-cleanrl") == load("src/lockstep/presets/cartpole-cleanrl.yaml")


def test_a_preset_by_name_merges_over_a_given_base():
    base = Config()
    base.learner.max_wait_ms = 0.5
    c = load("pendulum", base)
    assert c.env.id == "Pendulum-v1" and c.learner.max_wait_ms == 0.5


def test_an_unknown_preset_name_lists_the_presets():
    with pytest.raises(ConfigError, match="unknown preset 'cartpole-turbo'") as info:
        load("cartpole-turbo")
    for name in preset_names():
        assert name in str(info.value)


@pytest.mark.parametrize("source", ["nope.yaml", "configs/nope", "../cartpole-fast"])
def test_a_missing_file_names_the_path_and_lists_the_presets(source):
    with pytest.raises(ConfigError, match="does not exist") as info:
        load(source)
    assert source.split("/")[-1] in str(info.value) and DEFAULT_PRESET in str(info.value)


def test_an_existing_file_wins_over_a_preset_of_the_same_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cartpole-fast").write_text("ppo:\n  lr: 0.5\n")
    assert load("cartpole-fast").ppo.lr == 0.5


def test_the_default_config_is_the_default_preset_for_its_env_and_the_defaults_elsewhere():
    assert default_config() == load(DEFAULT_PRESET)
    assert default_config("CartPole-v1") == load(DEFAULT_PRESET)
    assert default_config("Pendulum-v1") == Config()


# --- return thresholds -------------------------------------------------------------------------


def test_return_thresholds_default_to_the_envs_reward_threshold():
    c = Config()
    assert c.run.thresholds == []
    assert c.return_thresholds() == [475.0]  # CartPole-v1's registration
    c.env.id = "Acrobot-v1"
    assert c.return_thresholds() == [-100.0]


def test_return_thresholds_are_empty_for_an_env_without_a_reward_threshold():
    c = Config()
    c.env.id = "Pendulum-v1"
    assert c.return_thresholds() == []


def test_given_thresholds_replace_the_envs_reward_threshold():
    c = Config()
    c.run.thresholds = [195.0]
    assert c.return_thresholds() == [195.0]


def _resolved(*argv: str) -> Config:
    from lockstep.cli import build_parser, resolve_config

    return resolve_config(build_parser().parse_args(["train", "--run-dir", "runs/x", *argv]))


NOTE = "run.thresholds [-400.0, -200.0] are Pendulum-v1's; dropped for CartPole-v1"


@pytest.mark.parametrize("argv", [["--env", "CartPole-v1"], ["--set", "env.id=CartPole-v1"]])
def test_a_presets_thresholds_are_dropped_with_a_note_when_the_command_line_changes_its_env(argv, caplog):
    """--config halfcheetah --env OTHER reported HalfCheetah's 1443 as "not reached" for the other env."""
    caplog.set_level(logging.INFO, logger="lockstep.config")
    config = _resolved("--config", "pendulum", *argv)
    assert config.run.thresholds == [] and config.return_thresholds() == [475.0]  # CartPole-v1's own
    assert [r.getMessage() for r in caplog.records if NOTE in r.getMessage()] != []


def test_the_default_presets_thresholds_are_dropped_when_set_changes_its_env(caplog):
    caplog.set_level(logging.INFO, logger="lockstep.config")
    config = _resolved("--set", "env.id=Acrobot-v1")  # the cartpole-fast preset, then another env
    assert config.run.thresholds == [] and config.return_thresholds() == [-100.0]
    assert "are CartPole-v1's; dropped for Acrobot-v1" in caplog.text


@pytest.mark.parametrize("argv", [["--env", "Pendulum-v1"], ["--seed", "3"]])
def test_a_presets_thresholds_stay_with_its_own_env(argv, caplog):
    caplog.set_level(logging.INFO, logger="lockstep.config")
    assert _resolved("--config", "pendulum", *argv).run.thresholds == [-400.0, -200.0]
    assert "dropped for" not in caplog.text


@pytest.mark.parametrize("argv, thresholds", [(["--set", "run.thresholds=-400,-200"], [-400.0, -200.0]),
                                              (["--run.thresholds", "100"], [100.0])])
def test_thresholds_given_on_the_command_line_with_another_env_are_kept(argv, thresholds, caplog):
    caplog.set_level(logging.INFO, logger="lockstep.config")
    config = _resolved("--config", "pendulum", "--env", "CartPole-v1", *argv)
    assert config.run.thresholds == thresholds
    assert "dropped for" not in caplog.text


# --- validate --------------------------------------------------------------------------------


def test_defaults_validate():
    Config().validate()


def test_validate_rejects_zero_actors_naming_actors_count():
    c = Config()
    c.actors.count = 0
    with pytest.raises(ConfigError, match=r"actors\.count"):
        c.validate()


@pytest.mark.parametrize("dotted, value", [
    ("actors.envs_per_actor", 0),
    ("ppo.steps_per_env", 0),
    ("ppo.minibatches", 0),
    ("ppo.epochs", 0),
    ("ppo.total_steps", 0),
    ("learner.device", "tpu"),
    ("model.activation", "gelu"),
])
def test_validate_rejects_invalid_values_naming_the_field(dotted, value):
    """Assigned directly, past set_value's own check (which refuses all but the device before validate runs)."""
    c = Config()
    section, key = dotted.split(".")
    setattr(getattr(c, section), key, value)
    with pytest.raises(ConfigError, match=dotted.replace(".", r"\.")):
        c.validate()


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:1"])
def test_validate_accepts_known_devices(device):
    c = Config()
    c.learner.device = device
    c.validate()


def test_validate_catches_a_value_outside_its_choices_assigned_directly():
    c = Config()
    c.actors.transport = "tcp"
    with pytest.raises(ConfigError, match=r"actors\.transport must be one of shm, grpc, inprocess, got 'tcp'"):
        c.validate()


@pytest.mark.parametrize("settings, fix", [
    ({"actors.transport": "inprocess"}, "use actors.transport shm"),
    ({"env.id": "envpool:Pong-v5"}, "leave actors.vector at sync"),
])
def test_envs_in_processes_are_refused_where_they_cannot_run(settings, fix):
    c = Config()
    c.actors.vector = "async"
    for dotted, value in settings.items():
        set_value(c, dotted, value)
    with pytest.raises(ConfigError, match=fix):
        c.validate()


# --- declarations: choices and ranges -----------------------------------------------------------


def test_every_field_is_declared_with_its_help():
    assert [s.dotted for s in SETTINGS] == [f"{section}.{key}" for section, values in to_dict(Config()).items()
                                            for key in values]
    assert [s.dotted for s in SETTINGS if not s.help.strip()] == []


@pytest.mark.parametrize("s", [s for s in SETTINGS if s.choices], ids=lambda s: s.dotted)
def test_a_field_with_choices_takes_each_and_nothing_else_naming_key_value_and_choices(s):
    c = Config()
    for choice in s.choices:
        set_value(c, s.dotted, choice)
        assert getattr(getattr(c, s.section), s.key) == choice
    with pytest.raises(ConfigError) as info:
        set_value(c, s.dotted, "no-such-value")
    message = str(info.value)
    assert message == f"{s.dotted} must be one of {', '.join(s.choices)}, got 'no-such-value'"


def test_the_sync_strategies_are_the_registrys():
    from lockstep.sync import NAMES

    assert config_lib.setting_of("sync.strategy").choices == NAMES == ("strict", "pipelined", "async")


@pytest.mark.parametrize(("strategy", "vtrace", "used"), [
    ("strict", None, False), ("pipelined", None, False), ("async", None, True),
    ("async", False, False), ("pipelined", True, True), ("strict", True, True),
])
def test_vtrace_left_unset_is_on_exactly_for_async_runs(strategy, vtrace, used):
    config = config_lib.from_dict({"sync": {"strategy": strategy}, "ppo": {"vtrace": vtrace}})
    config.validate()
    assert config.uses_vtrace() is used


@pytest.mark.parametrize("name", ["spin-flags", "spin-redo", "reject-retry", "seqlock"])
def test_a_config_naming_a_reference_design_is_refused_with_where_it_went(tmp_path, name):
    """The flag designs left sync.strategy for the benchmarks: a YAML file, --set or --sync naming one is told
    where they went, not just the choices."""
    where = (rf"^sync[.]strategy '{name}' is a reference design .* moved to the benchmarks \(pip install -e "
             rf"[.]/dev\): `lockstep bench sync` .* `python -m lockstep_bench[.]train --design {name}`")
    path = tmp_path / "old.yaml"
    path.write_text(f"sync:\n  strategy: {name}\n")
    with pytest.raises(ConfigError, match=where):
        load(path)
    with pytest.raises(ConfigError, match=where):
        apply_sets(Config(), [f"sync.strategy={name}"])
    from lockstep.cli import build_parser, resolve_config

    with pytest.raises(ConfigError, match=where):
        resolve_config(build_parser().parse_args(["train", "--sync", name]))


@pytest.mark.parametrize("dotted, bad, good, wanted", [
    ("actors.count", "0", "1", ">= 1"),
    ("actors.restarts", "-1", "0", ">= 0"),
    ("actors.ray_cpus_per_actor", "-0.5", "0", ">= 0"),
    ("sync.phase_cutoff", "0", "1", "> 0 and <= 1"),
    ("sync.phase_cutoff", "1.5", "0.5", "> 0 and <= 1"),
    ("sync.min_unroll", "1.01", "0", ">= 0 and <= 1"),
    ("sync.max_lag", "0", "2", ">= 1"),
    ("model.lstm_size", "-1", "0", ">= 0"),
    ("sync.stall_s", "0", "0.5", "> 0"),  # 0 would make every phase a stall
    ("run.keep_checkpoints", "0", "1", ">= 1"),  # 0 deleted each periodic checkpoint as it was written
    ("ppo.lr", "0", "1e-3", "> 0"),
    ("ppo.gamma", "1.01", "1", ">= 0 and <= 1"),
    ("ppo.lr", "nan", "1e-3", "> 0"),  # NaN compares false with every bound, and is in no range
    ("run.seed", "-1", "0", ">= 0 and <= 18446744073709551615"),  # the welcome's seed is a uint64
    ("run.seed", str(2**64), str(2**64 - 1), ">= 0 and <= 18446744073709551615"),
    ("run.time_limit_s", "0", "none", "> 0"),
    ("model.hidden", "[64, 0]", "[64, 1]", "each >= 1"),
    ("actors.ray_resources", "{actor_host: 0}", "{actor_host: 0.5}", "each value > 0"),  # Ray reserves no 0
    # below the milliseconds between an actor's gRPC connection and its stream, every connection is closed
    ("learner.hello_timeout_s", "0.001", "0.1", ">= 0.1"),
])
def test_a_declared_range_is_checked_when_the_value_is_set(dotted, bad, good, wanted):
    c = Config()
    with pytest.raises(ConfigError, match=f"^{dotted.replace('.', r'[.]')} must be {wanted}, got "):
        set_value(c, dotted, bad)
    set_value(c, dotted, good)
    c.validate()


# How a help says that every number is valid where a numeric setting declares no range.
ANY_VALUE = re.compile(r"\bany (number|integer|return)s?\b")


@pytest.mark.parametrize("s", [s for s in SETTINGS if s.numeric], ids=lambda s: s.dotted)
def test_every_numeric_setting_declares_its_range_or_says_in_its_help_that_any_number_is_valid(s):
    """A new number, list of numbers or mapping to numbers without ``ge``/``gt``/``le`` fails here until its
    declaration bounds it or its help says why every value is valid (and the reference shows either)."""
    assert s.range() or ANY_VALUE.search(s.help), (
        f"{s.dotted} declares no range: give setting(...) its ge/gt/le, or say in its help that any number is "
        "valid (e.g. 'any number')")
    assert f"| {s.range() or 'any'} | {s.help} |" in config_lib.reference()


def test_a_mapping_of_numbers_refuses_a_value_that_is_not_one_naming_the_field():
    with pytest.raises(ConfigError, match=r"^actors[.]ray_resources must be each value > 0, got \{'gpu': 'x'\}"):
        set_value(Config(), "actors.ray_resources", {"gpu": "x"})


def test_a_policys_model_keys_are_checked_against_the_model_sections_ranges():
    c = from_dict({"env": {"id": "pettingzoo:lockstep.envs.kinds"},
                   "policies": {"scouts": {"agents": ["scout_*"], "model": {"hidden": [32, 0]}},
                                "pilots": {"agents": ["pilot_*"]}}})
    with pytest.raises(ConfigError, match=r"^policies[.]scouts[.]model[.]hidden must be each >= 1, got \[32, 0\]"):
        c.validate()


@pytest.mark.parametrize("dotted, wanted", [("sync.phase_cutoff", "> 0 and <= 1"), ("learner.max_wait_ms", ">= 0"),
                                            ("run.stop_at_return", "a number")])
def test_nan_is_refused_whether_or_not_the_field_declares_a_range(dotted, wanted):
    c = Config()
    with pytest.raises(ConfigError, match=f"^{dotted.replace('.', r'[.]')} must be {wanted}, got nan$"):
        set_value(c, dotted, "nan")
    setattr(getattr(c, dotted.split(".")[0]), dotted.split(".")[1], float("nan"))  # assigned in code
    with pytest.raises(ConfigError, match="got nan"):
        c.validate()


def test_none_passes_a_range_where_the_field_allows_none():
    c = Config()
    set_value(c, "sync.phase_cutoff", "none")
    assert c.sync.phase_cutoff is None
    c.validate()


# --- moved keys --------------------------------------------------------------------------------

# an old config file: every moved key, each with a value other than its new field's default
OLD_FILE = {
    "env": {"id": "CartPole-v1", "actors": 3, "envs_per_actor": 5, "actor_restarts": 4, "launcher": "ray",
            "ray_address": "auto", "ray_num_cpus": 6, "ray_cpus_per_actor": 0.5},
    "learner": {"transport": "inprocess", "device": "cpu"},
}


def test_an_old_config_file_loads_each_moved_key_where_it_lives_now_and_says_so(tmp_path, caplog):
    assert {f"{section}.{key}" for section, values in OLD_FILE.items() for key in values} >= set(MOVED)
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(OLD_FILE))
    with caplog.at_level(logging.WARNING, logger="lockstep.config"):
        c = load(path)
    assert (c.actors.count, c.actors.envs_per_actor, c.actors.restarts, c.actors.launcher) == (3, 5, 4, "ray")
    assert (c.actors.ray_address, c.actors.ray_num_cpus, c.actors.ray_cpus_per_actor) == ("auto", 6, 0.5)
    assert (c.actors.transport, c.learner.device) == ("inprocess", "cpu")
    for old, new in MOVED.items():
        assert f"config key {old} moved to {new}" in caplog.text


def test_an_old_key_beside_its_new_one_fails_naming_both():
    with pytest.raises(ConfigError, match=r"^env\.actors moved to actors\.count, and this config gives both"):
        from_dict({"env": {"actors": 3}, "actors": {"count": 2}})


def test_an_old_run_directorys_config_resumes_as_it_was_saved(tmp_path):
    """config.yaml as runs wrote it before the move: the old layout, every field present."""
    saved = Config()
    saved.actors.count, saved.actors.transport = 1, "grpc"
    old = to_dict(saved)
    actors = old.pop("actors")
    old["env"].update(actors=actors["count"], envs_per_actor=actors["envs_per_actor"],
                      actor_restarts=actors["restarts"], launcher=actors["launcher"],
                      **{k: v for k, v in actors.items() if k.startswith("ray_") and f"env.{k}" in MOVED})
    old["learner"]["transport"] = actors["transport"]
    old["sync"]["inference_threads"] = 2  # the reference designs' threads, at their default then
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(old))
    assert load(path) == saved


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_setting_a_moved_key_fails_naming_where_it_moved(old, new):
    with pytest.raises(ConfigError, match=f"^{old.replace('.', '[.]')} moved to {new.replace('.', '[.]')}"):
        apply_sets(Config(), [f"{old}=1"])


# --- the reference -----------------------------------------------------------------------------


def test_the_committed_reference_is_what_the_declarations_write():
    assert (REPO / "docs" / "configuration.md").read_text() == config_lib.reference(), (
        "docs/configuration.md is stale: python -m lockstep.config --markdown docs/configuration.md")


def test_the_reference_lists_every_field_with_its_help_and_every_moved_key(tmp_path):
    assert config_lib.main(["--markdown", str(tmp_path / "c.md")]) == 0
    text = (tmp_path / "c.md").read_text()
    for s in SETTINGS:
        assert f"| `{s.dotted}` | {s.type_name()} |" in text and s.help in text
    for old, new in MOVED.items():
        assert f"| `{old}` | `{new}` |" in text


def test_benchmark_knobs_that_left_the_config_load_at_their_old_defaults_and_are_refused_otherwise(tmp_path):
    old = tmp_path / "config.yaml"  # a run directory's config.yaml from before they left
    old.write_text("sync:\n  jitter_ms: 0.0\nrun:\n  collect_only: false\n  seed: 3\n")
    assert config_lib.load(old).run.seed == 3
    old.write_text("sync:\n  jitter_ms: 2.5\n")
    with pytest.raises(config_lib.ConfigError, match="sync.jitter_ms is no longer a config key.*--jitter-ms"):
        config_lib.load(old)
    with pytest.raises(config_lib.ConfigError, match="run.collect_only is no longer a config key.*--collect-only"):
        config_lib.apply_sets(config_lib.Config(), ["run.collect_only=true"])


def test_the_reference_designs_threads_left_with_the_debug_section(tmp_path):
    old = tmp_path / "config.yaml"  # a run directory's config.yaml from before: the debug section at its default
    old.write_text("sync:\n  strategy: pipelined\ndebug:\n  inference_threads: 2\n")
    assert config_lib.load(old).sync.strategy == "pipelined"
    old.write_text("debug:\n  inference_threads: 3\n")
    with pytest.raises(config_lib.ConfigError, match="debug.inference_threads is no longer a config key.*--design"):
        config_lib.load(old)
    with pytest.raises(config_lib.ConfigError, match="sync.inference_threads is no longer a config key"):
        config_lib.apply_sets(config_lib.Config(), ["sync.inference_threads=2"])


def test_env_kwargs_are_a_mapping_from_yaml_or_a_flag():
    config = Config()
    config_lib.set_value(config, "env.kwargs", "{N: 4, max_cycles: 50}")
    assert config.env.kwargs == {"N": 4, "max_cycles": 50}
    config_lib.set_value(config, "env.kwargs", {"continuous_actions": True})
    assert config.env.kwargs == {"continuous_actions": True}
    assert Config().env.kwargs == {}  # each config its own mapping
    with pytest.raises(config_lib.ConfigError, match="env.kwargs: cannot use .*expected a mapping of keyword names"):
        config_lib.set_value(config, "env.kwargs", "[1, 2]")


# --- actors.splits --------------------------------------------------------------------------------


@pytest.mark.parametrize("settings, message", [
    ({"actors.envs_per_actor": 3, "actors.splits": 2},
     r"actors\.splits 2 .* actors\.envs_per_actor 3 does not divide by it: make actors\.envs_per_actor a multiple "
     r"of 2"),
    ({"actors.transport": "inprocess", "actors.splits": 2}, r"actors\.splits > 1 .* use actors\.transport shm"),
    ({"actors.splits": 0}, r"actors\.splits must be >= 1 and <= 64, got 0"),
    ({"actors.splits": 65}, r"actors\.splits must be >= 1 and <= 64, got 65"),
])
def test_splits_that_cannot_work_are_refused_by_name(settings, message):
    c = Config()
    c.actors.envs_per_actor = 4
    with pytest.raises(ConfigError, match=message):
        for dotted, value in settings.items():
            set_value(c, dotted, value)
        c.validate()


def test_each_split_of_an_actor_is_a_member_the_first_phase_waits_for():
    c = Config()
    c.actors.count, c.actors.envs_per_actor, c.actors.splits = 3, 4, 2
    assert c.min_actors == 6 and c.batch_size == 3 * 4 * c.ppo.steps_per_env
    c.learner.min_actors = 1
    assert c.min_actors == 2
    c.actors.launcher, c.actors.transport = "ray", "inprocess"  # Ray actors always reach the learner over gRPC
    c.validate()
