"""A sweep's spec: the YAML file ``lockstep sweep`` reads, checked whole before any trial starts.

The spec names a base config (a preset or a file), the fields it fixes (``set``), the search space over
config keys, the objective, the budget of each run, the number of trials and the sampler and pruner. Every
key of ``set`` and ``space`` is a field of the config tree (``lockstep.config``): it is converted and checked
as ``--set`` checks it, and a range's ends and every choice must be values the field accepts. A bad spec is a
``SpecError`` that names the field (``space.ppo.lr: ...``), raised before anything runs.

The spec's own fields are declared once, below, with their help: ``python -m lockstep.sweep.spec --markdown
docs/sweeps.md`` writes their table into docs/sweeps.md (a unit test compares the two).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from lockstep import config as config_lib
from lockstep.observe.metrics import COLUMNS, POLICY_COLUMNS, POLICY_COLUMNS_ADDED, POLICY_PREFIX

Direction = Literal["maximize", "minimize"]
Value = Literal["final", "mean_last", "env_steps_to", "seconds_to"]
SamplerName = Literal["tpe", "random", "grid"]
PrunerName = Literal["median", "hyperband", "none"]
Aggregate = Literal["mean", "median", "worst"]


class SpecError(ValueError):
    """A sweep spec that cannot run; the message starts with the field (``space.ppo.lr: ...``)."""


def spec_field(default: Any, help: str) -> Any:
    """A field of the spec with its default and its help (written once: docs/sweeps.md shows it)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class Objective:
    """What a run's result is: a metrics.csv column, read at the end, over the last rows, or as the env steps or
    seconds until it first reached a threshold."""

    metric: str = spec_field("episode_return_mean", "a metrics.csv column (episode_return_mean, "
                                                    "episode_return_mean20, eval_return_mean, ...; with several "
                                                    "policies a policy's own, e.g. "
                                                    "policy/predator/episode_return_mean)")
    value: Value = spec_field("final", "final: the metric's last value; mean_last: its mean over the last "
                                       "objective.last rows that have one; env_steps_to / seconds_to: the env steps "
                                       "or seconds (since training started) of the first row whose metric is at "
                                       "least objective.threshold")
    direction: Direction | None = spec_field(None, "maximize or minimize; empty: maximize for final and mean_last, "
                                                   "minimize for env_steps_to and seconds_to")
    last: int = spec_field(10, "mean_last: how many of the last rows")
    threshold: float | None = spec_field(None, "env_steps_to and seconds_to: the value the metric must reach. A run "
                                               "that never reaches it scores its whole budget, plus the budget times "
                                               "its shortfall (threshold - its best) / abs(threshold), so that nearer "
                                               "misses rank better")

    @property
    def maximize(self) -> bool:
        return self.direction == "maximize"


@dataclass
class Budget:
    """What each run of a trial may spend: env steps, seconds, or both (whichever ends first)."""

    total_steps: int | None = spec_field(None, "env steps per run (sets ppo.total_steps, which the learning rate "
                                               "anneals over); empty: the base config's")
    seconds: float | None = spec_field(None, "seconds of training per run (sets run.time_limit_s); empty: none")


@dataclass
class Pruner:
    """Stopping hopeless trials: each run reports its objective, computed from the rows written so far, at
    pruner.reports evenly spaced points of its budget; the pruner compares them with other trials' at the same
    point."""

    kind: PrunerName = spec_field("median", "median (stop a trial whose value is worse than the median of "
                                            "earlier trials' at the same point), hyperband or none")
    startup_trials: int = spec_field(3, "median: trials that finish before any is pruned")
    warmup: float = spec_field(0.2, "the fraction of each run's budget before it may be pruned")
    reports: int = spec_field(20, "points per run at which the objective is reported")


@dataclass
class Spec:
    """A sweep: trials of ``base`` with the ``space``'s keys chosen by the sampler."""

    base: str = spec_field("", "the config every trial starts from: a preset name (cartpole-cleanrl) or a YAML "
                               "file (relative to the spec's folder)")
    set: dict[str, Any] = spec_field({}, "config fields fixed for every trial, {section.key: value}, applied "
                                         "over base")
    space: dict[str, Any] = spec_field({}, "the search space, {section.key: range or choices}: {low: L, high: H} "
                                           "(an integer range for an integer field), with log: true for a log scale "
                                           "and step: S for a grid, or a list of choices [a, b, c]")
    first: list[dict[str, Any]] = spec_field([], "parameter sets the study tries first, in order, before the "
                                                 "sampler's own: [{section.key: value, ...}, ...] (a key left out is "
                                                 "sampled); e.g. the base's own settings, as a reference trial")
    objective: Objective = spec_field(None, "what a trial scores (the fields below)")
    trials: int = spec_field(20, "trials in the study (a resumed or shared study counts the trials it has)")
    seed: int = spec_field(0, "the sampler's seed: the same spec and seed propose the same trials, given the same "
                              "results (with --jobs 1)")
    sampler: SamplerName = spec_field("tpe", "tpe (Optuna's default, seeded), random or grid (the combinations "
                                             "of choices and stepped ranges, in a seeded order; trials of them)")
    seeds: list[int] = spec_field([], "the run seeds of each trial (a number N: N seeds from the base's "
                                      "run.seed up); each seed is a run, their objectives aggregated. Empty: the "
                                      "base's run.seed")
    aggregate: Aggregate = spec_field("mean", "how the seeds' objectives combine: mean, median or worst")
    budget: Budget = spec_field(None, "each run's budget (the fields below)")
    pruner: Pruner = spec_field(None, "pruning (the fields below)")

    path: Path | None = field(default=None, repr=False, metadata={"help": ""})  # where it was read from

    def base_config(self) -> config_lib.Config:
        """The base config with ``set`` and the budget applied: every trial's config before its parameters."""
        base = self.base
        if self.path is not None and (self.path.parent / base).is_file():
            base = str(self.path.parent / base)
        config = config_lib.load(base)
        for key, value in self.set.items():
            config_lib.set_value(config, key, value)
        if self.budget.total_steps is not None:
            config.ppo.total_steps = self.budget.total_steps
        if self.budget.seconds is not None:
            config.run.time_limit_s = self.budget.seconds
        if self.objective.value in ("env_steps_to", "seconds_to") and self.objective.metric == "episode_return_mean20" \
                and config.run.stop_at_return is None:
            config.run.stop_at_return = self.objective.threshold  # training past the threshold changes nothing
        return config

    def run_seeds(self, config: config_lib.Config) -> list[int]:
        return list(self.seeds) or [config.run.seed]

    def trial_config(self, params: dict[str, Any], seed: int, transport: str | None = None) -> config_lib.Config:
        """A run's whole config as its trial trains it: the base (with ``set`` and the budget), the ``transport``
        the sweep's layout gives its runs (None: the base's), ``params``, ``seed``; no run name or directory
        (``lockstep train`` names a run of best.yaml afresh). Validated, as ``lockstep train`` will: a
        ``ConfigError`` names the field of a config that no run would accept."""
        config = self.base_config()
        if transport:
            config.actors.transport = transport
        for key, value in params.items():
            config_lib.set_value(config, key, value)
        config_lib.set_value(config, "run.seed", seed)
        config.run.progress = False
        config.run.name = config.run.run_dir = ""
        config.validate()
        return config

    def check_trials(self, transport: str | None = None) -> None:
        """Refuse, naming the field, a spec whose trials' configs (``trial_config``, with ``transport``) would be
        refused: the base, each run seed, each parameter set of ``first``, and each end of every range and every
        choice over the base (a range's inner values are refused only where an end is)."""
        base = self.base_config()
        seeds = self.run_seeds(base)
        laid_out = f" (with actors.transport {transport}, which the sweep gives its runs)" if transport else ""
        checks = [("base", {}, base.run.seed)] + [("seeds", {}, seed) for seed in seeds]
        checks += [(f"first[{i}]", dict(params), seed) for i, params in enumerate(self.first) for seed in seeds]
        checks += [(f"space.{p.key}: with {value!r}", {p.key: value}, seed)
                   for p in self.params() for value in p.values() for seed in seeds]
        for where, params, seed in checks:
            try:
                self.trial_config(params, seed, transport)
            except config_lib.ConfigError as err:
                raise SpecError(f"{where}{laid_out}: {err}") from None

    def params(self) -> list[Param]:
        return [Param.parse(key, value) for key, value in self.space.items()]


NESTED = {"objective": Objective, "budget": Budget, "pruner": Pruner}


# --- the search space ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    """One key of the search space: a float or integer range (log scale, step) or a list of choices."""

    key: str
    kind: Literal["float", "int", "choice"]
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    step: float | None = None
    choices: tuple[Any, ...] = ()

    @staticmethod
    def parse(key: str, value: Any) -> Param:
        where = f"space.{key}"
        try:
            s = config_lib.setting_of(key)
        except config_lib.ConfigError as err:
            raise SpecError(f"{where}: {err}") from None
        if isinstance(value, dict) and set(value) == {"choices"}:
            value = value["choices"]
        if isinstance(value, list):
            if not value:
                raise SpecError(f"{where}: an empty list of choices; give at least one value")
            for choice in value:
                _check_value(where, key, choice)
            return Param(key, "choice", choices=tuple(value))
        if not isinstance(value, dict):
            raise SpecError(f"{where}: give a range {{low: L, high: H}} (log: true, step: S) or a list of choices, "
                            f"got {value!r}")
        unknown = set(value) - {"low", "high", "log", "step"}
        if unknown or not {"low", "high"} <= set(value):
            raise SpecError(f"{where}: a range takes low, high, log and step; got {', '.join(map(str, value))}")
        number = _number_type(s.hint)
        if number is None:
            raise SpecError(f"{where}: {key} is a {s.type_name()}, not a number: give a list of choices")
        low, high, log, step = value["low"], value["high"], bool(value.get("log", False)), value.get("step")
        for name, end in (("low", low), ("high", high), ("step", step)):
            if end is not None and (isinstance(end, bool) or not isinstance(end, (int, float))):
                raise SpecError(f"{where}.{name}: expected a number, got {end!r}")
            if number is int and end is not None and not float(end).is_integer():
                raise SpecError(f"{where}.{name}: {key} is an integer field, got {end!r}")
        if not low < high:
            raise SpecError(f"{where}: the range is empty (low {low} is not below high {high}); "
                            "for a fixed value use set")
        if log and low <= 0:
            raise SpecError(f"{where}: a log range needs low > 0, got {low}")
        if log and step is not None:
            raise SpecError(f"{where}: log and step do not go together; drop one")
        if step is not None and step <= 0:
            raise SpecError(f"{where}.step: must be > 0, got {step}")
        for end in (low, high):
            _check_value(where, key, end)
        kind = "int" if number is int else "float"
        return Param(key, kind, float(low), float(high), log, None if step is None else float(step))

    def grid(self) -> list[Any]:
        """Every value of this key in a grid: the choices, every integer of an integer range, the steps of a
        stepped float range; a SpecError for a continuous range."""
        if self.kind == "choice":
            return [encode(c) for c in self.choices]
        if self.kind == "int":
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        if self.step is None:
            raise SpecError(f"space.{self.key}: sampler grid needs a list of choices or a range with step")
        count = int(math.floor((self.high - self.low) / self.step + 1e-9)) + 1
        return [round(self.low + i * self.step, 12) for i in range(count)]

    def values(self) -> list[Any]:
        """The values that bound this key: both ends of a range, every choice (the spec checks each)."""
        if self.kind == "choice":
            return list(self.choices)
        cast = int if self.kind == "int" else float
        return [cast(self.low), cast(self.high)]


def encode(choice: Any) -> Any:
    """A choice as Optuna stores it: a scalar as it is, a list or mapping (model.hidden: [64, 64]) as YAML text."""
    if choice is None or isinstance(choice, (bool, int, float, str)):
        return choice
    return yaml.safe_dump(choice, default_flow_style=True).strip()


def decode(param: Param, stored: Any) -> Any:
    """The config value of a choice Optuna stored (``encode``'s inverse); ranges' values as they are."""
    if param.kind != "choice":
        return stored
    return next((c for c in param.choices if encode(c) == stored), stored)


def _number_type(hint: Any) -> type | None:
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    return args[0] if len(args) == 1 and args[0] in (int, float) else None


def _check_policy_metric(metric: str, base: config_lib.Config) -> None:
    """A per-policy column, ``policy/NAME/COLUMN``: NAME one of the base's policies, COLUMN one that metrics.csv
    writes for each policy (``POLICY_COLUMNS``, ``POLICY_COLUMNS_ADDED``)."""
    name, _, column = metric.removeprefix(POLICY_PREFIX).partition("/")
    if not base.policies:
        raise SpecError(f"objective.metric: {metric!r} is a column of a run of several policies, and the base has "
                        "none (policies is empty): use a column of the run, e.g. episode_return_mean")
    if name not in base.policies:
        raise SpecError(f"objective.metric: {metric!r} names the policy {name!r}, which is not one of the base's "
                        f"policies ({', '.join(base.policies)})")
    if column not in POLICY_COLUMNS + POLICY_COLUMNS_ADDED:
        raise SpecError(f"objective.metric: {metric!r}: {column!r} is not a column metrics.csv writes for each "
                        f"policy; {POLICY_PREFIX}{name}/ has {', '.join(POLICY_COLUMNS + POLICY_COLUMNS_ADDED)}")


def _check_value(where: str, key: str, value: Any) -> None:
    try:
        config_lib.set_value(config_lib.Config(), key, value)
    except config_lib.ConfigError as err:
        raise SpecError(f"{where}: {err}") from None


# --- reading ----------------------------------------------------------------------------------------


def load(path: str | Path) -> Spec:
    """The spec in the YAML file ``path``, checked (``check``)."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"no sweep spec at {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise SpecError(f"{path} is not YAML: {err}") from None
    return from_dict(data or {}, path)


def from_dict(data: Any, path: Path | None = None) -> Spec:
    """A ``Spec`` from plain data, checked whole: unknown fields, values of the wrong kind, config keys, ranges and
    the metric are each refused naming the field."""
    if not isinstance(data, dict):
        raise SpecError(f"a sweep spec is a mapping of fields ({', '.join(_names(Spec))}), got {data!r}")
    spec = Spec(**_fields(Spec, data, ""), path=path)
    for name, cls in NESTED.items():
        value = data.get(name) or {}
        if not isinstance(value, dict):
            raise SpecError(f"{name}: expected a mapping of {', '.join(_names(cls))}, got {value!r}")
        setattr(spec, name, cls(**_fields(cls, value, f"{name}.")))
    check(spec)
    return spec


def _names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.metadata.get("help")]


def _fields(cls: type, data: dict[str, Any], prefix: str) -> dict[str, Any]:
    """The plain fields of ``cls`` in ``data``, each converted to its declared type; nested sections left out."""
    known = _names(cls)
    unknown = [k for k in data if k not in known]
    if unknown:
        raise SpecError(f"{prefix}{unknown[0]}: unknown field; {prefix.rstrip('.') or 'a spec'} has: "
                        f"{', '.join(known)}")
    hints = typing.get_type_hints(cls)
    values = {}
    for name, value in data.items():
        if cls is Spec and name in NESTED:
            continue
        values[name] = _convert(f"{prefix}{name}", hints[name], value)
    return values


def _convert(where: str, hint: Any, value: Any) -> Any:
    """``value`` as the field's type (a Literal's choices, int, float, str, a mapping, a list of seeds)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        if value is None:
            return None
        hint = next(a for a in args if a is not type(None))
        origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        if value not in args:
            raise SpecError(f"{where}: must be one of {', '.join(args)}, got {value!r}")
        return value
    if origin is dict:
        if not isinstance(value, dict):
            raise SpecError(f"{where}: expected a mapping {{section.key: ...}}, got {value!r}")
        return dict(value)
    if origin is list and typing.get_origin(args[0]) is dict:  # first: a list of mappings
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise SpecError(f"{where}: expected a list of mappings {{section.key: value}}, got {value!r}")
        return [dict(v) for v in value]
    if origin is list:  # seeds: a list of integers, or how many
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
        if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return list(value)
        raise SpecError(f"{where}: expected a list of integer seeds or a number of seeds, got {value!r}")
    if hint is str:
        if not isinstance(value, str):
            raise SpecError(f"{where}: expected text, got {value!r}")
        return value
    if hint in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (hint is int and
                                                                              not float(value).is_integer()):
            raise SpecError(f"{where}: expected {'an integer' if hint is int else 'a number'}, got {value!r}")
        return hint(value)
    raise TypeError(f"unsupported spec field type {hint}")


def check(spec: Spec) -> None:
    """Everything that can be checked before a trial: the base, ``set``, each key's range or choices, the
    objective, the budget, the sampler's needs, and the config at every end of every range."""
    if not spec.base:
        raise SpecError("base: give a preset name or a config file every trial starts from")
    if not spec.space:
        raise SpecError("space: give at least one config key to search, e.g. ppo.lr: {low: 1.0e-4, high: 3.0e-3}")
    for key in spec.set:
        if key in spec.space:
            raise SpecError(f"set.{key}: also in space; a key is either fixed or searched")
    obj = spec.objective
    if obj.metric not in COLUMNS and not obj.metric.startswith(POLICY_PREFIX):
        raise SpecError(f"objective.metric: {obj.metric!r} is not a metrics.csv column; columns: "
                        f"{', '.join(COLUMNS)}, and with several policies {POLICY_PREFIX}NAME/COLUMN (COLUMN: "
                        f"{', '.join(POLICY_COLUMNS + POLICY_COLUMNS_ADDED)})")
    to_threshold = obj.value in ("env_steps_to", "seconds_to")
    if to_threshold and obj.threshold is None:
        raise SpecError(f"objective.threshold: objective.value {obj.value} needs the threshold the metric must reach")
    if obj.direction is None:
        obj.direction = "minimize" if to_threshold else "maximize"
    elif to_threshold and obj.direction == "maximize":
        raise SpecError(f"objective.direction: {obj.value} counts what reaching the threshold costs: minimize it")
    for name, value in (("objective.last", obj.last), ("trials", spec.trials), ("pruner.reports", spec.pruner.reports)):
        if value < 1:
            raise SpecError(f"{name}: must be at least 1, got {value}")
    if spec.pruner.startup_trials < 0:
        raise SpecError(f"pruner.startup_trials: must be at least 0, got {spec.pruner.startup_trials}")
    if not 0 <= spec.pruner.warmup < 1:
        raise SpecError(f"pruner.warmup: a fraction of the budget in [0, 1), got {spec.pruner.warmup}")
    budget = spec.budget
    if budget.total_steps is not None and budget.total_steps < 1:
        raise SpecError(f"budget.total_steps: must be at least 1, got {budget.total_steps}")
    if budget.seconds is not None and budget.seconds <= 0:
        raise SpecError(f"budget.seconds: must be > 0, got {budget.seconds}")
    for key, value in spec.set.items():
        _check_value(f"set.{key}", key, value)
    try:
        base = spec.base_config()
    except config_lib.ConfigError as err:
        raise SpecError(f"base: {err}") from None
    if obj.metric.startswith(POLICY_PREFIX):
        _check_policy_metric(obj.metric, base)
    if isinstance(spec.seeds, int):
        spec.seeds = [base.run.seed + i for i in range(spec.seeds)]
    params = spec.params()
    by_key = {p.key: p for p in params}
    for i, params_i in enumerate(spec.first):
        for key, value in params_i.items():
            if key not in by_key:
                raise SpecError(f"first[{i}].{key}: not a key of space ({', '.join(by_key)})")
            _check_value(f"first[{i}].{key}", key, value)
            p = by_key[key]
            if p.kind == "choice" and value not in p.choices:
                raise SpecError(f"first[{i}].{key}: {value!r} is not one of space.{key}'s choices")
            if p.kind != "choice" and not p.low <= value <= p.high:
                raise SpecError(f"first[{i}].{key}: {value!r} is outside space.{key}'s range [{p.low:g}, {p.high:g}]")
    if spec.sampler == "grid":
        size = math.prod(len(p.grid()) for p in params)
        if size < spec.trials:
            raise SpecError(f"trials: the grid has {size} combinations, fewer than {spec.trials} trials; give "
                            f"trials: {size} (or more values)")
    spec.check_trials()  # every run a trial trains validates: the layout's transport is the sweep's (runner.layout)


# --- the reference ----------------------------------------------------------------------------------

BEGIN = "<!-- spec fields: written by `python -m lockstep.sweep.spec --markdown docs/sweeps.md` -->"
END = "<!-- end of spec fields -->"


def reference() -> str:
    """The table of the spec's fields (between ``BEGIN`` and ``END`` in docs/sweeps.md)."""
    lines = [BEGIN, "", "| field | type | default | help |", "|---|---|---|---|"]
    for cls, prefix in ((Spec, ""), (Objective, "objective."), (Budget, "budget."), (Pruner, "pruner.")):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if not f.metadata.get("help"):
                continue
            nested = cls is Spec and f.name in NESTED
            value = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            default = "" if nested else f"`{_yaml(value)}`"
            kind = "mapping" if nested else config_lib._type_name(hints[f.name])
            lines.append(f"| `{prefix}{f.name}` | {kind} | {default} | {f.metadata['help'].replace('|', '/')} |")
    return "\n".join(lines + ["", END])


def _yaml(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def write_reference(doc: Path) -> None:
    """Replace the table between ``BEGIN`` and ``END`` in ``doc`` with ``reference()``."""
    text = doc.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{doc} has no spec table to replace (the lines {BEGIN!r} ... {END!r})")
    doc.write_text(pattern.sub(lambda _: reference(), text))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lockstep.sweep.spec",
                                     description="Write the sweep spec's fields into docs/sweeps.md.")
    parser.add_argument("--markdown", metavar="FILE", required=True, help="the Markdown file whose table to rewrite")
    write_reference(Path(parser.parse_args(argv).markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
