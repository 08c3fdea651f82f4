"""``lockstep bench soak``: train while killing actors (and once the learner), then check the books.

Runs ``lockstep train`` as a child process with a checkpoint every iteration,
sends SIGKILL to a random actor process on a schedule, kills the learner once
half-way and resumes it with ``--resume``, and reports:

    deadlocks              times training made no progress for ``deadlock_s`` while running
    off_policy_samples     over every metrics.csv row
    transitions_*          collected = trained + dropped, from the final summary (a resumed run
                           continues the books from its checkpoint)
    actor_restarts         restarts by the train command's supervisor, both runs
    learner_restarts       1 (the resume)
    final_return           mean return of the last 100 episodes
    rogue                  with ``--rogue N``: N hostile clients beside the fleet, each round one of: a silent
                           member (hello over the unix socket, then nothing), absurd hellos (over gRPC with
                           the run's token and over the unix socket), a hello stealing actor 0's id without
                           the token, idle connections; per kind, how often it was tried, refused as it must
                           be, and how often it was not (``unexpected``: a problem)
    learner_rss_mb, learner_open_files
                           the learner process's resident memory and open file descriptors at the first
                           iteration and at the last sample before it ended
    exit_code, error       the resumed ``lockstep train``'s exit code, and the error in its summary.json
    problems, healthy      what makes the soak unhealthy (``problems``), and whether anything does
"""

from __future__ import annotations

import json
import os
import random
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lockstep.common.files import atomic_write
from lockstep.config import Config
from lockstep.config import save as save_config
from lockstep.observe.run_dir import RunDir
from lockstep_bench import runs


@dataclass
class SoakOptions:
    minutes: float = 3.0
    kill_every_s: float = 12.0
    deadlock_s: float = 30.0
    seed: int = 1
    actors: int = 4
    envs_per_actor: int = 4
    rogue: int = 0  # hostile clients beside the fleet (module docstring)


def actor_pids(parent: int) -> list[int]:
    """Actor processes that `lockstep train` (pid ``parent``) spawned, not multiprocessing's resource tracker."""
    out = subprocess.run(["ps", "-ww", "-o", "pid=,args=", "--ppid", str(parent)], capture_output=True, text=True,
                         check=False).stdout
    return [int(line.split()[0]) for line in out.splitlines() if "spawn_main" in line]


class _Run:
    """One `lockstep train` child, watched for progress."""

    def __init__(self, args: list[str], log_path: Path) -> None:
        self.log = log_path.open("a")
        self.proc = runs.start(args, self.log)

    def alive(self) -> bool:
        return self.proc.poll() is None


def learner_resources(pid: int) -> tuple[float, int] | None:
    """The process's resident memory (MB) and open file descriptors, from /proc; None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024, len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, AttributeError):
        return None


ROGUE_KINDS = ("silent", "absurd", "steal", "idle")
_LISTENING = re.compile(r"learner listening on port (\d+) and (unix:[^\s,]+)?")


@dataclass
class Rogues:
    """``count`` hostile clients against whichever learner the soak's log says listens now (one thread)."""

    count: int
    log_path: Path
    token: str
    tally: dict[str, dict[str, int]] = field(default_factory=lambda: {
        kind: {"tried": 0, "refused": 0, "unexpected": 0} for kind in ROGUE_KINDS})
    notes: list[str] = field(default_factory=list)  # the first few unexpected outcomes, for the report

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="soak-rogues", daemon=True)
        self._held: list[Any] = []  # open silent members and idle connections, closed a few rounds later

    def start(self) -> None:
        if self.count:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=60)
        self._release(keep=0)

    def _loop(self) -> None:
        rng, round_ = random.Random(7), 0
        while not self._stop.wait(1.0):
            where = self._learner()
            if where is None:
                continue
            for kind in self._kinds(round_):
                try:
                    getattr(self, f"_{kind}")(*where, rng)
                except Exception as err:  # the learner restarting under us: not the learner's fault
                    self.tally[kind]["tried"] -= 1
                    if not isinstance(err, (ConnectionError, OSError)):
                        self._unexpected(kind, f"{type(err).__name__}: {err}")
            round_ += 1
            self._release(keep=4 * self.count)

    def _kinds(self, round_: int) -> list[str]:
        """What the ``count`` clients try this round: first the kinds not yet tried (or whose every try met a
        learner that was restarting), so that a short soak tries each kind as early as it can, then the
        rotation."""
        untried = [kind for kind in ROGUE_KINDS if self.tally[kind]["tried"] <= 0]
        rotation = [ROGUE_KINDS[(round_ + i) % len(ROGUE_KINDS)] for i in range(self.count)]
        return (untried + rotation)[:self.count]

    def _learner(self) -> tuple[str, str | None] | None:
        try:
            found = _LISTENING.findall(self.log_path.read_text(errors="replace"))
        except OSError:
            return None
        return (f"127.0.0.1:{found[-1][0]}", found[-1][1] or None) if found else None

    def _unexpected(self, kind: str, what: str) -> None:
        self.tally[kind]["unexpected"] += 1
        if len(self.notes) < 10:
            self.notes.append(f"{kind}: {what}")

    def _expect(self, kind: str, connect, code: str) -> None:
        """``connect()`` must be refused with ``code``."""
        from lockstep.transport.grpc.client import LearnerRefused

        self.tally[kind]["tried"] += 1
        try:
            connect().close()
        except LearnerRefused as err:
            if err.code == code:
                self.tally[kind]["refused"] += 1
            else:
                self._unexpected(kind, f"refused with {err.code}, not {code}: {err.message[:200]}")
            return
        self._unexpected(kind, "welcomed")

    def _silent(self, address: str, local: str | None, rng: random.Random) -> None:
        """A member that says hello and then never steps (over the unix socket: no token needed there)."""
        from lockstep.transport.shm.client import LocalConnection

        if local is None:
            return
        self.tally["silent"]["tried"] += 1
        self._held.append(LocalConnection(local, _hello(1000 + rng.randrange(1000)), connect_timeout=10))

    def _absurd(self, address: str, local: str | None, rng: random.Random) -> None:
        from lockstep.transport.grpc.client import Connection
        from lockstep.transport.shm.client import LocalConnection

        message = _hello(2000 + rng.randrange(1000))
        if rng.random() < 0.5:
            message.num_envs = 2**31 - 1
        else:
            message.run_id = "r" * 4_000_000
        self._expect("absurd", lambda: Connection.open(address, message, connect_timeout=10, token=self.token),
                     "INVALID_ARGUMENT")
        if local is not None:
            self._expect("absurd", lambda: LocalConnection(local, message, connect_timeout=10), "INVALID_ARGUMENT")

    def _steal(self, address: str, local: str | None, rng: random.Random) -> None:
        from lockstep.transport.grpc.client import Connection

        self._expect("steal", lambda: Connection.open(address, _hello(0), connect_timeout=10, token=None),
                     "UNAUTHENTICATED")

    def _idle(self, address: str, local: str | None, rng: random.Random) -> None:
        """A TCP connection to the gRPC port that never speaks, and one to the unix socket."""
        self.tally["idle"]["tried"] += 1
        host, port = address.rsplit(":", 1)
        self._held.append(socket.create_connection((host, int(port)), timeout=10))
        if local is not None:
            unix = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            unix.connect(local[len("unix:"):])
            self._held.append(unix)

    def _release(self, keep: int) -> None:
        while len(self._held) > keep:
            held = self._held.pop(0)
            try:
                held.close()
            except Exception:
                pass


def _hello(actor_id: int):
    """An honest CartPole actor's hello (the rogues change what they need)."""
    import uuid

    from lockstep.envs import env_spec
    from lockstep.transport import PROTOCOL
    from lockstep.transport import lockstep_pb2 as pb
    from lockstep.transport.messages import space_to_proto

    spec = env_spec("CartPole-v1")
    return pb.Hello(protocol=PROTOCOL, actor_id=actor_id, run_id=uuid.uuid4().hex, num_envs=1, env_id=spec.env_id,
                    observation_space=space_to_proto(spec.observation), action_space=space_to_proto(spec.action))


def run(opts: SoakOptions, out: Path) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    run_dir = out / "run"
    config = Config()
    config.actors.count, config.actors.envs_per_actor = opts.actors, opts.envs_per_actor
    # every kill may land on the same actor: enough restarts that no actor runs out of them (a fleet that
    # is gone for good cannot make progress, which would read as a deadlock)
    config.actors.restarts = int(opts.minutes * 60 / opts.kill_every_s) + 10
    config.ppo.steps_per_env = 64
    config.ppo.total_steps = 10**9
    config.ppo.lr = 1e-3
    config.run.seed = opts.seed
    config.run.checkpoint_every = 1
    config.run.time_limit_s = opts.minutes * 60
    config.run.thresholds = [195.0, 475.0]
    config_path = out / "soak.yaml"
    save_config(config, config_path)
    rng = random.Random(opts.seed)
    log_path = out / "soak.log"
    if log_path.exists():
        log_path.unlink()

    deadlocks = actor_kills = 0
    learner_killed = False
    # the run's token, known here so that the absurd hellos get past it (the id stealers go without)
    token = os.environ.setdefault("LOCKSTEP_TOKEN", secrets.token_urlsafe(32))
    rogues = Rogues(opts.rogue, log_path, token)
    resources: dict[str, tuple[float, int]] = {}  # "start": at the first iteration; "end": the last sample
    current = _Run(["--config", str(config_path), "--run-dir", str(run_dir)], log_path)
    rogues.start()
    start = time.monotonic()
    next_kill = start + opts.kill_every_s
    last_rows, last_progress = 0, time.monotonic()
    budget = opts.minutes * 60 * 2 + 120  # generous: start-up, the resume, and the final phase
    while current.alive() and time.monotonic() - start < budget:
        time.sleep(0.5)
        now = time.monotonic()
        rows = len(RunDir(run_dir).metrics())
        sample = learner_resources(current.proc.pid) if rows else None
        if sample is not None:
            resources.setdefault("start", sample)
            resources["end"] = sample
        if rows != last_rows:
            last_rows, last_progress = rows, now
        elif rows and now - last_progress > opts.deadlock_s:
            deadlocks += 1
            print(f"soak: no progress for {opts.deadlock_s:.0f} s at iteration {rows}: counted as a deadlock",
                  file=sys.stderr)
            last_progress = now
        if not learner_killed and rows and now - start > opts.minutes * 30:
            print(f"soak: SIGKILL to the learner at iteration {rows}; resuming", file=sys.stderr)
            current.proc.send_signal(signal.SIGKILL)
            current.proc.wait()
            learner_killed = True
            time.sleep(1.0)
            current = _Run(["--resume", str(run_dir)], log_path)
            last_progress = time.monotonic()
            continue
        if rows and now >= next_kill:
            pids = actor_pids(current.proc.pid)
            if pids:
                os.kill(rng.choice(pids), signal.SIGKILL)
                actor_kills += 1
            next_kill = now + opts.kill_every_s * rng.uniform(0.5, 1.5)
    rogues.stop()
    if current.alive():
        current.proc.kill()
        deadlocks += 1
    current.proc.wait()
    current.log.close()

    report = build_report(run_dir, log_path, minutes=opts.minutes, deadlocks=deadlocks, actor_kills=actor_kills,
                          learner_restarts=int(learner_killed), exit_code=current.proc.returncode,
                          rogues=rogues if opts.rogue else None, resources=resources)
    atomic_write(out / "soak.json", json.dumps(report, indent=2) + "\n")
    return report


def build_report(run_dir: Path, log_path: Path, *, minutes: float, deadlocks: int, actor_kills: int,
                 learner_restarts: int, exit_code: int | None, rogues: Rogues | None = None,
                 resources: dict[str, tuple[float, int]] | None = None) -> dict[str, Any]:
    """The soak report from what the run left behind (``summary.json``, ``metrics.csv``, the log) and
    what the soak saw (``exit_code``: the last ``lockstep train``'s, None if it never exited).

    Ends with ``problems`` and ``healthy`` (see ``problems``)."""
    run = RunDir(run_dir)
    summary = run.summary() or {}
    rows = run.metrics()
    report = {
        "minutes": minutes,
        "deadlocks": deadlocks,
        "off_policy_samples": sum(r["off_policy_samples"] for r in rows),
        "transitions_collected": summary.get("transitions_collected"),
        "transitions_trained": summary.get("transitions_trained"),
        "transitions_dropped": summary.get("dropped_transitions"),
        "balanced": bool(summary) and summary["transitions_collected"]
        == summary["transitions_trained"] + summary["dropped_transitions"],
        "actor_kills": actor_kills,
        "actor_restarts": log_path.read_text().count("restarting actor") if log_path.exists() else 0,
        "learner_restarts": learner_restarts,
        "iterations": len(rows),
        "iterations_contiguous": [r["iteration"] for r in rows] == list(range(1, len(rows) + 1)),
        "final_return": summary.get("episode_return_mean"),
        "exit_code": exit_code,
        "summary_found": bool(summary),
        "error": summary.get("error"),
    }
    resources = resources or {}
    report["learner_rss_mb"] = [round(resources[k][0], 1) if k in resources else None for k in ("start", "end")]
    report["learner_open_files"] = [resources[k][1] if k in resources else None for k in ("start", "end")]
    if rogues is not None:
        report["rogue_clients"] = rogues.count
        report["rogue"] = rogues.tally
        report["rogue_unexpected"] = rogues.notes
    report["problems"] = problems(report)
    report["healthy"] = not report["problems"]
    return report


def problems(report: dict[str, Any]) -> list[str]:
    """What makes a soak unhealthy, one line each; empty when it is healthy.

    Unhealthy: a deadlock, an off-policy sample, a transition account that does not balance (or
    no ``summary.json`` to check it with), a ``lockstep train`` that did not exit 0 (it crashed,
    was killed, or never finished), or an error recorded in ``summary.json`` (a learner that failed
    writes its summary and error before it stops).
    """
    found = []
    if report["deadlocks"]:
        found.append(f"{report['deadlocks']} deadlock(s)")
    if report["off_policy_samples"]:
        found.append(f"{report['off_policy_samples']} off-policy sample(s)")
    if not report["summary_found"]:
        found.append("no summary.json: the run did not finish, so its transitions cannot be balanced")
    elif not report["balanced"]:
        found.append(f"transitions do not balance: collected {report['transitions_collected']} != trained "
                     f"{report['transitions_trained']} + dropped {report['transitions_dropped']}")
    if report["exit_code"] != 0:
        found.append(f"lockstep train exited with {report['exit_code']} (0 expected; see soak.log)")
    if report.get("error"):
        found.append(f"the run recorded an error: {report['error']}")
    unexpected = sum(kind["unexpected"] for kind in report.get("rogue", {}).values())
    if unexpected:
        found.append(f"{unexpected} rogue client(s) were not refused as they must be: "
                     + "; ".join(report.get("rogue_unexpected", [])))
    return found


def healthy(report: dict[str, Any]) -> bool:
    """True when ``problems(report)`` finds nothing: what ``lockstep bench soak``'s exit code should say."""
    return not problems(report)
