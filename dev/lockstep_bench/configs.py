"""``lockstep bench configs``: generated configs, each refused at start by name or trained end to end.

Every option meets every other where users configure lockstep. Each example (a ``Case``, drawn by the
hypothesis strategies below) is a config tree drawn from the declarations in ``lockstep.config.SETTINGS``
(each field's type, ``Literal`` choices and ``ge``/``gt``/``le`` range, read from the declaration, so a range
added there is drawn here too) over a few small envs:

- the env: CartPole-v1 (Discrete actions), Pendulum-v1 (Box actions), or ``pettingzoo:lockstep.envs.kinds``
  (agents of two kinds, whose spaces differ) with a ``policies`` mapping (two or three policies, per-policy
  model keys, a frozen one) or without one (refused by design: the kinds cannot share one network);
- the features: the transports (shm, grpc, inprocess), ``actors.vector`` sync or async, ``actors.splits`` 2 (actor
  processes: the inprocess transport refuses it), the synchronization strategies (strict; pipelined and async with
  ``sync.max_lag`` and ``ppo.vtrace``; ``sync.phase_cutoff``), observation and reward normalization, a recurrent
  core (an LSTM or a GRU, a critic of its own or not), the critic's input, ``run.eval_every``, periodic
  checkpoints, the inference kernel; the sizes (actors, envs, T, iterations, epochs, minibatches, hidden layers)
  drawn from small ranges, so that every run is a few tiny iterations;
- then up to three fields of any section set again: inside the declared range, on its edge, just outside it,
  NaN, a value of the wrong type or a choice that is none. A setting that declares no range is drawn only
  from values known to be sensible (``SENSIBLE``): whether others are valid is not declared, so not tested.

``run_case`` runs the case through the real command line (``lockstep.cli.main``, in this process, the config
written as YAML and given with ``--config``) and requires exactly one of two outcomes:

- **refused**: ``lockstep train`` exits 2 with one line (``lockstep: config error: ...`` or, for an env that
  cannot run it, ``lockstep: ...``) that names a field the case sets (the one outside its declaration, or,
  where a rule that ties fields is checked first, one of those), before any training (no metrics.csv);
- **passed**: it trains (metrics.csv rows, summary.json, checkpoints/final.pt), ``--resume`` with a larger
  step budget trains more iterations whose numbers and policy versions continue the first run's,
  ``lockstep eval RUN_DIR`` plays an episode, evaluation while training (where drawn) fails nowhere, and
  ``lockstep audit RUN_DIR`` PASSes.

Anything else is a defect: an exception out of the command, an exit 1, a run that does not end within
``timeout_s``, a refusal after training started, a value outside its declaration that trains, a resume that
refuses its own config, an eval or audit that fails.

``tests/integration/test_generated_configs.py`` runs a few seeded examples in the suite; this command runs many
and writes every defect with its config as YAML (``configs.json``, ``configs.md``).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import logging
import math
import os
import re
import signal
import sys
import tempfile
import time
import traceback
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hypothesis
import yaml
from hypothesis import strategies as st

from lockstep import config as config_lib
from lockstep.common.files import atomic_write
from lockstep_bench.spaces import ExampleTimeout, deadline

KINDS = "pettingzoo:lockstep.envs.kinds"
ENVS = ("CartPole-v1", "Pendulum-v1", KINDS)

# Fields the runner sets itself (where the run lives and what it records), or whose other values need what a
# small machine has not (a Ray cluster, a GPU, certificates, an account): never drawn.
FIXED = {"env.id", "env.kwargs", "env.obs_keys", "env.action_mask_key", "actors.ray_address", "learner.listen",
         "learner.tls_cert", "learner.tls_key", "model.policy", "run.name", "run.run_dir", "run.progress",
         "run.audit", "run.wandb", "run.wandb_project", "run.eval_video_every"}
NOT_DRAWN = {("actors.launcher", "ray")}  # choices that need a Ray cluster

# The values drawn inside each numeric field's range: small, so that a run stays a few tiny iterations, and
# sensible for the fields that declare no range (their other values are not declared valid or invalid).
SENSIBLE: dict[str, list[Any]] = {
    "env.clip_obs": [5.0, 10.0], "env.clip_reward": [1.0, 10.0],
    "actors.count": [1, 2], "actors.envs_per_actor": [1, 2, 3], "actors.splits": [1, 2], "actors.restarts": [0, 1, 10],
    "actors.ray_num_cpus": [0, 2], "actors.ray_cpus_per_actor": [0.5, 1.0],
    "ppo.steps_per_env": [2, 4, 8, 16], "ppo.lr": [1e-4, 2.5e-4, 1e-3], "ppo.gamma": [0.9, 0.99, 1.0],
    "ppo.gae_lambda": [0.0, 0.95, 1.0], "ppo.epochs": [1, 2], "ppo.minibatches": [1, 2, 4],
    "ppo.clip_coef": [0.1, 0.2], "ppo.ent_coef": [0.0, 0.01], "ppo.vf_coef": [0.5, 1.0],
    "ppo.max_grad_norm": [0.5, 10.0], "ppo.adam_eps": [1e-8, 1e-5], "ppo.target_kl": [None, 0.01, 1.0],
    "ppo.vtrace_rho_bar": [0.5, 1.0, 2.0], "ppo.vtrace_c_bar": [0.5, 1.0],
    "model.init_log_std": [-1.0, 0.0], "model.lstm_size": [0, 4, 8], "model.hidden": [[8], [4, 4], [16], []],
    "learner.min_actors": [0, 1], "learner.max_batch": [1, 8, 4096], "learner.max_wait_ms": [0.0, 2.0, 5.0],
    "learner.torch_threads": [1, 2], "learner.max_message_mb": [1, 64], "learner.max_observation": [1e10, 1e38],
    "learner.max_reward": [1e10, 1e38], "learner.max_envs_per_actor": [16, 65_536],
    "learner.max_id_length": [256, 1024], "learner.max_space_elements": [1024, 1 << 24],
    "learner.hello_timeout_s": [10.0, 30.0], "learner.max_connections": [64, 1024],
    "sync.max_lag": [None, 1, 2, 3], "ppo.vtrace": [None, False, True],
    "sync.stall_s": [5.0, 10.0], "sync.step_deadline_s": [60.0, 300.0],
    "sync.first_step_deadline_s": [20.0, 60.0], "sync.step_deadline_min_s": [30.0, 60.0],
    "sync.step_deadline_factor": [1.0, 10.0], "sync.phase_cutoff": [None, 0.5, 1.0],
    "sync.min_unroll": [0.0, 0.25, 1.0],
    "selfplay.pool_size": [1, 8], "selfplay.snapshot_every": [1, 10], "selfplay.latest": [0.0, 0.5, 1.0],
    "selfplay.random": [0.0, 0.5],
    "run.seed": [0, 1, 7], "run.thresholds": [[], [1.0, 10.0]], "run.checkpoint_every": [0, 1, 2],
    "run.checkpoint_minutes": [0.0, 5.0], "run.keep_checkpoints": [1, 3], "run.stop_at_return": [None, 1e9],
    "run.time_limit_s": [None, 600.0], "run.eval_every": [0, 1, 2], "run.eval_episodes": [1, 2],
}


@dataclass
class Case:
    """One generated example: the config tree written to YAML, and what in it lies outside its declaration."""

    config: dict[str, Any]
    invalid: list[str] = field(default_factory=list)  # keys drawn outside their declaration: must be refused
    resume_steps: int = 0  # ppo.total_steps of the resumed run

    def keys(self) -> set[str]:
        """Every key the case sets (``section.key``), and ``policies`` (set or not: a PettingZoo env's agents
        whose spaces differ need it), as a refusal may name them."""
        return {f"{section}.{key}" for section, values in self.config.items() if section != "policies"
                for key in values} | {"policies"}

    def describe(self) -> str:
        """The case as YAML: what a defect report shows, and ``Case(**yaml.safe_load(...))`` rebuilds."""
        return yaml.safe_dump(dataclasses.asdict(self), sort_keys=False)


# ---- the strategies ----

@dataclass(frozen=True)
class Draw:
    """A value for a field, and whether its declaration allows it."""

    value: Any
    valid: bool
    edge: bool = False  # on the declared range's edge (or just outside it)


def _numeric(s: config_lib.Setting) -> type | None:
    """int or float for a numeric field (``float | None`` too), else None."""
    hint = s.hint
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint if hint in (int, float) else None


def _ranged(s: config_lib.Setting) -> bool:
    return s.ge is not None or s.gt is not None or s.le is not None


def _edges(s: config_lib.Setting, kind: type) -> list[Draw]:
    """The values on the declared range's edges and just outside it, as the declaration says."""
    draws = []
    step = 1 if kind is int else 1e-3
    if s.ge is not None:
        draws += [Draw(kind(s.ge), True, True), Draw(kind(s.ge) - step, False, True)]
    if s.gt is not None:
        draws += [Draw(kind(s.gt), False, True), Draw(kind(s.gt) + step, True, True)]
    if s.le is not None:
        above = step if kind is int else max(abs(s.le) * 1e-3, step)
        draws += [Draw(kind(s.le), True, True), Draw(kind(s.le) + above, False, True)]
    if kind is float:
        draws.append(Draw(math.nan, False))
    return draws


def _wrong_type(s: config_lib.Setting) -> list[Draw]:
    """Values the field's type cannot take."""
    hint, origin = s.hint, typing.get_origin(s.hint)
    if s.choices:
        return [Draw("no-such-" + s.key, False)]
    if hint in (bool, bool | None):
        return [Draw("maybe", False)]
    if _numeric(s) is int:
        return [Draw(1.5, False), Draw("many", False)]
    if _numeric(s) is float:
        return [Draw("fast", False)]
    if origin is list:
        return [Draw(["x!"], False)] if typing.get_args(hint)[0] in (int, float) else []
    return []


def _allowed(s: config_lib.Setting, value: Any) -> bool:
    """Whether ``s``'s declaration takes ``value`` (a sensible value may lie outside a range declared since)."""
    try:
        s.check(value)
    except config_lib.ConfigError:
        return False
    return True


def field_draws(s: config_lib.Setting) -> list[Draw]:
    """The values drawn for ``s``: inside its range (``SENSIBLE``, else its default), on its edges, just outside
    them, of the wrong type. A field that declares no range has only its sensible values and the wrong type."""
    inside = [Draw(v, _allowed(s, v)) for v in SENSIBLE.get(s.dotted, [s.default])]
    if s.choices:
        inside = [Draw(c, True) for c in s.choices if (s.dotted, c) not in NOT_DRAWN]
    elif s.hint is bool:
        inside = [Draw(True, True), Draw(False, True)]
    kind = _numeric(s)
    edges = _edges(s, kind) if kind is not None and _ranged(s) else []
    if s.dotted == "learner.device":
        inside, edges = [Draw("cpu", True), Draw("auto", True)], [Draw("tpu", False)]
    return inside + edges + _wrong_type(s)


PERTURBED = [s for s in config_lib.SETTINGS if s.dotted not in FIXED]


@st.composite
def policies(draw) -> tuple[dict[str, Any], bool]:
    """A ``policies`` mapping of the kinds env, and whether lockstep must refuse it."""
    shape = draw(st.sampled_from(["kinds", "split", "frozen", "unmapped", "all-frozen", "bad-name"]))
    mapping: dict[str, Any] = {"scouts": {"agents": ["scout_*"]}, "pilots": {"agents": ["pilot_*"]}}
    if shape == "split":
        mapping = {"first": {"agents": ["scout_0"]}, "second": {"agents": ["scout_1"]},
                   "pilots": {"agents": ["pilot_?"]}}
    elif shape == "frozen":
        mapping["pilots"]["train"] = False
    elif shape == "all-frozen":
        mapping["scouts"]["train"] = mapping["pilots"]["train"] = False
    elif shape == "unmapped":  # pilot_0 has no policy
        mapping["pilots"]["agents"] = ["nobody_*"]
    elif shape == "bad-name":
        mapping["2pilots"] = mapping.pop("pilots")
    name = draw(st.sampled_from(sorted(mapping)))
    own = draw(st.sampled_from([{}, {"hidden": [4]}, {"activation": "relu"}, {"lstm_size": 4},
                                {"lstm_size": 4, "rnn": "gru"}, {"critic_input": "global"}]))
    if own:
        mapping[name]["model"] = own
    return mapping, shape in ("unmapped", "all-frozen", "bad-name")


@st.composite
def cases(draw, perturb: int = 3) -> Case:
    """A ``Case``: a small run of one of ``ENVS`` with its features drawn, then up to ``perturb`` fields set
    again from ``field_draws``."""
    env_id = draw(st.sampled_from(ENVS))
    invalid: list[str] = []
    count, envs, steps = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.sampled_from([4, 8, 16]))
    lstm = draw(st.sampled_from([0, 0, 4]))
    tree: dict[str, dict[str, Any]] = {
        "env": {"id": env_id, "normalize_obs": draw(st.booleans()), "normalize_reward": draw(st.booleans())},
        "actors": {"count": count, "envs_per_actor": envs,
                   "transport": draw(st.sampled_from(["inprocess", "inprocess", "shm", "grpc"])),
                   "vector": "sync", "restarts": 0},
        "ppo": {"steps_per_env": steps, "epochs": draw(st.integers(1, 2)), "minibatches": draw(st.integers(1, 4)),
                "anneal_lr": draw(st.booleans()), "target_kl": draw(st.sampled_from([None, None, 0.05]))},
        "model": {"hidden": draw(st.sampled_from([[8], [4, 4], [16]])), "lstm_size": lstm,
                  "critic_lstm": bool(lstm) and draw(st.booleans()),
                  "rnn": draw(st.sampled_from(["lstm", "gru"])) if lstm else "lstm",
                  "activation": draw(st.sampled_from(["tanh", "relu"]))},
        "learner": {"device": "cpu", "inference_kernel": draw(st.sampled_from(["auto", "torch"]))},
        "sync": {"strategy": draw(st.sampled_from(["strict", "pipelined", "async"]))},
        "run": {"audit": True, "progress": False, "seed": draw(st.integers(0, 3)),
                "checkpoint_every": draw(st.sampled_from([0, 1, 2])),
                "eval_every": draw(st.sampled_from([0, 0, 0, 1])), "eval_episodes": 1},
    }
    if tree["sync"]["strategy"] != "strict":  # the bound, or the strategy's default; V-trace on, off or its default
        tree["sync"]["max_lag"] = draw(st.sampled_from([None, 1, 2, 4]))
        tree["ppo"]["vtrace"] = draw(st.sampled_from([None, False, True]))
    if draw(st.integers(0, 3)) == 0:
        tree["sync"]["phase_cutoff"] = draw(st.sampled_from([0.5, 1.0]))
        tree["sync"]["min_unroll"] = draw(st.sampled_from([0.0, 0.25, 1.0]))
    if env_id != KINDS and draw(st.integers(0, 3)) == 0:  # async envs: in processes of their own (not inprocess)
        tree["actors"]["vector"] = "async"
        tree["actors"]["transport"] = draw(st.sampled_from(["shm", "shm", "grpc", "inprocess"]))
    if tree["actors"]["transport"] != "inprocess" and draw(st.integers(0, 3)) == 0:  # double-buffered actors
        tree["actors"]["splits"] = 2
        tree["actors"]["envs_per_actor"] = draw(st.sampled_from([2, 4]))
    agents = 1
    if env_id == KINDS:
        agents = 3
        tree["env"]["agent_id"] = draw(st.booleans())
        if draw(st.integers(0, 4)):  # one in five: no policies, refused (the kinds' spaces differ)
            mapping, refused = draw(policies())
            tree["policies"] = mapping
            invalid += ["policies"] if refused else []
    iterations = draw(st.integers(1, 3))
    for _ in range(draw(st.sampled_from([n for n in (0, 1, 1, 2, 3) if n <= perturb]))):
        s = draw(st.sampled_from(PERTURBED))
        draws = field_draws(s)
        valid = [d for d in draws if d.valid]
        invalid_draws = [d for d in draws if not d.valid]  # two in three draws are valid, where both kinds exist
        pool = valid if not invalid_draws or (valid and draw(st.integers(0, 2))) else invalid_draws
        edges = [d for d in pool if d.edge]  # half the time on an edge, where the range has one
        value = draw(st.sampled_from(edges if edges and draw(st.booleans()) else pool))
        tree.setdefault(s.section, {})[s.key] = value.value
        if not value.valid:
            invalid.append(s.dotted)
        else:  # the field's last draw is the value the case has
            invalid = [key for key in invalid if key != s.dotted]
    actors = tree["actors"]
    if isinstance(actors.get("count"), int) and isinstance(actors.get("envs_per_actor"), int) and isinstance(
            tree["ppo"].get("steps_per_env"), int):
        batch = max(actors["count"], 1) * max(actors["envs_per_actor"], 1) * max(tree["ppo"]["steps_per_env"], 1)
    else:
        batch = count * envs * steps
    tree["ppo"].setdefault("total_steps", iterations * batch * agents)
    total = tree["ppo"]["total_steps"]
    resume = 2 * total if isinstance(total, int) and total > 0 else iterations * batch * agents
    return Case(config=tree, invalid=sorted(set(invalid)), resume_steps=resume)


# ---- one example ----

@dataclass
class Outcome:
    case: str  # Case.describe()
    result: str  # "passed", "refused" (at start, by name) or "defect"
    message: str = ""  # the refusal, or the defect: the stage, what went wrong and the output's tail
    seconds: float = 0.0


class _CurrentStderr(logging.Handler):
    """Logs to whatever ``sys.stderr`` is now, so that each command's log lands in its example's output."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:  # a closed stream at exit: the record is not worth a traceback
            pass


@contextlib.contextmanager
def captured(path: Path) -> Iterator[None]:
    """Everything the commands write, this process's and its children's (file descriptors 1 and 2, and
    ``sys.stdout``/``sys.stderr`` wherever a test runner has pointed them), into ``path``."""
    root = logging.getLogger()
    handler = _CurrentStderr()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s", "%H:%M:%S"))
    level = root.level
    root.addHandler(handler)  # also keeps cli.run's logging.basicConfig from binding to this example's stream
    root.setLevel(logging.INFO)
    sys.stdout.flush(), sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "a", buffering=1) as out:
        os.dup2(out.fileno(), 1), os.dup2(out.fileno(), 2)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                yield
        finally:
            os.dup2(saved[0], 1), os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            root.removeHandler(handler)
            root.setLevel(level)


def _rows(run_dir: Path) -> list[dict[str, str]]:
    path = run_dir / "metrics.csv"
    if not path.is_file():
        return []
    with path.open() as f:
        return list(csv.DictReader(f))


REFUSAL = re.compile(r"^lockstep: (?:config error: )?(.*)$", re.MULTILINE)
FAILURES = re.compile(r"evaluation process died|evaluation of iteration \d+ failed|the learner failed|Traceback")


def _named(message: str, keys: set[str]) -> bool:
    """Whether ``message`` names one of ``keys`` (``section.key``, or ``policies`` and its ``policies.NAME``)."""
    return any(re.search(rf"(?<![\w.]){re.escape(key)}(?![\w])", message) for key in keys)


def run_case(case: Case, workdir: Path, timeout_s: float = 90.0) -> Outcome:
    """Run ``case`` through the command line (module docstring): what came out."""
    from lockstep import cli

    started = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    run_dir, log = workdir / "run", workdir / "output.log"
    tree = json.loads(json.dumps(case.config))  # a copy
    tree.setdefault("run", {})["run_dir"] = str(run_dir)
    config_path = workdir / "config.yaml"
    config_path.write_text(yaml.safe_dump(tree, sort_keys=False))

    def tail() -> str:
        text = log.read_text(errors="replace") if log.is_file() else ""
        return "\n".join(text.splitlines()[-30:])

    def outcome(result: str, message: str = "") -> Outcome:
        if result == "defect":
            message = f"{message}\n--- output ---\n{tail()}"
        return Outcome(case.describe(), result, message, round(time.monotonic() - started, 2))

    def command(*argv: str) -> int:
        with captured(log):
            print(f"$ lockstep {' '.join(argv)}", flush=True)
            code = cli.main(list(argv))
        if code in (128 + signal.SIGINT, 128 + signal.SIGTERM):  # the command was interrupted: so is the bench
            raise KeyboardInterrupt
        return code

    stage = "train"
    try:
        with deadline(timeout_s):
            code = command("train", "--config", str(config_path))
            rows = _rows(run_dir)
            if code == 2:
                found = REFUSAL.findall(log.read_text(errors="replace"))
                message = found[-1] if found else ""
                if rows:
                    return outcome("defect", f"train: refused after {len(rows)} iteration(s): {message}")
                # a field outside its declaration, or a rule that ties it to others and is checked first
                if not _named(message, case.keys()):
                    return outcome("defect", f"train: refused without naming a key it sets: {message!r}")
                return outcome("refused", message)
            if code != 0:
                return outcome("defect", f"train: exit code {code}")
            if case.invalid:
                return outcome("defect", f"train: trained although {', '.join(case.invalid)} lie(s) outside "
                                         "the declaration")
            summary_path = run_dir / "summary.json"
            if not rows or not summary_path.is_file() or not (run_dir / "checkpoints" / "final.pt").is_file():
                return outcome("defect", f"train: {len(rows)} metrics row(s), summary.json "
                                         f"{summary_path.is_file()}, final.pt "
                                         f"{(run_dir / 'checkpoints' / 'final.pt').is_file()}")
            stage = "resume"
            code = command("train", "--resume", str(run_dir), "--total-steps", str(case.resume_steps),
                           "--no-progress")
            if code != 0:
                return outcome("defect", f"resume: exit code {code}")
            more = _rows(run_dir)
            if len(more) <= len(rows):
                return outcome("defect", f"resume: {len(more)} metrics row(s) after it, {len(rows)} before")
            iterations = [int(r["iteration"]) for r in more]
            versions = [int(r["policy_version"]) for r in more]
            if iterations != list(range(iterations[0], iterations[0] + len(more))) or any(
                    b <= a for a, b in zip(versions, versions[1:])):
                return outcome("defect", f"resume: iterations {iterations}, policy versions {versions}: they do "
                                         "not continue the first run's")
            stage = "eval"
            code = command("eval", str(run_dir), "--episodes", "1")
            if code != 0:
                return outcome("defect", f"eval: exit code {code}")
            stage = "audit"
            code = command("audit", str(run_dir))
            if code != 0:
                return outcome("defect", f"audit: exit code {code}")
            text = log.read_text(errors="replace")
            failed = [line for line in text.splitlines() if FAILURES.search(line)]
            if failed:
                return outcome("defect", f"log: {failed[0]}")
        return outcome("passed")
    except (Exception, ExampleTimeout) as err:  # every error is the example's outcome, a timeout too
        detail = "".join(traceback.format_exception(type(err), err, err.__traceback__)[-6:]).strip()
        return outcome("defect", f"{stage}: {detail[-3000:]}")


# ---- a sweep of a config the generator drew ----

def run_sweep(case: Case, workdir: Path, timeout_s: float = 300.0, jobs: int = 2) -> Outcome:
    """``lockstep sweep`` of two trials over ``case`` (its config the base, ``ppo.lr`` searched, its step
    budget), ``jobs`` at once: a spec the sweep's check accepts must not have a trial fail (``refused``: the
    check refused it by name before any trial; ``passed``: every trial complete)."""
    from lockstep import cli

    started = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    tree = json.loads(json.dumps(case.config))
    (workdir / "base.yaml").write_text(yaml.safe_dump(tree, sort_keys=False))
    spec = {"base": "base.yaml", "trials": 2, "seed": 0, "sampler": "random", "pruner": {"kind": "none"},
            "budget": {"total_steps": tree["ppo"]["total_steps"]},
            "space": {"ppo.lr": {"low": 1e-4, "high": 1e-3, "log": True}}}
    (workdir / "sweep.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    log, out = workdir / "output.log", workdir / "sweep"
    description = case.describe() + yaml.safe_dump({"sweep": spec, "jobs": jobs}, sort_keys=False)

    def outcome(result: str, message: str = "") -> Outcome:
        if result == "defect":
            text = log.read_text(errors="replace") if log.is_file() else ""
            message = f"{message}\n--- output ---\n" + "\n".join(text.splitlines()[-30:])
        return Outcome(description, result, message, round(time.monotonic() - started, 2))

    try:
        with deadline(timeout_s), captured(log):
            code = cli.main(["sweep", str(workdir / "sweep.yaml"), "--out", str(out), "--jobs", str(jobs)])
        if code == 2:
            found = REFUSAL.findall(log.read_text(errors="replace"))
            return outcome("refused", found[-1] if found else "")
        trials = list(csv.DictReader((out / "trials.csv").open())) if (out / "trials.csv").is_file() else []
        failed = [t for t in trials if not t["state"].startswith("complete")]
        if code != 0 or len(trials) != 2 or failed:
            return outcome("defect", f"sweep: exit code {code}, trials {[t['state'] for t in trials]}, though its "
                                     "spec check accepted the config")
        return outcome("passed")
    except (Exception, ExampleTimeout) as err:
        return outcome("defect", "sweep: " + "".join(traceback.format_exception_only(type(err), err)).strip())


# ---- the benchmark ----

def _counts(outcomes: list[Outcome]) -> dict[str, Any]:
    """The examples, how many ended each way, and each outcome: the report's figures, of the configs or the sweeps."""
    return {"examples": len(outcomes),
            **{key: sum(o.result == result for o in outcomes)
               for key, result in (("passed", "passed"), ("refused", "refused"), ("defects", "defect"))},
            "outcomes": [dataclasses.asdict(o) for o in outcomes]}


def run(examples: int, out: Path, seed: int = 0, timeout_s: float = 90.0, sweeps: int = 2) -> dict[str, Any]:
    """``examples`` cases drawn from seed ``seed``, each run by ``run_case``, and the first ``sweeps`` of them
    that passed with actor processes (where a sweep's layout may change the transport) swept (``run_sweep``);
    writes ``out/configs.json`` and ``out/configs.md`` and returns the report."""
    out.mkdir(parents=True, exist_ok=True)
    outcomes: list[Outcome] = []
    swept: list[Outcome] = []
    started = time.monotonic()
    load_at_start = [round(x, 2) for x in os.getloadavg()]

    def save() -> dict[str, Any]:
        report = {
            **_counts(outcomes), "seed": seed,
            "elapsed_s": round(time.monotonic() - started, 1), "loadavg_at_start": load_at_start,
            "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
            "sweeps": _counts(swept),
        }
        atomic_write(out / "configs.json", json.dumps(report, indent=1))
        atomic_write(out / "configs.md", format_report(report, examples))
        return report

    @hypothesis.settings(max_examples=examples, database=None, deadline=None, phases=[hypothesis.Phase.generate],
                         suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.given(case=cases())
    def one(case: Case) -> None:
        with tempfile.TemporaryDirectory(prefix="lockstep-configs-", ignore_cleanup_errors=True) as tmp:
            outcomes.append(run_case(case, Path(tmp), timeout_s))
        last = outcomes[-1]
        print(f"[{len(outcomes)}/{examples}] {last.result} ({last.seconds:g} s)"
              + (f": {last.message.splitlines()[0][:300]}" if last.result != "passed" else ""), flush=True)
        if last.result == "passed" and len(swept) < sweeps and case.config["actors"]["transport"] != "inprocess":
            with tempfile.TemporaryDirectory(prefix="lockstep-sweep-", ignore_cleanup_errors=True) as tmp:
                swept.append(run_sweep(case, Path(tmp)))
            print(f"  sweep {len(swept)}/{sweeps}: {swept[-1].result} ({swept[-1].seconds:g} s)"
                  + (f": {swept[-1].message.splitlines()[0][:300]}" if swept[-1].result != "passed" else ""),
                  flush=True)
        save()  # a long run interrupted keeps what it found

    hypothesis.seed(seed)(one)()
    return save()


def format_report(report: dict[str, Any], examples: int) -> str:
    lines = [f"# lockstep bench configs --examples {examples} --seed {report['seed']}", "",
             f"{report['examples']} examples: {report['passed']} passed, {report['refused']} refused at start by "
             f"name, {report['defects']} defects, in {report['elapsed_s']:g} s (load average at start "
             f"{', '.join(map(str, report['loadavg_at_start']))}; at end "
             f"{', '.join(map(str, report['loadavg_at_end']))}).", ""]
    refusals: dict[str, int] = {}
    for o in report["outcomes"]:
        if o["result"] == "refused":
            first = o["message"][:90]
            refusals[first] = refusals.get(first, 0) + 1
    if refusals:
        lines += ["## Refusals", "", *(f"- {n} x `{m}`" for m, n in sorted(refusals.items())), ""]
    sweeps = report["sweeps"]
    if sweeps["examples"]:
        lines += [f"Sweeps (`lockstep sweep` of two trials over a config that passed, `ppo.lr` searched): "
                  f"{sweeps['examples']}: {sweeps['passed']} passed, {sweeps['refused']} refused by the spec check, "
                  f"{sweeps['defects']} defects.", ""]
    defects = [o for o in report["outcomes"] + sweeps["outcomes"] if o["result"] == "defect"]
    if defects:
        lines += ["## Defects", ""]
        for o in defects:
            lines += [f"### {o['message'].splitlines()[0][:200]}", "", "```yaml", o["case"].rstrip(), "```", "",
                      "```", *o["message"].splitlines()[-40:], "```", ""]
    return "\n".join(lines) + "\n"


def replay(text: str) -> Case:
    """A ``Case`` from its YAML (``Case.describe``, as configs.md shows it)."""
    return Case(**yaml.safe_load(io.StringIO(text)))
