"""``lockstep bench fuzz``: generated clients against a real learner, to show that no client can end a run.

Each target is a ``lockstep learner`` process of one config (``TARGETS``: flat Discrete observations, an action
mask with an LSTM, several policies of the kinds env, a centralized critic) with ``--audit``, and one honest
``lockstep actor`` process training beside the generated clients. Each example (a ``Session``, drawn by the
hypothesis strategies below) is one client's conversation with it, over gRPC or over the same-host transport
(shared memory), spoken byte by byte so that it can send what no real client sends:

- a hello whose every field is drawn from valid, edge and invalid values: the protocol revision, the actor id
  (fresh, reused, the honest actor's, the largest), the run id (fresh, empty, at its length limit, over it, one
  that ended), the env count (whole envs, 0, over the limit, not whole envs of a multi-agent env), the env id,
  the role, the agent -> policy mapping (swapped, an agent dropped or added, none, a policy the learner has not),
  and the observation or action space with one thing changed (a leaf's dtype, shape, n, bounds,
  kind or path, a leaf dropped, added, nested or moved, the spaces of another layout of the agents: other
  policies, the other critic input, agent ids);
- steps with observations of every leaf kind in and out of range, NaN and infinities, masks that allow
  nothing, rewards and flags of every kind, wrong final observations, episode returns and lengths, wrong
  dtypes, shapes and byte counts (gRPC), wrong frames (shared memory);
- messages out of order or cut (a step before the hello, a second hello, bytes that are no message, half a
  hello, a hello chunk longer than its header said, a hello over the size limit), a valid hello
  again after a refused one with the same actor id, reconnects with the same id (the first connection is then
  refused as replaced) and with the honest actor's id (a hello that must be refused, which must leave the
  honest actor alone), and disconnects at every point, while held too.

An example's oracle is independent of the learner's checks: a hello or step with something invalid in it must
be refused, with a named status (never INTERNAL or UNKNOWN; over shared memory a REFUSED frame before the
connection closes), and one with nothing invalid must be answered. Every refused step carries ``SENTINEL``
in each float observation it has, a value no valid step or honest env sends. A *finding* is anything else:
the learner exiting or logging a traceback or "the learner failed", an invalid message answered, a valid one
refused, a refusal without a name, the honest actor refused. Per target, once its examples are done: the
honest actor's iterations rose while they ran, ``lockstep audit`` passes on the run, no audit batch holds
``SENTINEL`` or a discrete observation outside its space, and the learner's memory after the examples is
within ``rss_bound_mb`` of its memory after the first quarter of them.

A learner that exits is restarted (with a fresh honest actor) so that the examples after it still run; each
finding names its example as one JSON line (``Session(**json.loads(...))`` rebuilds it). The suite runs a few
seeded examples per target (``tests/integration/test_protocol_fuzz.py``); this command runs many and writes
``fuzz.json`` and ``fuzz.md``: examples, outcomes, refusals by status code, findings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hypothesis
import numpy as np
from hypothesis import strategies as st

from lockstep import config as config_lib
from lockstep.common.files import atomic_write
from lockstep.envs import EnvSpec, SpaceSpec, env_spec
from lockstep.transport import METHOD, PROTOCOL
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.codec import encode
from lockstep.transport.grpc import security
from lockstep.transport.messages import space_to_proto, step_to_proto
from lockstep.transport.shm import layout as wire

SENTINEL = np.float32(31337.0)  # in every float observation of a step that must be refused, and nowhere else
T = 64  # steps per env of a phase: long enough that the audit has few batches to check
HONEST_ID = 0
NAMED = frozenset({"INVALID_ARGUMENT", "FAILED_PRECONDITION", "ALREADY_EXISTS", "RESOURCE_EXHAUSTED",
                   "DEADLINE_EXCEEDED", "UNAVAILABLE", "UNAUTHENTICATED"})  # a refusal's status names the cause
RSS_EVERY = 25  # examples between two readings of the learner's memory (the report's trace)
PATIENCE_S = 3.0  # a step answered later than this is held (or the learner is slow): the client then leaves
KINDS = "pettingzoo:lockstep.envs.kinds"


# ---- the targets: a learner config each ----

@dataclass(frozen=True)
class Target:
    """One learner config the clients are fuzzed against, and how its honest actor connects."""

    name: str
    env: str
    settings: dict[str, Any] = field(default_factory=dict)  # dotted config keys
    policies: dict[str, list[str]] = field(default_factory=dict)  # several policies: name -> agent patterns
    honest_transport: str = "grpc"  # how the honest actor connects: grpc or shm
    # other layouts of the agents, each the env kwargs an actor started with other flags would use
    variants: tuple[tuple[str, dict[str, Any]], ...] = ()

    def config(self, run_dir: Path) -> config_lib.Config:
        config = config_lib.Config()
        for key, value in {"env.id": self.env, "actors.count": 1, "actors.envs_per_actor": 2,
                           "learner.min_actors": 1, "ppo.steps_per_env": T, "ppo.total_steps": 10**12,
                           "ppo.epochs": 1, "ppo.minibatches": 1, "model.hidden": [8], "learner.device": "cpu",
                           "run.audit": True, "run.progress": False, "run.run_dir": str(run_dir),
                           **self.settings}.items():
            config_lib.set_value(config, key, value)
        if self.policies:
            config.policies = config_lib.from_dict(
                {"policies": {name: {"agents": agents} for name, agents in self.policies.items()}}).policies
        return config

    def actor_flags(self) -> list[str]:
        flags = ["--env", self.env, "--num-envs", "2", "--actor-id", str(HONEST_ID)]
        if self.policies:
            flags += ["--policies", json.dumps(self.policies)]
        if self.settings.get("model.critic_input") == "global":
            flags += ["--critic-input", "global"]
        return flags


TEAMS = {"scouts": ["scout_*"], "pilots": ["pilot_*"]}
TARGETS = {target.name: target for target in (
    Target("frozenlake", "FrozenLake-v1"),  # a flat Discrete observation
    Target("mask-lstm", "lockstep.envs.tasks:Forbidden", {"model.lstm_size": 8}, honest_transport="shm"),
    Target("teams", KINDS, policies=TEAMS, honest_transport="shm", variants=(
        ("swapped policies", {"_lockstep_policies": {"scouts": ["pilot_*"], "pilots": ["scout_*"]}}),
        ("one policy per agent", {"_lockstep_policies": {"a": ["scout_0"], "b": ["scout_1"], "pilots": ["pilot_*"]}}),
        ("centralized critic", {"_lockstep_policies": TEAMS, "_lockstep_global_state": True}),
        ("agent ids", {"_lockstep_policies": TEAMS, "_lockstep_agent_id": True}))),
    Target("critic", "pettingzoo:lockstep.envs.partners", {"model.critic_input": "global"}, variants=(
        ("the critic's own input", {}), ("agent ids", {"_lockstep_global_state": True, "_lockstep_agent_id": True}),
        ("a declared state", {"_lockstep_global_state": True, "state": True}))),
)}


# ---- the examples ----

# what makes a hello invalid: a space changed in one place, or a field's invalid value (FIELD:VALUE); envs that
# are not whole envs of a multi-agent env are drawn more often, for they reach the backend before the refusal
INVALID_HELLO = ("space", "space", "space", "space", "space", "space", "protocol:old", "protocol:future", "run:over",
                 "run:ended", "envs:zero", "envs:over", "envs:partial", "envs:partial", "envs:partial",
                 "env_id:long", "role:opponent", "role:bogus", "mapping:swap", "mapping:drop", "mapping:extra",
                 "mapping:none", "mapping:rename")
SPACE_MUTATIONS = ("dtype", "shape", "n", "bounds", "kind", "unknown-kind", "bad-dtype", "negative-shape", "huge",
                   "path", "drop-leaf", "extra-leaf", "swap-leaves", "nested", "duplicate-path", "as-tree",
                   "empty-tree", "variant")
# a step's values: each must be refused (VALUE_EDGES: each must be answered)
OBSERVATION_MUTATIONS = ("obs-range", "obs-negative", "obs-nan", "obs-inf", "obs-neginf", "obs-huge")
VALUE_MUTATIONS = ("obs-range", "obs-negative", "obs-nan", "obs-inf", "obs-neginf", "obs-huge", "reward-nan",
                   "reward-inf", "reward-huge", "final-nan", "return-nan", "length-zero", "length-negative",
                   "final-extra", "final-missing", "final-range", "final-duplicate", "final-unsorted", "mask-none")
VALUE_EDGES = ("flag-bytes", "box-outside", "reward-large", "length-huge", "return-negative", "all-done")
GRPC_MUTATIONS = ("obs-dtype", "obs-shape", "obs-rows", "reward-dtype", "flags-dtype", "bytes-short",
                  "leaf-count", "flat-for-tree", "lengths-mismatch", "too-many-episodes", "not-protobuf",
                  "empty-message", "hello-again")
SHM_MUTATIONS = ("frame-short", "frame-long", "frame-kind", "frame-m", "frame-e", "hello-again")
# retry: a client refused at its hello says hello again on a new connection, with the same actor id and a valid hello
ENDINGS = ("close", "close", "held", "silent", "replace-same", "replace-honest")
# before or instead of a whole hello: a step, bytes that are no message, nothing (connect and leave), half a hello
# (shared memory: its header, then half its bytes, then leave; gRPC: its bytes cut in half, a message of their
# own), a hello chunk longer than its header said (gRPC: no message), a hello over the message size limit
OPENINGS = ("hello", "hello", "hello", "hello", "hello", "hello", "hello", "hello", "step-first", "garbage-first",
            "nothing", "half-hello", "long-chunk", "huge-hello")


@dataclass
class HelloPlan:
    actor: str = "fresh"  # fresh, reused, honest (only in a hello that must be refused), max
    run: str = "fresh"  # fresh, empty, limit (256 characters), over (257), ended (a run id whose connection ended)
    envs: str = "whole"  # whole, many, zero, over (the limit + 1), partial (not whole envs of a multi-agent env)
    whole: int = 1  # whole envs
    env_id: str = "same"  # same, other, long (over the limit)
    role: str = ""  # "", learning, opponent, bogus
    protocol: str = "same"  # same, old, future
    # agent_policies: same (the learner's), swap (policies moved between agents), drop (an agent left out), extra
    # (an agent the env has not), none (no mapping), rename (an agent mapped to a policy the learner has not)
    mapping: str = "same"
    space: str = ""  # "" or observation or action: the space a mutation changes
    mutation: str = ""  # one of SPACE_MUTATIONS
    pick: int = 0  # which leaf (or variant) the mutation changes

    def key(self) -> tuple:
        """The fields that make another hello (not which leaf a mutation picks, nor how many whole envs)."""
        return (self.actor, self.run, self.envs, self.env_id, self.role, self.protocol, self.mapping, self.space,
                self.mutation)

    def invalid(self, target_agents: int, several_policies: bool) -> list[str]:
        """What in this hello must get it refused (empty: it must be welcomed)."""
        why = [f"{name} {value}" for name, value, bad in (
            ("protocol", self.protocol, ("old", "future")), ("run", self.run, ("over", "ended")),
            ("envs", self.envs, ("zero", "over")), ("env_id", self.env_id, ("long",)),
            ("role", self.role, ("opponent", "bogus"))) if value in bad]
        if self.envs == "partial" and several_policies:
            why.append("envs partial")
        if self.mapping != "same" and (several_policies or self.mapping != "none"):
            why.append(f"mapping {self.mapping}")
        if self.space:
            why.append(f"{self.space} {self.mutation}")
        return why


@dataclass
class StepPlan:
    seed: int = 0
    mutation: str = ""  # "", one of VALUE_MUTATIONS, VALUE_EDGES, GRPC_MUTATIONS or SHM_MUTATIONS
    done: float = 0.0  # the share of slots whose episode ends in this step

    @property
    def invalid(self) -> bool:
        return bool(self.mutation) and self.mutation not in VALUE_EDGES


@dataclass
class Session:
    """One generated client: how it connects, its hello, its steps, how it ends."""

    transport: str = "grpc"
    opening: str = "hello"  # hello, step-first, garbage-first, nothing (connect and leave)
    hello: HelloPlan = field(default_factory=HelloPlan)
    steps: list[StepPlan] = field(default_factory=list)
    ending: str = "close"  # one of ENDINGS
    second: HelloPlan = field(default_factory=HelloPlan)  # replace-honest: its invalid hello

    def describe(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    def shape(self) -> tuple:
        """What makes two sessions different conversations: not the values of their valid steps (each run tries
        a conversation once)."""
        plans, edges = self.steps, tuple(sorted({p.mutation for p in self.steps[:-1]}))
        return (self.transport, self.opening, self.hello.key(), len(plans), edges,
                plans[-1].mutation if plans else None, self.ending, self.second.key())

    @classmethod
    def parse(cls, text: str) -> Session:
        raw = json.loads(text)
        return cls(**{**raw, "hello": HelloPlan(**raw["hello"]), "second": HelloPlan(**raw["second"]),
                      "steps": [StepPlan(**s) for s in raw["steps"]]})


@st.composite
def hellos(draw, invalid: bool | None = None) -> HelloPlan:
    """Every field from its valid and edge values; then, one time in two (always with ``invalid``), one field or
    space made invalid."""
    plan = HelloPlan(actor=draw(st.sampled_from(["fresh", "fresh", "reused", "max"])),
                     run=draw(st.sampled_from(["fresh", "fresh", "fresh", "empty", "limit"])),
                     envs=draw(st.sampled_from(["whole", "whole", "whole", "many"])), whole=draw(st.integers(1, 3)),
                     env_id=draw(st.sampled_from(["same", "same", "other"])),
                     role=draw(st.sampled_from(["", "", "learning"])), pick=draw(st.integers(0, 7)))
    if invalid or (invalid is None and draw(st.booleans())):
        what = draw(st.sampled_from(INVALID_HELLO))
        if what == "space":
            plan.space = draw(st.sampled_from(["observation", "observation", "action"]))
            plan.mutation = draw(st.sampled_from(SPACE_MUTATIONS))
        else:
            name, _, value = what.partition(":")
            setattr(plan, name, value)
        if draw(st.integers(0, 3)) == 0:
            plan.actor = "honest"  # a refused hello must leave the honest actor's session alone
    return plan


@st.composite
def sessions(draw) -> Session:
    transport = draw(st.sampled_from(["grpc", "shm"]))
    session = Session(transport=transport, opening=draw(st.sampled_from(OPENINGS)), hello=draw(hellos()),
                      ending=draw(st.sampled_from(ENDINGS)))
    own = GRPC_MUTATIONS if transport == "grpc" else SHM_MUTATIONS
    valid = draw(st.integers(0, 10))  # a request held at the end of an unroll is the ending "held"
    # the steps' values come from each step's own seed, its index: a seed drawn by hypothesis would let it vary
    # the values alone and run the same conversation again and again
    session.steps = [StepPlan(seed=i, done=draw(st.sampled_from([0.0, 0.0, 0.3, 1.0]))) for i in range(valid)]
    for step in session.steps:  # some answered steps are at the edges of what is valid
        if draw(st.integers(0, 5)) == 0:
            step.mutation = draw(st.sampled_from(VALUE_EDGES))
    if draw(st.integers(0, 2)) > 0:  # then one step that must be refused
        session.steps.append(StepPlan(seed=valid,
                                      mutation=draw(st.sampled_from([*OBSERVATION_MUTATIONS * 2, *VALUE_MUTATIONS,
                                                                     *own])),
                                      done=draw(st.sampled_from([0.0, 0.5, 1.0]))))
    if session.ending == "replace-honest":
        session.second = draw(hellos(invalid=True))
        session.second.actor = "honest"
    if session.opening != "hello":  # nothing after the first message is sent
        session.hello, session.steps, session.ending, session.second = HelloPlan(), [], "close", HelloPlan()
    elif session.hello.invalid(2, True) and session.hello.envs != "partial":  # refused at the hello: it may try again
        session.steps, session.second = [], HelloPlan()
        session.ending = "retry" if session.ending in ("held", "replace-same", "silent") else "close"
    elif session.hello.envs == "partial":  # refused by a learner of several policies (then it may try again)
        session.ending = "retry" if session.ending in ("held", "replace-same", "silent") else session.ending
    return session


# ---- the learner and its honest actor ----

def lockstep_cmd() -> list[str]:
    return [sys.executable, "-m", "lockstep"]


class FuzzedLearner:
    """A ``lockstep learner`` process of ``target`` with a token, and its honest ``lockstep actor`` process."""

    def __init__(self, target: Target, folder: Path) -> None:
        self.target, self.folder = target, folder
        self.token = secrets.token_hex(16)
        self.env = {**os.environ, security.TOKEN_ENV: self.token}
        self.starts = 0
        self.proc: subprocess.Popen | None = None
        self.actor: subprocess.Popen | None = None
        self.lines: list[str] = []
        self.actor_lines: list[str] = []

    @property
    def run_dir(self) -> Path:
        return self.folder / f"run{self.starts}"

    def start(self) -> None:
        """Start the learner (a fresh run directory each time) and the honest actor; wait for its first row."""
        self.starts += 1
        config = self.target.config(self.run_dir)
        self.folder.mkdir(parents=True, exist_ok=True)
        config_file = self.folder / "config.yaml"
        config_lib.save(config, config_file)
        port = _free_port()
        self.address = f"127.0.0.1:{port}"
        self.lines = []
        self.proc = subprocess.Popen([*lockstep_cmd(), "learner", "--config", str(config_file), "--listen",
                                      self.address], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=self.env)
        threading.Thread(target=_read, args=(self.proc, self.lines), daemon=True).start()
        self.local_address = self._wait_for(r"shared memory instead: --learner (unix:\S+)")
        self.start_actor()
        self.wait_rows(1)

    def start_actor(self) -> None:
        honest = self.local_address if self.target.honest_transport == "shm" else self.address
        self.actor_lines = []
        self.actor = subprocess.Popen([*lockstep_cmd(), "actor", "--learner", honest, *self.target.actor_flags()],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.env)
        threading.Thread(target=_read, args=(self.actor, self.actor_lines), daemon=True).start()

    def _wait_for(self, pattern: str, timeout: float = 180.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                match = re.search(pattern, line)
                if match:
                    return match.group(1)
            if self.proc.poll() is not None:
                raise RuntimeError(f"the learner exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.1)
        raise RuntimeError(f"no line matching {pattern!r} from the learner:\n{self.log()}")

    def wait_rows(self, rows: int, timeout: float = 180.0) -> bool:
        deadline = time.monotonic() + timeout
        while self.rows() < rows:
            if time.monotonic() > deadline or not self.alive():
                return False
            time.sleep(0.1)
        return True

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def failed(self, since: int = 0) -> bool:
        """Whether the learner has said that it failed (it then stops)."""
        return any("the learner failed" in line for line in self.lines[since:])

    def actor_alive(self) -> bool:
        return self.actor is not None and self.actor.poll() is None

    def rows(self) -> int:
        path = self.run_dir / "metrics.csv"
        return max(0, len(path.read_text().splitlines()) - 1) if path.exists() else 0

    def rss_mb(self) -> float:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024

    def log(self, since: int = 0, tail: int = 60) -> str:
        return "".join(self.lines[since:][-tail:])

    def stop(self) -> int | None:
        """SIGTERM the learner (it stops in order, its trail whole) and wait for both processes; the learner's
        exit code (None: it had to be killed)."""
        code = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.actor is not None:  # told that training is over, it exits; after a failed learner it would retry
            try:
                self.actor.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.actor.kill()
                self.actor.wait()
        return code


def _read(proc: subprocess.Popen, lines: list[str]) -> None:
    for line in proc.stdout:
        lines.append(line)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the messages ----

class Fuzzing:
    """What the examples of one target share: the learner's spaces, the ids and run ids used so far."""

    def __init__(self, target: Target) -> None:
        self.target = target
        config = target.config(Path("unused"))
        self.kwargs = config.vector_kwargs()
        self.spec: EnvSpec = env_spec(target.env, config.env.obs_keys, config.env.action_mask_key, self.kwargs)
        self.agents = self.spec.agents
        self.several = len(self.spec.policies) > 1
        self.variants: list[tuple[str, EnvSpec]] = []
        for name, kwargs in target.variants:
            with contextlib.suppress(ValueError):
                self.variants.append((name, env_spec(target.env, config.env.obs_keys, config.env.action_mask_key,
                                                     kwargs)))
        self.next_id = 1000
        self.used_ids: list[int] = []
        self.ended_runs: list[str] = []  # run ids of welcomed connections, oldest first

    def actor_id(self, plan: HelloPlan, rng: np.random.Generator) -> int:
        if plan.actor == "honest":
            return HONEST_ID
        if plan.actor == "max":
            return 2**32 - 1
        if plan.actor == "reused" and self.used_ids:  # half the time the newest: a client that says hello again
            pick = int(rng.integers(2 * len(self.used_ids)))
            return self.used_ids[min(pick, len(self.used_ids) - 1)]
        self.next_id += 1
        return self.next_id

    def run_id(self, plan: HelloPlan, rng: np.random.Generator) -> str:
        if plan.run == "empty":
            return ""
        if plan.run == "limit":
            return "r" * (256 - 32) + uuid.uuid4().hex  # at learner.max_id_length, and new
        if plan.run == "over":
            return "r" * 257
        if plan.run == "ended" and len(self.ended_runs) > 1:  # not the newest: its close may be on its way
            return self.ended_runs[int(rng.integers(len(self.ended_runs) - 1))]
        return uuid.uuid4().hex

    def num_envs(self, plan: HelloPlan) -> int:
        per_env = self.agents
        # partial: not whole envs (one agent an env: whole after all)
        return {"whole": plan.whole * per_env, "many": 256 * per_env, "zero": 0, "over": 65_537,
                "partial": plan.whole * per_env + 1 if per_env > 1 else plan.whole}[plan.envs]

    def hello(self, plan: HelloPlan, rng: np.random.Generator) -> tuple[pb.Hello, list[str]]:
        """The hello of ``plan`` and why it must be refused (empty: it must be welcomed)."""
        why = plan.invalid(self.agents, self.several)
        if plan.run == "ended" and len(self.ended_runs) < 2:
            why.remove("run ended")
        observation, action = space_to_proto(self.spec.observation), space_to_proto(self.spec.action)
        if plan.space:
            space = observation if plan.space == "observation" else action
            own = self.spec.observation if plan.space == "observation" else self.spec.action
            if not mutate_space(space, plan.mutation, plan.pick, own, self.variants, plan.space):
                mutate_space(space, "dtype", plan.pick, own, self.variants, plan.space)  # what it could not change
        run_id = self.run_id(plan, rng)
        if run_id in self.ended_runs and "run ended" not in why:
            why.append("run ended")  # an empty run id may have ended already
        if not why and plan.actor == "honest":  # a welcomed hello with its id would replace the honest actor
            plan = dataclasses.replace(plan, actor="fresh")
        hello = pb.Hello(protocol={"same": PROTOCOL, "old": 0, "future": PROTOCOL + 1}[plan.protocol],
                         actor_id=self.actor_id(plan, rng), run_id=run_id, num_envs=self.num_envs(plan),
                         env_id={"same": self.target.env, "other": "SomethingElse-v0", "long": "e" * 300}[plan.env_id],
                         observation_space=observation, action_space=action, role=plan.role,
                         agent_policies=self.mapping(plan.mapping))
        return hello, why

    def mapping(self, how: str) -> dict[str, str]:
        """The hello's agent -> policy mapping: the learner's, or changed by ``how`` (``HelloPlan.mapping``)."""
        ours = dict(self.spec.agent_policies)
        if how == "same":
            return ours
        if how == "none":
            return {}
        if not ours:  # a learner of one policy: any mapping is another one
            return {"agent_0": "policy"}
        agents = list(ours)
        if how == "swap":
            policies = [ours[agent] for agent in agents]
            return dict(zip(agents, policies[1:] + policies[:1]))
        if how == "drop":
            return {agent: ours[agent] for agent in agents[:-1]}
        if how == "extra":
            return {**ours, "stranger_0": ours[agents[0]]}
        return {**ours, agents[0]: "nobody"}


def mutate_space(space: pb.Space, how: str, pick: int, own: SpaceSpec, variants: list[tuple[str, EnvSpec]],
                 which: str) -> bool:
    """Change ``space`` (the proto of ``own``) in one place by ``how``; False where ``how`` cannot change it."""
    if how == "variant":
        changed = [v for _, spec in variants
                   if (v := getattr(spec, which)).mismatch(own) is not None]
        if not changed:
            return False
        space.CopyFrom(space_to_proto(changed[pick % len(changed)]))
        return True
    if how == "empty-tree":
        space.Clear()
        space.kind = pb.Space.TREE
        return True
    if how == "as-tree":
        if space.kind == pb.Space.TREE:
            return False
        inner = pb.Space()
        inner.CopyFrom(space)
        space.Clear()
        space.kind = pb.Space.TREE
        space.leaves.add(path="x", space=inner)
        return True
    tree = space.kind == pb.Space.TREE
    leaves = space.leaves
    if how in ("path", "drop-leaf", "extra-leaf", "swap-leaves", "nested", "duplicate-path"):
        if not tree or (how in ("swap-leaves", "duplicate-path") and len(leaves) < 2) or (
                how == "drop-leaf" and len(leaves) < 2):
            return False
        i = pick % len(leaves)
        if how == "path":
            leaves[i].path += "x"
        elif how == "drop-leaf":
            del leaves[i]
        elif how == "extra-leaf":
            leaves.add(path=leaves[i].path + "_extra", space=leaves[i].space)
        elif how == "swap-leaves":
            j = (i + 1) % len(leaves)
            a, b = pb.Leaf(), pb.Leaf()
            a.CopyFrom(leaves[i])
            b.CopyFrom(leaves[j])
            leaves[i].CopyFrom(b)
            leaves[j].CopyFrom(a)
        elif how == "nested":
            inner = pb.Space()
            inner.CopyFrom(leaves[i].space)
            leaves[i].space.Clear()
            leaves[i].space.kind = pb.Space.TREE
            leaves[i].space.leaves.add(path="inner", space=inner)
        else:
            leaves[i].path = leaves[(i + 1) % len(leaves)].path
        return True
    target = leaves[pick % len(leaves)].space if tree else space
    kind = target.kind
    if how == "dtype":
        target.dtype = {"float32": "float64", "int64": "int32", "int8": "uint8"}.get(target.dtype, "float32")
    elif how == "shape":
        if not target.shape or kind == pb.Space.DISCRETE:
            return False
        target.shape[0] += 1
        if kind == pb.Space.BOX:
            shape = tuple(target.shape)
            dtype = np.dtype(target.dtype)
            target.low.CopyFrom(encode(np.zeros(shape, dtype)))
            target.high.CopyFrom(encode(np.ones(shape, dtype)))
        if kind == pb.Space.MULTI_DISCRETE:
            target.nvec.append(2)
    elif how == "n":
        if kind == pb.Space.DISCRETE:
            target.n += 1
        elif kind == pb.Space.MULTI_DISCRETE:
            target.nvec[0] += 1
        else:
            return False
    elif how == "bounds":
        if kind != pb.Space.BOX:
            return False
        high = np.frombuffer(target.high.data, np.dtype(target.high.dtype)).copy()
        high.flat[0] = high.flat[0] + 1 if np.isfinite(high.flat[0]) else 0
        target.high.data = high.tobytes()
    elif how == "kind":
        target.kind = pb.Space.MULTI_BINARY if kind != pb.Space.MULTI_BINARY else pb.Space.BOX
    elif how == "unknown-kind":
        target.kind = 42
    elif how == "bad-dtype":
        target.dtype = "object"
    elif how == "negative-shape":
        target.shape.append(-1)
    elif how == "huge":
        del target.shape[:]
        target.shape.extend([1 << 20, 1 << 20])
    else:
        return False
    return True


def leaf_values(leaf: SpaceSpec, rows: int, rng: np.random.Generator) -> np.ndarray:
    """``rows`` values of ``leaf`` within its space."""
    dtype = np.dtype(leaf.dtype)
    if leaf.kind == "discrete":
        return rng.integers(0, leaf.n, rows).astype(dtype)
    if leaf.kind == "multi_discrete":
        top = np.asarray(leaf.nvec).reshape(leaf.shape)
        return (rng.random((rows, *leaf.shape)) * top).astype(np.int64).astype(dtype)
    if leaf.kind == "multi_binary":
        return rng.integers(0, 2, (rows, *leaf.shape)).astype(dtype)
    low = np.broadcast_to(np.clip(leaf.low, -1, 1), leaf.shape)
    high = np.broadcast_to(np.clip(leaf.high, -1, 1), leaf.shape)
    if dtype.kind in "iub":
        return rng.integers(np.ceil(low).astype(np.int64), np.floor(high).astype(np.int64) + 1,
                            (rows, *leaf.shape)).astype(dtype)
    return (low + rng.random((rows, *leaf.shape)) * (high - low)).astype(dtype)


def observations(spec: SpaceSpec, rows: int, rng: np.random.Generator) -> np.ndarray:
    """[rows] observations of ``spec`` within it, every action mask allowing something."""
    if not spec.tree:
        return leaf_values(spec, rows, rng)
    records = np.empty(rows, spec.array_dtype)
    for path, leaf in spec.leaves:
        records[path] = leaf_values(leaf, rows, rng)
    if spec.mask and rows:
        mask = records[spec.mask].reshape(rows, -1)
        start = 0
        for group in spec.mask_groups:
            mask[np.arange(rows), start + rng.integers(0, group, rows)] = 1
            start += group
        records[spec.mask] = mask.reshape(records[spec.mask].shape)
    return records


def float_paths(spec: SpaceSpec) -> list[str]:
    """The paths of the float leaves ("" for a flat float space)."""
    return [path for path, leaf in spec.leaf_specs() if leaf.kind == "box" and np.dtype(leaf.dtype).kind == "f"]


def categorical_paths(spec: SpaceSpec) -> list[str]:
    return [path for path, leaf in spec.leaf_specs() if leaf.kind in ("discrete", "multi_discrete", "multi_binary")]


def _field(obs: np.ndarray, path: str) -> np.ndarray:
    return obs[path] if path else obs


@dataclass
class Step:
    """One step's arrays (``step_to_proto``'s arguments) and, for shared memory, the counts its frame says."""

    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_index: np.ndarray
    final_obs: np.ndarray
    episode_return: np.ndarray
    episode_length: np.ndarray

    def arrays(self) -> tuple[np.ndarray, ...]:
        return (self.obs, self.reward, self.terminated, self.truncated, self.final_index, self.final_obs,
                self.episode_return, self.episode_length)


def make_step(plan: StepPlan, spec: SpaceSpec, k: int, salt: int = 0) -> Step:
    """The step of ``plan``: valid, or with its one mutation of the values (wire mutations are the driver's); its
    values drawn from (``salt``, ``plan.seed``)."""
    rng = np.random.default_rng([salt, plan.seed])
    obs = observations(spec, k, rng)
    ended = rng.random(k) < plan.done
    if plan.mutation == "all-done":
        ended[:] = True
    terminated = ended & (rng.random(k) < 0.5)
    truncated = ended & ~terminated
    if plan.mutation in ("final-extra", "final-missing", "final-duplicate", "final-unsorted", "final-nan",
                         "final-range") and k >= 2:
        truncated[:2], terminated[:2] = True, False  # two truncated slots to get wrong
    final_index = np.flatnonzero(truncated & ~terminated).astype(np.int64)
    e = int(ended.sum())
    episode_return = rng.normal(0, 5, e).astype(np.float64)
    episode_length = rng.integers(1, 50, e).astype(np.int64)
    step = Step(obs, rng.normal(0, 1, k).astype(np.float32), terminated, truncated, final_index,
                observations(spec, len(final_index), rng), episode_return, episode_length)
    if plan.invalid:
        for path in float_paths(spec):  # every float observation of a refused step: none may reach a batch
            _field(step.obs, path)[...] = SENTINEL
            if len(step.final_obs):
                _field(step.final_obs, path)[...] = SENTINEL
    _mutate_values(step, plan.mutation, spec, k, rng)
    return step


def _mutate_values(step: Step, how: str, spec: SpaceSpec, k: int, rng: np.random.Generator) -> None:
    floats, categorical = float_paths(spec), categorical_paths(spec)
    slot = int(rng.integers(k))
    if how in ("obs-range", "obs-negative"):
        if not categorical:  # no leaf with a range: a NaN instead
            how = "obs-nan"
        else:
            path = categorical[int(rng.integers(len(categorical)))]
            leaf = dict(spec.leaf_specs())[path]
            top = {"discrete": leaf.n, "multi_binary": 2}.get(leaf.kind) or max(leaf.nvec)
            value = -1 if how == "obs-negative" else int(rng.choice([top, top + 1, 99]))
            if np.dtype(leaf.dtype).kind == "u" and value < 0:
                value = top
            _poke(_field(step.obs, path), slot, value)
            return
    if how in ("obs-nan", "obs-inf", "obs-neginf", "obs-huge", "box-outside"):
        if not floats:  # a flat Discrete space has no float to poison: out of its range instead
            if how != "box-outside":
                _mutate_values(step, "obs-range", spec, k, rng)
            return
        value = {"obs-nan": np.nan, "obs-inf": np.inf, "obs-neginf": -np.inf, "obs-huge": 3e38,
                 "box-outside": 1e6}[how]
        _poke(_field(step.obs, floats[int(rng.integers(len(floats)))]), slot, value)
    elif how in ("reward-nan", "reward-inf", "reward-huge", "reward-large"):
        step.reward[slot] = {"reward-nan": np.nan, "reward-inf": np.inf, "reward-huge": 3e38,
                             "reward-large": 1e9}[how]
    elif how == "final-nan":
        if not floats or not len(step.final_index):
            step.reward[slot] = np.nan
        else:
            _poke(_field(step.final_obs, floats[0]), 0, np.nan)
    elif how in ("return-nan", "length-zero", "length-negative", "length-huge", "return-negative"):
        if not len(step.episode_return):
            step.terminated[slot] = True
            if step.truncated[slot]:  # it terminated instead: no final observation for it
                keep = step.final_index != slot
                step.final_index, step.final_obs = step.final_index[keep], step.final_obs[keep]
            step.episode_return, step.episode_length = np.zeros(1), np.ones(1, np.int64)
        if how == "return-nan":
            step.episode_return[0] = np.nan
        elif how == "return-negative":
            step.episode_return[0] = -1e9
        else:
            step.episode_length[0] = {"length-zero": 0, "length-negative": -5, "length-huge": 2**40}[how]
    elif how == "final-extra":  # a final observation for a slot that was not truncated
        others = [s for s in range(k) if s not in step.final_index]
        if others:
            step.final_index = np.sort(np.append(step.final_index, others[0])).astype(np.int64)
            step.final_obs = np.concatenate([step.final_obs, step.final_obs[:1] if len(step.final_obs)
                                             else observations(spec, 1, rng)])
        else:
            step.final_index, step.final_obs = step.final_index[1:], step.final_obs[1:]
    elif how == "final-missing":  # a truncated slot without its final observation
        if len(step.final_index):
            step.final_index, step.final_obs = step.final_index[1:], step.final_obs[1:]
        else:
            step.truncated[slot], step.terminated[slot] = True, False
    elif how == "final-range":
        if len(step.final_index):
            step.final_index[-1] = k
        else:
            step.final_index, step.final_obs = np.array([k], np.int64), observations(spec, 1, rng)
    elif how in ("final-duplicate", "final-unsorted"):
        if len(step.final_index) >= 2:
            step.final_index[[0, 1]] = ([step.final_index[0]] * 2 if how == "final-duplicate"
                                        else [step.final_index[1], step.final_index[0]])
        else:
            step.final_index, step.final_obs = np.array([k + 3], np.int64), observations(spec, 1, rng)
    elif how == "mask-none":
        if spec.mask:
            step.obs[spec.mask][slot] = 0
        else:
            step.reward[slot] = np.inf
    elif how == "flag-bytes":
        step.terminated = step.terminated.view(np.uint8) * np.uint8(7)  # any non-zero byte is true
        step.terminated = step.terminated.view(np.bool_)


def _poke(values: np.ndarray, row: int, value: float) -> None:
    """Set the first element of row ``row`` of ``values`` (a view: a field of records, or the array itself)."""
    values[(row,) + (0,) * (values.ndim - 1)] = value


def step_message(step: Step, how: str, spec: SpaceSpec, k: int) -> bytes:
    """A gRPC ActorMessage's bytes for ``step``, with a wire mutation ``how`` (``GRPC_MUTATIONS``)."""
    if how == "not-protobuf":
        return b"\xff\xff\xff\xff not a protobuf message"
    if how == "empty-message":
        return pb.ActorMessage().SerializeToString()
    arrays = list(step.arrays())
    if how == "obs-rows":
        arrays[0] = np.concatenate([arrays[0], arrays[0][:1]])
    elif how == "reward-dtype":
        arrays[1] = arrays[1].astype(np.float64)
    elif how == "flags-dtype":
        arrays[2] = arrays[2].astype(np.int8)
    elif how == "lengths-mismatch":
        arrays[7] = np.append(arrays[7], 3).astype(np.int64)
    elif how == "too-many-episodes":
        arrays[6], arrays[7] = np.zeros(k + 1), np.ones(k + 1, np.int64)
    msg = step_to_proto(*arrays)
    if how == "obs-dtype":
        tensor = msg.observation_leaves[0] if spec.tree else msg.observation
        tensor.dtype = "float64" if tensor.dtype != "float64" else "float32"
        tensor.data = tensor.data * 2 if tensor.dtype == "float64" else tensor.data[:len(tensor.data) // 2]
    elif how == "obs-shape":
        tensor = msg.observation_leaves[0] if spec.tree else msg.observation
        tensor.shape.append(1)
    elif how == "bytes-short":
        tensor = msg.observation_leaves[0] if spec.tree else msg.observation
        tensor.data = tensor.data[:-1]
    elif how == "leaf-count":
        if spec.tree:
            del msg.observation_leaves[-1]
        else:
            msg.observation_leaves.append(encode(np.zeros(k, np.float32)))
            msg.ClearField("observation")
    elif how == "flat-for-tree":
        if spec.tree:
            msg.observation.CopyFrom(encode(np.zeros(k, np.float32)))
            del msg.observation_leaves[:]
        else:
            msg.ClearField("observation")
    return pb.ActorMessage(step=msg).SerializeToString()


# ---- the wires ----

class Timeout(Exception):
    """No reply within ``PATIENCE_S``."""


class Refusal(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


class Ended(Exception):
    """The connection ended without a refusal: an OK end of stream (training over) or, over shared memory, a
    closed socket; ``named`` says whether that is a proper end."""

    def __init__(self, how: str, named: bool) -> None:
        super().__init__(how)
        self.named = named


class GrpcWire:
    """One raw stream to the learner: any bytes as the request, each reply waited for with a timeout."""

    def __init__(self, address: str, token: str) -> None:
        import grpc

        self._grpc = grpc
        self.channel = grpc.insecure_channel(address, options=[("grpc.max_send_message_length", 1 << 26),
                                                               ("grpc.max_receive_message_length", 1 << 26)])
        grpc.channel_ready_future(self.channel).result(timeout=60)
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        call = self.channel.stream_stream(METHOD, request_serializer=lambda b: b,
                                          response_deserializer=pb.LearnerMessage.FromString)
        self._call = call(iter(self._outbox.get, None), metadata=security.metadata(token))
        threading.Thread(target=self._receive, daemon=True).start()

    def _receive(self) -> None:
        try:
            for reply in self._call:
                self._inbox.put(reply)
            self._inbox.put(Ended("the stream ended with OK", named=True))
        except self._grpc.RpcError as err:
            code = err.code()
            self._inbox.put(Refusal(code.name if code is not None else "NONE", err.details() or ""))

    def send(self, data: bytes) -> None:
        self._outbox.put(data)

    def reply(self, patience: float = PATIENCE_S) -> pb.LearnerMessage:
        try:
            got = self._inbox.get(timeout=patience)
        except queue.Empty:
            raise Timeout() from None
        if isinstance(got, Exception):
            self._inbox.put(got)  # the end stays the end
            raise got
        return got

    def close(self) -> None:
        self._outbox.put(None)
        self._call.cancel()
        self.channel.close()


class ShmWire:
    """One raw connection to the same-host server: hello bytes in chunks, frames, replies with a timeout."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.settimeout(60)
        self.sock.connect(address[len(wire.SCHEME):])
        self.region: wire.Region | None = None
        self._ended: Exception | None = None

    def send(self, frame: bytes) -> None:
        try:
            self.sock.send(frame)
        except OSError:
            pass  # the learner closed it: the reply says why

    def send_hello(self, body: bytes) -> None:
        self.send(wire.HELLO.pack(wire.HELLO_MAGIC, len(body)))
        for start in range(0, len(body), wire.CHUNK):
            self.send(body[start:start + wire.CHUNK])

    def reply(self, patience: float = PATIENCE_S) -> tuple[int, int, bytes, list[int]]:
        if self._ended is not None:
            raise self._ended
        self.sock.settimeout(patience)
        try:
            frame, fds, _, _ = socket.recv_fds(self.sock, wire.MAX_REPLY, 1)
        except TimeoutError:
            raise Timeout() from None
        except OSError as err:
            frame, fds = b"", []
            how = f"the socket failed ({err})"
        else:
            how = "the learner closed the connection without a REFUSED frame"
        if not frame:
            self._ended = Ended(how, named=False)
            raise self._ended
        kind, version = wire.REPLY.unpack_from(frame)
        if kind == wire.REFUSED:
            for fd in fds:
                os.close(fd)
            self._ended = Refusal(*wire.parse_refusal(frame[wire.REPLY.size:]))
            raise self._ended
        if kind == wire.OVER:
            self._ended = Ended("training is over", named=True)
            raise self._ended
        return kind, version, frame[wire.REPLY.size:], fds

    def close(self) -> None:
        if self.region is not None:
            self.region.close()
        self.sock.close()


def write_step(region: wire.Region, step: Step, how: str, k: int) -> bytes:
    """Write ``step`` into the region as the actor does; the STEP frame to send, with a wire mutation ``how``
    (``SHM_MUTATIONS``)."""
    m, e = min(len(step.final_index), k), min(len(step.episode_return), k)
    for views, value in ((region.leaves("obs"), step.obs),
                         ([v[:m] for v in region.leaves("final_obs")], step.final_obs[:m])):
        if value.dtype.names:
            for view, leaf in zip(views, value.dtype.names):
                view[...] = value[leaf]
        else:
            views[0][...] = value
    region.reward[...] = step.reward
    region.terminated.view(np.uint8)[...] = step.terminated.view(np.uint8)
    region.truncated[...] = step.truncated
    region.final_index[:m] = np.clip(step.final_index[:m], -2**62, 2**62)
    region.episode_return[:e] = step.episode_return[:e]
    region.episode_length[:e] = step.episode_length[:e]
    if how == "frame-m":
        m = k + 1
    elif how == "frame-e":
        e = k + 1
    frame = wire.STEP.pack(0x12345678 if how == "frame-kind" else wire.STEP_KIND, m, e)
    return {"frame-short": frame[:8], "frame-long": frame + b"\0"}.get(how, frame)


# ---- one example ----

@dataclass
class Outcome:
    session: str  # Session.describe()
    result: str  # welcomed (no step), answered (every step), refused, held (left while held), closed, over, dropped
    code: str = ""  # the refusal's status
    at: str = ""  # where: hello, step N, ...
    findings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    answers: int = 0  # steps answered with actions


def drive(session: Session, fuzzing: Fuzzing, learner: FuzzedLearner) -> Outcome:
    """Run one client conversation against ``learner``; the outcome and what in it breaks the property."""
    started, mark = time.monotonic(), len(learner.lines)
    salt = zlib.crc32(session.describe().encode())
    outcome = Outcome(session.describe(), "closed")
    conversation = _Conversation(session, fuzzing, learner, np.random.default_rng(salt), outcome)
    try:
        conversation.run()
    except Exception as err:  # the driver's own failure is a finding too: it must be looked at
        outcome.findings.append(f"the client driver raised {type(err).__name__}: {err}")
    finally:
        conversation.close()
    time.sleep(0.05)  # what the learner logs about this conversation's end
    if learner.failed(mark) or outcome.code == "INTERNAL":  # it stops: wait for its exit code
        with contextlib.suppress(subprocess.TimeoutExpired):
            learner.proc.wait(timeout=60)
    if not learner.alive():
        with contextlib.suppress(subprocess.TimeoutExpired):
            learner.proc.wait(timeout=10)
        outcome.findings.append(f"the learner exited with code {learner.proc.returncode}:\n{learner.log(mark, 25)}")
    said = "".join(learner.lines[mark:])
    for clue in ("the learner failed", "Traceback"):
        if clue in said:
            at = said.index(clue)
            outcome.findings.append(f"the learner logged {clue!r}:\n{said[max(0, at - 400):at + 2500]}")
            break
    if learner.alive() and not learner.actor_alive():
        learner.actor.wait()
        outcome.findings.append(f"the honest actor exited with code {learner.actor.returncode}:\n"
                                + "".join(learner.actor_lines[-10:]))
    outcome.seconds = round(time.monotonic() - started, 2)
    return outcome


class _Conversation:
    def __init__(self, session: Session, fuzzing: Fuzzing, learner: FuzzedLearner, rng: np.random.Generator,
                 outcome: Outcome) -> None:
        self.session, self.fuzzing, self.learner, self.rng, self.outcome = session, fuzzing, learner, rng, outcome
        self.wires: list[GrpcWire | ShmWire] = []
        self.salt = int(rng.integers(2**31))

    def close(self) -> None:
        for w in self.wires:
            with contextlib.suppress(Exception):
                w.close()

    def open(self) -> GrpcWire | ShmWire:
        learner = self.learner
        w = (GrpcWire(learner.address, learner.token) if self.session.transport == "grpc"
             else ShmWire(learner.local_address))
        self.wires.append(w)
        return w

    def refused(self, err: Refusal, at: str, expected: bool) -> None:
        self.outcome.result, self.outcome.code, self.outcome.at = "refused", err.code, at
        if err.code not in NAMED:
            self.outcome.findings.append(f"{at}: refused with status {err.code}, which names no cause of the "
                                         f"client's: {err.message[:3000]}")
        elif not expected:
            self.outcome.findings.append(f"{at}: a valid message was refused: {err.code} {err.message[:1000]}")

    def ended(self, err: Ended, at: str, expected: bool) -> None:
        self.outcome.result, self.outcome.at = ("over" if err.named else "dropped"), at
        if not err.named:
            self.outcome.findings.append(f"{at}: {err} (expected {'a refusal' if expected else 'an answer'})")

    def run(self) -> None:
        session, fuzzing = self.session, self.fuzzing
        if session.opening == "nothing":
            self.open()
            time.sleep(0.02)
            return
        w = self.open()
        hello, why = fuzzing.hello(session.hello, self.rng)
        if session.opening != "hello":
            self.open_badly(w, hello)
            return
        k = hello.num_envs
        if hello.actor_id != HONEST_ID:  # welcomed or not: a later hello may reuse it
            fuzzing.used_ids.append(hello.actor_id)
        if not self.say_hello(w, hello, why, "hello"):
            if session.ending == "retry" and hello.actor_id != HONEST_ID:
                self.retry(hello)
            return
        welcomed_run = hello.run_id
        try:
            self.steps(w, hello, k)
            if session.ending == "replace-same" and self.outcome.result in ("welcomed", "answered"):
                self.replace(w, hello)
            elif session.ending == "replace-honest":
                second, second_why = fuzzing.hello(session.second, self.rng)
                other = self.open()
                if self.say_hello(other, second, second_why, "second connection's hello"):
                    return
            elif session.ending == "silent":
                time.sleep(0.2)
            elif session.ending == "held" and self.outcome.result in ("welcomed", "answered"):
                self.hold(w, k)
        finally:
            fuzzing.ended_runs.append(welcomed_run)

    def open_badly(self, w: GrpcWire | ShmWire, hello: pb.Hello) -> None:
        """Begin with something other than a whole hello (``OPENINGS``): it must be refused, or left by the client."""
        how, body = self.session.opening, hello.SerializeToString()
        if how == "half-hello" and isinstance(w, ShmWire):
            w.send(wire.HELLO.pack(wire.HELLO_MAGIC, len(body)))
            w.send(body[:len(body) // 2])
            time.sleep(0.05)  # the learner reads it, then the client leaves
            return
        if isinstance(w, GrpcWire):
            spec = self.fuzzing.spec.observation
            w.send({"step-first": step_message(make_step(StepPlan(), spec, 1), "", spec, 1),
                    "half-hello": pb.ActorMessage(hello=hello).SerializeToString()[:len(body) // 2],
                    "huge-hello": pb.ActorMessage(hello=pb.Hello(run_id="r" * (65 << 20))).SerializeToString(),
                    }.get(how, b"\x00\x01 not a message"))
        elif how == "long-chunk":
            w.send(wire.HELLO.pack(wire.HELLO_MAGIC, 10))
            w.send(body[:20] + b"\0" * 20)
        elif how == "huge-hello":
            w.send(wire.HELLO.pack(wire.HELLO_MAGIC, 2**31))
        else:
            w.send(wire.STEP.pack(wire.STEP_KIND, 0, 0) if how == "step-first" else b"\x00\x01 not a message")
        self.expect_refusal(w, f"a first message that is no hello ({how})")

    def say_hello(self, w: GrpcWire | ShmWire, hello: pb.Hello, why: list[str], at: str) -> bool:
        """Send ``hello``; whether it was welcomed (findings where that contradicts ``why``)."""
        if isinstance(w, GrpcWire):
            w.send(pb.ActorMessage(hello=hello).SerializeToString())
        else:
            w.send_hello(hello.SerializeToString())
        try:
            if isinstance(w, GrpcWire):
                reply = w.reply(60)
                if reply.WhichOneof("kind") != "welcome":
                    self.outcome.findings.append(f"{at}: answered with {reply.WhichOneof('kind')}, not a welcome")
                    return False
            else:
                kind, _, _, fds = w.reply(60)
                if kind != wire.WELCOME or len(fds) != 1:
                    self.outcome.findings.append(f"{at}: answered with kind {kind} and {len(fds)} descriptors")
                    for fd in fds:
                        os.close(fd)
                    return False
                try:
                    from lockstep.transport.messages import space_from_proto

                    layout = wire.Layout(hello.num_envs, space_from_proto(hello.observation_space, "observation"),
                                         space_from_proto(hello.action_space, "action"))
                    w.region = wire.Region(fds[0], layout)
                finally:
                    os.close(fds[0])
        except Refusal as err:
            self.refused(err, at, expected=bool(why))
            return False
        except Ended as err:
            self.ended(err, at, expected=bool(why))
            return False
        except Timeout:
            self.outcome.findings.append(f"{at}: no answer to the hello within 60 s")
            return False
        if why:
            self.outcome.findings.append(f"{at}: welcomed, though it must be refused ({', '.join(why)})")
        self.outcome.result, self.outcome.at = "welcomed", at
        return True

    def expect_refusal(self, w: GrpcWire | ShmWire, at: str) -> None:
        try:
            w.reply(60)
            self.outcome.findings.append(f"{at}: answered, though it must be refused")
        except Refusal as err:
            self.refused(err, at, expected=True)
        except Ended as err:
            self.ended(err, at, expected=True)
        except Timeout:
            self.outcome.findings.append(f"{at}: neither answered nor refused within 60 s")

    def send_step(self, w: GrpcWire | ShmWire, plan: StepPlan, k: int) -> None:
        spec = self.fuzzing.spec.observation
        if plan.mutation == "hello-again":
            hello = self.fuzzing.hello(HelloPlan(), self.rng)[0]
            if isinstance(w, GrpcWire):
                w.send(pb.ActorMessage(hello=hello).SerializeToString())
            else:
                w.send_hello(hello.SerializeToString())
            return
        step = make_step(plan, spec, k, self.salt)
        if isinstance(w, GrpcWire):
            w.send(step_message(step, plan.mutation, spec, k))
        else:
            w.send(write_step(w.region, step, plan.mutation, k))

    def steps(self, w: GrpcWire | ShmWire, hello: pb.Hello, k: int) -> None:
        for i, plan in enumerate(self.session.steps):
            at = f"step {i} ({plan.mutation or 'valid'})"
            self.send_step(w, plan, k)
            try:
                w.reply(PATIENCE_S if not plan.invalid else 60)
            except Timeout:
                if plan.invalid:
                    self.outcome.findings.append(f"{at}: neither answered nor refused within 60 s")
                self.outcome.result, self.outcome.at = "held", at
                return
            except Refusal as err:
                self.refused(err, at, expected=plan.invalid)
                return
            except Ended as err:
                self.ended(err, at, expected=plan.invalid)
                return
            if plan.invalid:
                self.outcome.findings.append(f"{at}: answered, though it must be refused")
                return
            self.outcome.result, self.outcome.at = "answered", at
            self.outcome.answers += 1

    def hold(self, w: GrpcWire | ShmWire, k: int) -> None:
        """Step validly until a request is held (its unroll is complete), then leave while it is."""
        for i in range(T + 2):
            self.send_step(w, StepPlan(seed=int(self.rng.integers(2**31)), done=0.2), k)
            try:
                w.reply()
                self.outcome.answers += 1
            except Timeout:
                self.outcome.result, self.outcome.at = "held", f"held at step {i}"
                return
            except Refusal as err:
                self.refused(err, f"held step {i}", expected=False)
                return
            except Ended as err:
                self.ended(err, f"held step {i}", expected=False)
                return

    def retry(self, refused: pb.Hello) -> None:
        """Say hello again, validly, with the refused hello's actor id: welcomed, whatever the first left behind."""
        again, _ = self.fuzzing.hello(HelloPlan(whole=1), self.rng)
        again.actor_id = refused.actor_id
        w = self.open()
        if self.say_hello(w, again, [], "the retried hello"):
            self.fuzzing.ended_runs.append(again.run_id)
            self.outcome.result = "retried"

    def replace(self, w: GrpcWire | ShmWire, hello: pb.Hello) -> None:
        """A second connection with the same actor id: welcomed; the first is then refused as replaced."""
        again = pb.Hello()
        again.CopyFrom(hello)
        again.run_id = uuid.uuid4().hex
        other = self.open()
        if not self.say_hello(other, again, [], "the same id's second hello"):
            return
        self.fuzzing.ended_runs.append(again.run_id)
        self.send_step(w, StepPlan(seed=1), hello.num_envs)
        try:
            w.reply(60)
            self.outcome.findings.append("a replaced connection's step was answered")
        except Refusal as err:
            self.refused(err, "the replaced connection's step", expected=True)
            if err.code != "FAILED_PRECONDITION" or "replaced" not in err.message:
                self.outcome.findings.append(f"the replaced connection was refused with {err.code} {err.message}, "
                                             "not as replaced")
        except Ended as err:
            self.ended(err, "the replaced connection's step", expected=True)
        except Timeout:
            self.outcome.findings.append("the replaced connection's step: no answer within 60 s")


# ---- a target's examples ----

@dataclass
class TargetReport:
    target: str
    examples: int = 0
    outcomes: list[Outcome] = field(default_factory=list)
    findings: list[dict[str, str]] = field(default_factory=list)  # {"session": ..., "finding": ...}
    rows_before: int = 0
    rows_after: int = 0
    rss_warm_mb: float = 0.0
    rss_end_mb: float = 0.0
    learner_starts: int = 0
    exit_code: int | None = None
    seconds: dict[str, float] = field(default_factory=dict)  # start, examples, audit
    rss_trace_mb: list[float] = field(default_factory=list)  # every RSS_EVERY examples

    def add_finding(self, finding: str, session: str = "") -> None:
        self.findings.append({"session": session, "finding": finding})


def run_target(target: Target, examples: int, folder: Path, seed: int = 0, rss_bound_mb: float = 100.0,
               audit_batches: int | None = None, log=print) -> TargetReport:
    """``examples`` sessions drawn from ``seed`` against a learner of ``target``; then the run's checks
    (``check_trail``: ``audit_batches`` of each run's batches audited, None: every one)."""
    fuzzing = Fuzzing(target)
    learner = FuzzedLearner(target, folder)
    report = TargetReport(target.name)
    clock = time.monotonic()
    try:
        learner.start()
        report.seconds["start"] = round(time.monotonic() - clock, 1)
        report.rows_before = learner.rows()
        warm_at = max(1, examples // 4)
        tried: set[tuple] = set()

        @hypothesis.settings(max_examples=examples, database=None, deadline=None,
                             phases=[hypothesis.Phase.generate], suppress_health_check=list(hypothesis.HealthCheck))
        @hypothesis.given(session=sessions())
        def one(session: Session) -> None:
            hypothesis.assume(session.shape() not in tried)  # another conversation, not the same one's values
            tried.add(session.shape())
            if not learner.alive() or not learner.actor_alive() or learner.failed():  # a finding ended it: anew
                report.rows_after += learner.rows()
                learner.stop()
                check_trail(learner.run_dir, fuzzing.spec, report, audit_batches)
                learner.start()
                fuzzing.ended_runs.clear()  # a new learner: no run id has ended on it
                report.rows_before += learner.rows()
            outcome = drive(session, fuzzing, learner)
            report.outcomes.append(outcome)
            for finding in outcome.findings:
                report.add_finding(finding, outcome.session)
            if len(report.outcomes) == warm_at:
                report.rss_warm_mb = learner.rss_mb()
            if len(report.outcomes) % RSS_EVERY == 0 and learner.alive():
                report.rss_trace_mb.append(round(learner.rss_mb(), 1))
            log(f"[{target.name} {len(report.outcomes)}/{examples}] {outcome.result} {outcome.code} {outcome.at} "
                f"({outcome.seconds:g} s)" + "".join(f"\n  FINDING {f.splitlines()[0][:300]}\n  {outcome.session}"
                                                     for f in outcome.findings))

        clock = time.monotonic()
        hypothesis.seed(seed)(one)()
        report.seconds["examples"] = round(time.monotonic() - clock, 1)
        report.examples = len(report.outcomes)
        clock = time.monotonic()
        if learner.alive():
            report.rss_end_mb = learner.rss_mb()
            grown = report.rss_end_mb - report.rss_warm_mb
            if report.rss_warm_mb and grown > rss_bound_mb:
                report.add_finding(f"the learner's RSS grew by {grown:.0f} MB from example {warm_at} to the end "
                                   f"({report.rss_warm_mb:.0f} -> {report.rss_end_mb:.0f} MB; bound {rss_bound_mb:g})")
            # the honest actor trained on: at least one more iteration once the examples are done
            if not learner.wait_rows(learner.rows() + 1, timeout=120):
                report.add_finding("the honest actor's iterations stopped rising:\n" + learner.log(tail=20))
        report.seconds["last_row"] = round(time.monotonic() - clock, 1)
        report.rows_after += learner.rows()
        if report.rows_after <= report.rows_before:
            report.add_finding(f"no iteration while the examples ran ({report.rows_before} rows before, "
                               f"{report.rows_after} after)")
    finally:
        report.learner_starts = learner.starts
        clock = time.monotonic()
        report.exit_code = learner.stop()
        report.seconds["stop"] = round(time.monotonic() - clock, 1)
    if report.exit_code not in (0, 128 + signal.SIGTERM, None) and not any(
            "exited" in f["finding"] for f in report.findings):
        report.add_finding(f"the learner ended with exit code {report.exit_code}:\n{learner.log(tail=30)}")
    clock = time.monotonic()
    check_trail(learner.run_dir, fuzzing.spec, report, audit_batches)
    report.seconds["audit"] = round(time.monotonic() - clock, 1)
    return report


def check_trail(run_dir: Path, spec: EnvSpec, report: TargetReport, audit_batches: int | None = None) -> None:
    """``lockstep audit`` passes on the run (on ``audit_batches`` of its batches, spread over the run, with the
    policy versions they name; None: on every one); no batch holds ``SENTINEL`` or a discrete observation outside
    its space."""
    from lockstep.tools import audit

    with tempfile.TemporaryDirectory(prefix="lockstep-fuzz-audit-") as tmp:
        audited = run_dir if audit_batches is None else sampled_trail(run_dir, audit_batches, Path(tmp) / "run")
        try:
            for policy in audit.policies_of(audited):
                checked = audit.check(audited, policy=policy)
                if checked.exit_code != 0:
                    report.add_finding(f"lockstep audit {run_dir} (policy {policy}): "
                                       + audit.format_report(checked)[-1500:])
        except audit.AuditError as err:  # no trail, or none it can read: a finding, and the other targets still run
            report.add_finding(f"lockstep audit {run_dir}: {err}")
    batches = sorted((run_dir / "audit").rglob("batch_*.npz"))
    if not batches:
        report.add_finding(f"no audit batch in {run_dir / 'audit'}")
    ranges = {f"obs/{path}" if path else "obs": leaf for path, leaf in spec.observation.leaf_specs()}
    for path in batches:
        with np.load(path) as batch:
            for name in batch.files:
                if not name.startswith("obs"):
                    continue
                values = batch[name]
                if values.dtype.kind == "f" and (values == SENTINEL).any():
                    report.add_finding(f"{path.name} {name}: holds the sentinel {SENTINEL} of a refused step")
                leaf = ranges.get(name) or ranges.get(_unprefixed(name, ranges))
                if leaf is not None and leaf.kind in ("discrete", "multi_binary") and values.size:
                    top = leaf.n if leaf.kind == "discrete" else 2
                    if values.min() < 0 or values.max() >= top:
                        report.add_finding(f"{path.name} {name}: values outside {leaf.describe()}")


def sampled_trail(run_dir: Path, batches: int, into: Path) -> Path:
    """A copy of ``run_dir``'s audit trail (``into``) with ``batches`` of each trail's batches, evenly spread from
    the first to the last, and the policy versions stamped on them: what ``lockstep audit`` checks in less time."""
    source = run_dir / "audit"
    for trail in [source, *sorted(p for p in (source / "policies").glob("*") if p.is_dir())]:
        copy = into / trail.relative_to(run_dir)
        copy.mkdir(parents=True, exist_ok=True)
        for name in ("config.yaml", "README.md"):
            if (trail / name).exists():
                shutil.copy(trail / name, copy / name)
        written = sorted(trail.glob("batch_*.npz"))
        picks = sorted({round(i) for i in np.linspace(0, len(written) - 1, min(batches, len(written)))})
        for path in (written[i] for i in picks):
            shutil.copy(path, copy / path.name)
            with np.load(path) as batch:
                versions = {int(v) for v in np.unique(batch["versions"])}
            for version in versions:
                policy = trail / f"policy_v{version:06d}.pt"
                if policy.exists():
                    shutil.copy(policy, copy / policy.name)
    if (run_dir / "summary.json").exists():
        shutil.copy(run_dir / "summary.json", into / "summary.json")
    return into


def _unprefixed(name: str, ranges: dict[str, SpaceSpec]) -> str:
    """A policy's batch names its leaves without the policy's prefix (``obs/observation`` for the slot's
    ``obs/scouts.observation``)."""
    leaf = name.removeprefix("obs/")
    return next((key for key in ranges if key.endswith("." + leaf)), name)


# ---- the benchmark ----

def run(examples: int, out: Path, seed: int = 0, targets: list[str] | None = None,
        rss_bound_mb: float = 100.0, audit_batches: int | None = None) -> dict[str, Any]:
    """``examples`` sessions per target; writes ``out/fuzz.json`` and ``out/fuzz.md`` and returns the report."""
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    reports = [run_target(TARGETS[name], examples, out / "runs" / name, seed, rss_bound_mb, audit_batches)
               for name in (targets or list(TARGETS))]
    outcomes = [o for r in reports for o in r.outcomes]
    report = {
        "examples": len(outcomes), "seed": seed, "elapsed_s": round(time.monotonic() - started, 1),
        "by_outcome": dict(Counter(o.result for o in outcomes)),
        "refusals_by_code": dict(Counter(o.code for o in outcomes if o.result == "refused")),
        "findings": [{"target": r.target, **f} for r in reports for f in r.findings],
        "targets": [{"target": r.target, "examples": r.examples, "learner_starts": r.learner_starts,
                     "iterations_during": r.rows_after - r.rows_before, "rss_warm_mb": round(r.rss_warm_mb, 1),
                     "rss_end_mb": round(r.rss_end_mb, 1), "exit_code": r.exit_code,
                     "by_outcome": dict(Counter(o.result for o in r.outcomes)),
                     "findings": len(r.findings), "seconds": r.seconds, "rss_trace_mb": r.rss_trace_mb}
                    for r in reports],
        "outcomes": [{"target": r.target, **dataclasses.asdict(o)} for r in reports for o in r.outcomes],
    }
    atomic_write(out / "fuzz.json", json.dumps(report, indent=1))
    atomic_write(out / "fuzz.md", format_report(report, examples))
    return report


def format_report(report: dict[str, Any], examples: int) -> str:
    counts = ", ".join(f"{n} {k}" for k, n in sorted(report["by_outcome"].items()))
    codes = ", ".join(f"{n} {k}" for k, n in sorted(report["refusals_by_code"].items()))
    lines = [f"# lockstep bench fuzz --examples {examples} --seed {report['seed']}", "",
             f"{report['examples']} examples in {report['elapsed_s']:g} s: {counts}.", "",
             f"Refusals by status: {codes or 'none'}.", "",
             "| target | examples | learner starts | iterations during | RSS after warm-up (MB) | RSS at end (MB) "
             "| exit code | findings |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {t['target']} | {t['examples']} | {t['learner_starts']} | {t['iterations_during']} | "
              f"{t['rss_warm_mb']} | {t['rss_end_mb']} | {t['exit_code']} | {t['findings']} |"
              for t in report["targets"]]
    lines += ["", f"## Findings ({len(report['findings'])})", ""]
    for f in report["findings"]:
        lines += [f"- {f['target']}: {f['finding'].splitlines()[0]}", *(
            [f"  `{f['session']}`"] if f["session"] else []), "", "  ```",
            *("  " + line for line in f["finding"].splitlines()[1:][-12:]), "  ```", ""]
    return "\n".join(lines) + "\n"
