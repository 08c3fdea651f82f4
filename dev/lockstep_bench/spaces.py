"""``lockstep bench spaces``: generated observation and action spaces, each trained, audited and evaluated.

Where features meet, defects hide: a space kind with normalization and the numpy inference step, a mask key
with agents that leave early, ``env.obs_keys`` with many agents. Each example (a ``Case``, drawn by the
hypothesis strategies below) is a small env of ``lockstep.envs.generated`` in generated spaces:

- the observation: a Box (1-3 dimensions, float32 or uint8; uint8 [C, H, W] is an image, rarely one of 36
  pixels for the Nature CNN; uint8 (H, W, C) one that the actor transposes, ``envs.images``), Discrete,
  MultiDiscrete or MultiBinary leaf, or a Dict or Tuple of them nested up to 3 deep;
- the action: a Discrete, MultiDiscrete, MultiBinary or Box, or a one-level Dict or Tuple of them;
- an action mask under a generated key or none, ``env.obs_keys`` or none, ``env.normalize_obs`` on or off,
  ``learner.inference_kernel`` auto (numpy where it applies) or torch, ``learner.update_precision`` (an image
  leaf's CNN in bfloat16 in the update), eval's sampled or deterministic play;
- one agent (``lockstep.envs.generated:Generated``), or a PettingZoo parallel env of 2-3 agents as slots, every
  agent but one leaving at a random step (``pettingzoo:lockstep.envs.generated``), with ``env.agent_id`` or not,
  the critic reading the agent's own observation or the env's global state (``model.critic_input``),
  acting with one shared policy or with two (``policies``: the first agent's and the others', each audited on
  its own; ``env.obs_keys`` is then not drawn, as lockstep refuses it with several policies).

``run_case`` trains it in process for two iterations with the audit trail, then requires ``lockstep audit``
to PASS (every policy's trail), ``lockstep eval`` to play an episode (of many agents: every agent's return,
each acting with its own policy) and ``lockstep export`` to write ONNX (of many agents: a file per policy) that
onnxruntime runs to the actions of ``lockstep eval --deterministic`` on a few steps (``parity``); for many
agents, the audit must have seen inactive steps (agents left in every unroll). A case lockstep refuses by design
(``expected_refusal``: a mask leaf for an action without a categorical part) must be refused before training with
that error, a ValueError naming it. Anything else is a
failure: an exception, a run that does not end within ``timeout_s``, an audit that fails.

``tests/integration/test_generated_spaces.py`` runs a few seeded examples in the suite; this command runs many
and writes every failure with its case (``spaces.json``, ``spaces.md``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import tempfile
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hypothesis
from hypothesis import strategies as st

from lockstep import config as config_lib
from lockstep.common.files import atomic_write

SINGLE = "lockstep.envs.generated:Generated"
MULTI = "pettingzoo:lockstep.envs.generated"
RESERVED = ("agent_active", "agent_id", "global_state", "observation")  # keys the PettingZoo slots add themselves
MASK_DTYPES = ("multi_binary", "int8", "uint8")


@dataclass
class Case:
    """One generated example: the env's kwargs (``lockstep.envs.generated``) and the run's settings."""

    observation: dict[str, Any]
    action: dict[str, Any]
    mask: str = ""  # the action mask's key ('' none)
    mask_dtype: str = "multi_binary"
    mask_key: str = "action_mask"  # env.action_mask_key: ``mask`` where there is one
    obs_keys: list[str] = field(default_factory=list)
    normalize: bool = False
    kernel: str = "auto"
    precision: str = "float32"  # learner.update_precision: the CNN of an image leaf in bfloat16 in the update
    deterministic: bool = False  # how eval plays
    agents: int = 0  # 0: one agent (a Gymnasium env); else a PettingZoo parallel env of that many
    agent_id: bool = False
    policies: bool = False  # many agents: two policies, the first agent's and the others' (``policies``)
    critic_input: str = "own"  # many agents: global, the critic reads the env's global state (MAPPO)
    length: int = 6  # steps an episode lasts at most
    sync: str = "strict"  # sync.strategy: async trains its lagged samples on V-trace, over every space drawn

    @property
    def env_id(self) -> str:
        return MULTI if self.agents else SINGLE

    def env_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"observation": self.observation, "action": self.action, "length": self.length}
        if self.mask:
            kwargs |= {"mask": self.mask, "mask_dtype": self.mask_dtype}
        if self.agents:
            kwargs["agents"] = self.agents
        return kwargs

    @property
    def steps_per_env(self) -> int:
        return 2 * self.length  # an unroll holds a whole episode: every agent but one leaves within it

    def config(self, run_dir: Path, seed: int = 1) -> config_lib.Config:
        """Two iterations in process, two envs, an 8-unit network, the audit trail; restarts 0, so that an
        actor that fails ends nothing silently (the run is then cut by ``run_case``'s timeout)."""
        config = config_lib.Config()
        slots = 2 * max(self.agents, 1)
        for key, value in {
            "env.id": self.env_id, "env.kwargs": self.env_kwargs(), "env.action_mask_key": self.mask_key,
            "env.obs_keys": self.obs_keys, "env.normalize_obs": self.normalize, "env.agent_id": self.agent_id,
            "actors.count": 1, "actors.envs_per_actor": 2, "actors.transport": "inprocess", "actors.restarts": 0,
            "ppo.steps_per_env": self.steps_per_env, "ppo.total_steps": 2 * slots * self.steps_per_env,
            "ppo.epochs": 1, "ppo.minibatches": 2, "model.hidden": [8], "model.critic_input": self.critic_input,
            "learner.device": "cpu", "sync.strategy": self.sync,
            "learner.inference_kernel": self.kernel, "learner.update_precision": self.precision,
            "run.audit": True, "run.progress": False, "run.seed": seed,
            "run.run_dir": str(run_dir),
        }.items():
            config_lib.set_value(config, key, value)
        if self.policies:
            config.policies = config_lib.from_dict({"policies": {"first": {"agents": ["agent_0"]},
                                                                 "others": {"agents": ["agent_*"]}}}).policies
        return config

    def describe(self) -> str:
        """The case as one JSON line: what a failure report shows, and ``Case(**json.loads(...))`` rebuilds."""
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))


def expected_refusal(case: Case) -> str | None:
    """What lockstep refuses by design in ``case``, as a piece of the error's message; None: it must train."""
    if case.mask and not _categorical(case.action):
        return "has no Discrete, MultiDiscrete or MultiBinary part to mask"
    return None


def _categorical(action: dict[str, Any]) -> bool:
    if "dict" in action:
        return any(_categorical(part) for part in action["dict"].values())
    if "tuple" in action:
        return any(_categorical(part) for part in action["tuple"])
    return "box" not in action


# ---- the strategies ----

KEYS = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=6).filter(
    lambda key: key not in RESERVED and key != "action_mask")


@st.composite
def box_leaves(draw) -> dict[str, Any]:
    """A float32 Box of 1-3 dimensions (bounded or not), or a uint8 one; a uint8 [C, H, W] is an image, one in
    four of them 36 x 36 (the Nature CNN's smallest: slower, so not more), and half of the others channels-last
    (H, W, C: C of 1, 3 or 4, less than H and W), which the actor transposes (one agent: ``envs.images``; a
    PettingZoo env's slots take it as it is)."""
    dims = draw(st.integers(1, 3))
    if draw(st.booleans()):
        return {"box": draw(st.lists(st.integers(1, 4), min_size=dims, max_size=dims)),
                "scale": draw(st.sampled_from([1.0, 100.0, None]))}
    if dims == 3 and draw(st.integers(0, 3)) == 0:
        return {"box": [1, 36, 36], "dtype": "uint8"}
    if dims == 3 and draw(st.booleans()):
        channels = draw(st.sampled_from([1, 3, 4]))
        side = st.integers(max(3, channels + 1), 6)
        return {"box": [draw(side), draw(side), channels], "dtype": "uint8"}
    if dims == 3:
        return {"box": [draw(st.integers(1, 3)), draw(st.integers(2, 6)), draw(st.integers(2, 6))], "dtype": "uint8"}
    return {"box": draw(st.lists(st.integers(1, 4), min_size=dims, max_size=dims)), "dtype": "uint8"}


@st.composite
def observation_leaves(draw) -> dict[str, Any]:
    """A Box (two draws in five: the leaf with the most variants), Discrete, MultiDiscrete or MultiBinary."""
    kind = draw(st.sampled_from(["box", "box", "discrete", "multi_discrete", "multi_binary"]))
    if kind == "box":
        return draw(box_leaves())
    if kind == "discrete":
        return {"discrete": draw(st.integers(1, 5))}
    if kind == "multi_discrete":
        return {"multi_discrete": draw(st.one_of(
            st.lists(st.integers(1, 4), min_size=1, max_size=3),
            st.lists(st.lists(st.integers(2, 3), min_size=2, max_size=2), min_size=1, max_size=2)))}
    return {"multi_binary": draw(st.one_of(st.integers(1, 4), st.lists(st.integers(1, 3), min_size=2, max_size=2)))}


def observations(depth: int = 3) -> st.SearchStrategy[dict[str, Any]]:
    """A leaf, or a Dict or Tuple of 1-3 observations, nested up to ``depth`` deep."""
    if depth == 0:
        return observation_leaves()
    inner = observations(depth - 1)
    return st.one_of(
        observation_leaves(),
        st.builds(lambda d: {"dict": d}, st.dictionaries(KEYS, inner, min_size=1, max_size=3)),
        st.builds(lambda t: {"tuple": t}, st.lists(inner, min_size=1, max_size=3)),
    )


def action_leaves() -> st.SearchStrategy[dict[str, Any]]:
    return st.one_of(
        st.builds(lambda n: {"discrete": n}, st.integers(2, 4)),
        st.builds(lambda nvec: {"multi_discrete": nvec}, st.lists(st.integers(2, 4), min_size=1, max_size=3)),
        st.builds(lambda n: {"multi_binary": n}, st.integers(1, 3)),
        st.builds(lambda shape, scale: {"box": shape, "scale": scale},
                  st.lists(st.integers(1, 3), min_size=1, max_size=2), st.sampled_from([1.0, 2.0, None])),
    )


def actions() -> st.SearchStrategy[dict[str, Any]]:
    """A leaf, or a one-level Dict or Tuple of 1-3 leaves."""
    return st.one_of(
        action_leaves(),
        st.builds(lambda d: {"dict": d}, st.dictionaries(KEYS, action_leaves(), min_size=1, max_size=3)),
        st.builds(lambda t: {"tuple": t}, st.lists(action_leaves(), min_size=1, max_size=3)),
    )


@st.composite
def cases(draw, multi_agent: bool = False) -> Case:
    """A ``Case`` of one agent, or (``multi_agent``) of a PettingZoo parallel env's agents as slots."""
    observation = draw(observations())
    case = Case(observation=observation, action=draw(actions()), normalize=draw(st.booleans()),
                kernel=draw(st.sampled_from(["auto", "torch"])), deterministic=draw(st.booleans()),
                length=draw(st.integers(3, 6)))
    if draw(st.booleans()):
        key = draw(st.one_of(st.just("action_mask"), KEYS))
        if "dict" not in observation or key in observation["dict"]:
            observation = {"dict": {"_" + key if key.startswith("x") else "x" + key: observation}}
        case.observation, case.mask, case.mask_key = observation, key, key
        case.mask_dtype = draw(st.sampled_from(MASK_DTYPES))
    else:
        case.mask_key = draw(st.sampled_from(["action_mask", ""]))
    if multi_agent:
        case.agents, case.agent_id = draw(st.integers(2, 3)), draw(st.booleans())
        case.policies = draw(st.booleans())
        case.critic_input = draw(st.sampled_from(["own", "global"]))
    keys = _root_keys(case)
    # env.obs_keys: some of the root's keys, the mask always among them (refused with several policies)
    if keys and not case.policies and draw(st.integers(0, 3)) == 0:
        kept = draw(st.lists(st.sampled_from(keys), min_size=1, max_size=len(keys), unique=True))
        case.obs_keys = kept + ([case.mask] if case.mask and case.mask not in kept else [])
    case.sync = draw(st.sampled_from(["strict", "strict", "pipelined", "async"]))
    case.precision = draw(st.sampled_from(["float32", "bfloat16", "auto"]))
    return case


def _root_keys(case: Case) -> list[str]:
    """The keys of the observation the learner sees: a Dict's (with the mask), a PettingZoo slot's."""
    keys = list(case.observation["dict"]) if "dict" in case.observation else []
    keys += [case.mask] if case.mask else []
    if case.agents:
        centralized = case.critic_input == "global"  # the global state, and the agent id with it
        keys = (keys or ["observation"]) + ["agent_active"] + (["agent_id"] if case.agent_id or centralized else [])
        keys += ["global_state"] if centralized else []
    return keys


# ---- one example ----

@dataclass
class Outcome:
    case: str  # Case.describe()
    result: str  # "passed", "refused" (by design) or "failed"
    message: str = ""  # the refusal, or the failure: where it failed and the error
    seconds: float = 0.0


class ExampleTimeout(BaseException):
    """A run that did not end within its time (a BaseException: no ``except Exception`` of the run takes it)."""


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise ``ExampleTimeout`` in the main thread after ``seconds`` (a hung run is a failed example, not a hang)."""
    def expire(signum, frame):
        raise ExampleTimeout(f"did not finish within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_case(case: Case, run_dir: Path, timeout_s: float = 120.0) -> Outcome:
    """Train ``case`` (two iterations), audit it, evaluate it (module docstring): what came out."""
    from lockstep.launch.local import train
    from lockstep.tools import audit
    from lockstep.tools.eval import evaluate

    started = time.monotonic()
    refusal = expected_refusal(case)

    def outcome(result: str, message: str = "") -> Outcome:
        return Outcome(case.describe(), result, message, round(time.monotonic() - started, 2))

    stage = "train"
    try:
        with deadline(timeout_s):
            config = case.config(run_dir)
            try:
                summary = train(config, run_dir)
            except ValueError as err:
                if refusal is not None and refusal in str(err) and not (run_dir / "metrics.csv").exists():
                    return outcome("refused", str(err))
                raise
            if refusal is not None:
                return outcome("failed", f"trained although lockstep refuses it by design ({refusal!r})")
            if summary["env_steps"] != config.ppo.total_steps:
                return outcome("failed", f"train: {summary['env_steps']} env steps of {config.ppo.total_steps}")
            stage = "audit"
            reports = [audit.check(run_dir, policy=policy) for policy in audit.policies_of(run_dir)]
            for report in reports:
                if report.exit_code != 0:
                    return outcome("failed", "audit: " + audit.format_report(report)[-2000:])
            if case.agents and sum(report.inactive for report in reports) == 0:
                return outcome("failed", "audit: no inactive step, although agents left early in every unroll "
                                         "(env.obs_keys dropped agent_active?)")
            stage = "eval"
            report = evaluate(run_dir, episodes=1, deterministic=case.deterministic)
            played = report.episodes
            if len(played) != 1 or not 1 <= played[0].length <= case.length:
                return outcome("failed", f"eval: played {played}")
            if case.agents and len(played[0].returns) != case.agents:  # every agent's return, until it left
                return outcome("failed", f"eval: returns of {sorted(played[0].returns)}, not of {case.agents} agents")
            stage = "export"
            _export(case, run_dir)
        return outcome("passed")
    except (Exception, ExampleTimeout) as err:  # every error is the example's outcome, a timeout too
        detail = "".join(traceback.format_exception_only(type(err), err)).strip()
        return outcome("failed", f"{stage}: {detail[-2000:]}")


def _export(case: Case, run_dir: Path) -> None:
    """``lockstep export`` of the run as ONNX, a file per policy, each acting as ``lockstep eval --deterministic``
    does in ``PARITY_STEPS`` steps (``parity``)."""
    from lockstep.tools.export import export
    from lockstep_bench import parity

    if case.agents:
        written = export(run_dir, "onnx", run_dir / "exported")
        expected = 2 if case.policies else 1
        if len(written) != expected or not all(Path(f"{path}.json").is_file() for path in written):
            raise AssertionError(f"exported {written}, not {expected} files with their cards")
        plays = parity.reference_parallel(run_dir, PARITY_STEPS, seed=1)
    else:
        written = export(run_dir, "onnx", run_dir / "policy.onnx")
        plays = {"shared": parity.reference(run_dir, PARITY_STEPS, seed=1)}
    for path in written:
        card = json.loads(Path(f"{path}.json").read_text())
        played = plays[card["policy"]]
        parity.compare(card, parity.run_here("onnx", path, parity.feeds(card, played, not card["recurrent"])), played)


PARITY_STEPS = 4


# ---- the benchmark ----

def run(examples: int, out: Path, seed: int = 0, multi_agent_share: float = 0.25,
        timeout_s: float = 120.0) -> dict[str, Any]:
    """``examples`` cases drawn from seed ``seed`` (a share of them multi-agent), each run by ``run_case``;
    writes ``out/spaces.json`` and ``out/spaces.md`` and returns the report."""
    out.mkdir(parents=True, exist_ok=True)
    multi = round(examples * multi_agent_share)
    outcomes: list[Outcome] = []
    started = time.monotonic()
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    for count, multi_agent in ((examples - multi, False), (multi, True)):
        if not count:
            continue

        @hypothesis.settings(max_examples=count, database=None, deadline=None, phases=[hypothesis.Phase.generate],
                             suppress_health_check=list(hypothesis.HealthCheck))
        @hypothesis.given(case=cases(multi_agent))
        def one(case: Case) -> None:
            with tempfile.TemporaryDirectory(prefix="lockstep-spaces-", ignore_cleanup_errors=True) as tmp:
                outcomes.append(run_case(case, Path(tmp) / "run", timeout_s))
            last = outcomes[-1]
            print(f"[{len(outcomes)}/{examples}] {last.result} ({last.seconds:g} s)"
                  + (f": {last.message.splitlines()[-1][:200]}\n  {last.case}" if last.result == "failed" else ""),
                  flush=True)

        hypothesis.seed(seed + int(multi_agent))(one)()
    report = {
        "examples": len(outcomes), "passed": sum(o.result == "passed" for o in outcomes),
        "refused": sum(o.result == "refused" for o in outcomes),
        "failed": sum(o.result == "failed" for o in outcomes), "seed": seed,
        "elapsed_s": round(time.monotonic() - started, 1), "loadavg_at_start": load_at_start,
        "loadavg_at_end": [round(x, 2) for x in os.getloadavg()],
        "outcomes": [dataclasses.asdict(o) for o in outcomes],
    }
    atomic_write(out / "spaces.json", json.dumps(report, indent=1))
    atomic_write(out / "spaces.md", format_report(report, examples))
    return report


def format_report(report: dict[str, Any], examples: int) -> str:
    lines = [f"# lockstep bench spaces --examples {examples} --seed {report['seed']}", "",
             f"{report['examples']} examples: {report['passed']} passed, {report['refused']} refused by design, "
             f"{report['failed']} failed, in {report['elapsed_s']:g} s (load average at start "
             f"{', '.join(map(str, report['loadavg_at_start']))}; at end "
             f"{', '.join(map(str, report['loadavg_at_end']))}).", ""]
    failures = [o for o in report["outcomes"] if o["result"] == "failed"]
    if failures:
        lines += ["## Failures", ""]
        for o in failures:
            lines += [f"- `{o['case']}`", "", "  ```", *("  " + line for line in o["message"].splitlines()[-8:]),
                      "  ```", ""]
    return "\n".join(lines) + "\n"
