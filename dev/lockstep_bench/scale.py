"""``lockstep bench scale``: one real learner against 10, 100, 1,000 simulated actors.

For each size (actors N, envs per actor k) the benchmark starts a real ``lockstep learner`` (strict
sync, T = ``steps_per_env``, a tiny model trained one gradient step per phase, so that the learner's
per-message work dominates) and ``ceil(N / actors_per_process)`` client processes of simulated actors
(``scale_client.py``: real protocol, one gRPC connection per actor, envs that cost nothing). The
learner waits for all N (``learner.min_actors``) and trains until ``seconds`` of training have passed
(or ``phases`` phases, when given). Per size it reports:

    messages/s               Actions the learner sent (one per Step) / training wall seconds
    env steps/s              transitions trained / training wall seconds
    learner CPU µs/message   the learner process's CPU seconds since the first phase / messages
    publish→last release     per phase, from publishing version v until the last request it released
                             resumed (measured in the learner: summary.json ``publish_release_ms``)
    learner RSS              before any actor connected (idle), and the most while training (from /proc)
    KB per connection        (RSS while training - idle RSS) / N: every cost that grows with the actors
                             (connections, sessions, unrolls, the batch); the table's marginal column
                             is the same between two sizes, without the fixed costs
    stalls                   phases past the stall rule, floor ``stall_s`` (and the watchdog's warnings)
    errors                   anything that is not a clean run: a learner that failed or had to be killed
                             because no phase closed for ``stuck_s`` (stuck), a stream that did not end
                             normally, transitions collected but never trained, or books that disagree:
                             every Step a client sent must be answered (or be the last, held one) and
                             the learner's collected transitions must be the Actions the clients got × k.

Writes ``scale.md`` and ``scale.json`` to ``out``, and each size's run, logs and client counts under
``out/runs/``. The clients share the machine with the learner: on a small machine their CPU is part of
what limits the rate, which is why the learner's CPU per message is the figure that carries over.
"""

from __future__ import annotations

import json
import math
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from lockstep import config as config_lib
from lockstep.observe.run_dir import RunDir
from lockstep.transport.grpc import security
from lockstep_bench import cell, runs
from lockstep_bench.runs import tail

ENV_ID = "CartPole-v1"  # its spaces: Box(4) float32 observations, Discrete(2) actions; the clients fake the dynamics


@dataclass
class ScaleOptions:
    sizes: list[int] = field(default_factory=lambda: [10, 100, 1000])  # actors
    envs: list[int] = field(default_factory=lambda: [1, 8])  # envs per actor
    seconds: float = 20.0  # training seconds per size (the learner's run.time_limit_s)
    phases: int | None = None  # or stop after this many phases, whichever comes first
    steps_per_env: int = 8  # T
    actors_per_process: int = 250  # simulated actors per client process
    episode_length: int = 32  # steps between the simulated envs' episode ends
    stall_s: float = 5.0  # sync.stall_s: the stall rule's floor (a phase collecting longer may count as a stall)
    stuck_s: float = 90.0  # no phase closed for this long: the run is stuck, killed and reported
    startup_s: float = 180.0  # for the learner to listen, and for N actors to connect

    @classmethod
    def quick(cls) -> ScaleOptions:
        return cls(seconds=8.0)


def build_config(actors: int, envs: int, opts: ScaleOptions) -> config_lib.Config:
    """The learner's config: strict, T small, a tiny model and one gradient step per phase."""
    config = config_lib.Config()
    config.env.id, config.actors.count, config.actors.envs_per_actor = ENV_ID, actors, envs
    config.learner.min_actors = actors
    config.learner.device = "cpu"
    config.ppo.steps_per_env = opts.steps_per_env
    per_phase = actors * envs * opts.steps_per_env
    config.ppo.total_steps = per_phase * opts.phases if opts.phases else 10**12
    config.ppo.epochs, config.ppo.minibatches = 1, 1
    config.model.hidden = [16]
    config.sync.strategy, config.sync.stall_s = "strict", opts.stall_s
    config.run.time_limit_s = opts.seconds
    config.run.progress = False
    return config


def hello_template(env_id: str, envs: int) -> bytes:
    """A serialized ``pb.Hello`` with ``env_id``'s spaces; the clients fill in actor and run ids."""
    from lockstep.envs import env_spec
    from lockstep.transport import PROTOCOL
    from lockstep.transport import lockstep_pb2 as pb
    from lockstep.transport.messages import space_to_proto

    spec = env_spec(env_id)
    return pb.Hello(protocol=PROTOCOL, num_envs=envs, env_id=env_id, observation_space=space_to_proto(spec.observation),
                    action_space=space_to_proto(spec.action)).SerializeToString()


def raise_fd_limit(actors: int) -> int:
    """Raise this process's soft limit on open files (children inherit it) to fit ``actors`` connections."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = 2 * actors + 1024  # the learner: a socket per actor, plus grpc's, torch's and Python's own
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise OSError(f"{actors} actors need about {need} open files, but the hard limit is {hard}; "
                          f"raise it (ulimit -Hn {need}) or run fewer actors")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        soft = need
    return soft


def rss_mb(pid: int) -> float | None:
    """Resident memory of process ``pid`` in MB (Linux /proc), or None where it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except (OSError, ValueError):
        pass
    return None


def _wait_for_port(learner: subprocess.Popen, log_path: Path, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in log_path.read_text().splitlines():
            if "learner listening on port " in line:
                return int(line.split("learner listening on port ")[1].split()[0])
        if learner.poll() is not None:
            raise RuntimeError(f"the learner exited with {learner.returncode}: {tail(log_path)}")
        time.sleep(0.1)
    raise RuntimeError(f"the learner did not listen within {timeout_s:.0f} s: {tail(log_path)}")



def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _start_clients(folder: Path, actors: int, envs: int, port: int, opts: ScaleOptions,
                   env: dict[str, str]) -> list[tuple]:
    hello = hello_template(ENV_ID, envs).hex()
    processes = math.ceil(actors / opts.actors_per_process)
    clients = []
    for i in range(processes):
        ids = list(range(i, actors, processes))
        plan = {"address": f"127.0.0.1:{port}", "actor_ids": ids, "hello": hello,
                "episode_length": opts.episode_length, "deadline_s": opts.startup_s + 3 * opts.seconds + opts.stuck_s}
        plan_path, counts = folder / f"client-{i}.plan.json", folder / f"client-{i}.json"
        plan_path.write_text(json.dumps(plan))
        log = (folder / f"client-{i}.log").open("w")
        proc = subprocess.Popen([sys.executable, "-m", "lockstep_bench.scale_client", str(plan_path), str(counts)],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        clients.append((proc, counts, log))
    return clients


def _watch(learner: subprocess.Popen, clients: list[tuple], run_dir: Path, opts: ScaleOptions) -> dict[str, Any]:
    """Wait for the learner to finish; kill it if no phase closes for ``stuck_s``. Samples its RSS."""
    seen = {"stuck": None, "rss_mb": None}
    rows, last_change = 0, time.monotonic()
    while learner.poll() is None:
        time.sleep(0.25)
        now, count = time.monotonic(), len(RunDir(run_dir).metrics())
        if count != rows:
            rows, last_change = count, now
        if rows:  # every actor has connected and a phase has trained: the running learner's memory, at its largest
            seen["rss_mb"] = max(filter(None, (rss_mb(learner.pid), seen["rss_mb"])), default=None)
        allowed = opts.stuck_s + (0 if rows else opts.startup_s)
        if now - last_change > allowed:
            seen["stuck"] = (f"stuck: no phase closed for {allowed:.0f} s after {rows} phase(s); "
                             "the learner was killed")
            _kill(learner)
    deadline = time.monotonic() + 60
    for proc, _, _ in clients:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill(proc)
    return seen


KEYS = ["actors", "envs_per_actor", "client_processes", "phases", "messages", "messages_per_s", "env_steps",
        "env_steps_per_s", "wall_s", "learner_cpu_s", "learner_cpu_us_per_message", "client_cpu_us_per_message",
        "publish_release_p50_ms", "publish_release_p99_ms", "publish_release_max_ms", "released_per_phase",
        "learner_rss_idle_mb", "learner_rss_mb", "learner_peak_rss_mb", "kb_per_connection", "inference_batch_mean",
        "time_split_s", "stalls", "stall_warnings", "dropped_transitions", "client_sent", "client_replies",
        "learner_messages", "messages_match", "errors", "load_1m_start", "load_1m_end"]


def run_size(actors: int, envs: int, opts: ScaleOptions, out: Path) -> dict[str, Any]:
    """One size: a learner and its client processes, start to finish; the row of the table."""
    folder = out / "runs" / f"actors{actors}-envs{envs}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    run_dir = folder / "run"
    config_lib.save(build_config(actors, envs, opts), folder / "config.yaml")
    row: dict[str, Any] = dict.fromkeys(KEYS) | {
        "actors": actors, "envs_per_actor": envs, "client_processes": math.ceil(actors / opts.actors_per_process),
        "load_1m_start": round(os.getloadavg()[0], 2), "errors": []}
    log_path = folder / "learner.log"
    env = os.environ | {security.TOKEN_ENV: security.new_token()}  # learner's and clients' (no argv)
    with log_path.open("w") as log:
        learner = runs.start(["--config", str(folder / "config.yaml"), "--run-dir", str(run_dir)], log,
                             subcommand="learner", new_session=True, env=env)
    clients: list[tuple] = []
    try:
        port = _wait_for_port(learner, log_path, opts.startup_s)
        time.sleep(0.5)
        row["learner_rss_idle_mb"] = rss_mb(learner.pid)
        clients = _start_clients(folder, actors, envs, port, opts, env)
        seen = _watch(learner, clients, run_dir, opts)
    except RuntimeError as err:
        seen = {"stuck": None, "rss_mb": None}
        row["errors"].append(str(err))
    finally:
        _kill(learner)
        for proc, _, log in clients:
            _kill(proc)
            log.close()
    row["load_1m_end"] = round(os.getloadavg()[0], 2)
    row["learner_rss_mb"] = seen["rss_mb"]
    if seen["stuck"]:
        row["errors"].append(seen["stuck"])
    if learner.returncode not in (0, -signal.SIGKILL) and not row["errors"]:
        row["errors"].append(f"the learner exited with {learner.returncode}: {tail(log_path)}")
    counts = [json.loads(path.read_text()) for _, path, _ in clients if path.exists()]
    if len(counts) < len(clients):
        row["errors"].append(f"{len(clients) - len(counts)} client process(es) wrote no counts (see client-*.log)")
    _fill(row, counts, run_dir, log_path)
    return row


def _fill(row: dict[str, Any], counts: list[dict], run_dir: Path, log_path: Path) -> None:
    """The row's figures from the learner's summary.json and the clients' counts; the books' checks."""
    actors, envs, errors = row["actors"], row["envs_per_actor"], row["errors"]
    for c in counts:
        if c["errors"]:
            errors.append(f"client: {sum(c['errors'].values())} stream(s) ended badly, e.g. {c['first_error']}")
    sent, replies, ended = (sum(c[k] for c in counts) for k in ("sent", "replies", "ended"))
    row.update(client_sent=sent, client_replies=replies, messages=replies,
               stall_warnings=log_path.read_text().count("has collected for more than"))
    if replies:
        row["client_cpu_us_per_message"] = round(1e6 * sum(c["cpu_s"] for c in counts) / replies, 1)
    s = RunDir(run_dir).summary()
    if s is None:
        errors.append("no summary.json: the learner did not finish")
        return
    wall, release = s["wall_s"], s.get("publish_release_ms") or {}
    row.update(phases=s["iterations"], env_steps=s["env_steps"], wall_s=wall, learner_cpu_s=s["learner_cpu_s"],
               learner_peak_rss_mb=s["learner_peak_rss_mb"], inference_batch_mean=s["inference_batch_mean"],
               time_split_s=s["time_split_s"], stalls=s["stalls"], dropped_transitions=s["dropped_transitions"],
               publish_release_p50_ms=release.get("p50_ms"), publish_release_p99_ms=release.get("p99_ms"),
               publish_release_max_ms=release.get("max_ms"),
               learner_messages=s["transitions_collected"] // envs)
    if release.get("phases"):
        row["released_per_phase"] = round(release["released"] / release["phases"], 1)
    if wall > 0:
        row["messages_per_s"] = round(replies / wall, 1)
        row["env_steps_per_s"] = round(s["env_steps"] / wall, 1)
    if replies:
        row["learner_cpu_us_per_message"] = round(1e6 * s["learner_cpu_s"] / replies, 1)
    if row["learner_rss_mb"] is not None and row["learner_rss_idle_mb"] is not None:
        row["kb_per_connection"] = round(1024 * (row["learner_rss_mb"] - row["learner_rss_idle_mb"]) / actors, 1)
    row["messages_match"] = s["transitions_collected"] == replies * envs and sent == replies + ended \
        and ended == actors
    if s.get("error"):
        errors.append(f"the learner recorded an error: {s['error']}")
    if not row["messages_match"]:
        errors.append(f"books disagree: the learner collected {s['transitions_collected']} transitions, the clients "
                      f"got {replies} Actions × {envs} envs; sent {sent} Steps, {ended} of {actors} streams ended")
    if s["dropped_transitions"]:
        errors.append(f"{s['dropped_transitions']} transitions collected but never trained: a phase did not close")
    if not s["iterations"]:
        errors.append("no phase closed")


def run(opts: ScaleOptions, out: Path, command: str) -> list[dict[str, Any]]:
    """Every size in ``opts`` (each envs count with each actor count); write scale.json and scale.md."""
    out.mkdir(parents=True, exist_ok=True)
    fd_limit = raise_fd_limit(max(opts.sizes))
    rows = []
    for envs in opts.envs:
        for actors in opts.sizes:
            print(f"[scale] {actors} actors x {envs} env(s): running ...", flush=True)
            row = run_size(actors, envs, opts, out)
            print(f"[scale] {actors} x {envs}: {row['messages_per_s']} messages/s, {row['learner_cpu_us_per_message']}"
                  f" µs learner CPU/message, {row['phases']} phases, errors: {row['errors'] or 'none'}", flush=True)
            rows.append(row)
    machine = {"cpus": os.cpu_count(), "python": platform.python_version(), "grpcio": grpc.__version__,
               "open_files_limit": fd_limit}
    report = {"command": command, "machine": machine, "options": vars(opts), "rows": rows}
    (out / "scale.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "scale.md").write_text(markdown(rows, command, machine, opts))
    return rows


def marginal_kb(rows: list[dict[str, Any]], row: dict[str, Any]) -> float | None:
    """KB of learner RSS per actor between this size and the next smaller one with the same envs per actor."""
    smaller = [r for r in rows if r["envs_per_actor"] == row["envs_per_actor"] and r["actors"] < row["actors"]
               and r["learner_rss_mb"] is not None]
    if not smaller or row["learner_rss_mb"] is None:
        return None
    prev = max(smaller, key=lambda r: r["actors"])
    return round(1024 * (row["learner_rss_mb"] - prev["learner_rss_mb"]) / (row["actors"] - prev["actors"]), 1)


def markdown(rows: list[dict[str, Any]], command: str, machine: dict[str, Any], opts: ScaleOptions) -> str:
    lines = ["# lockstep bench scale", "", "```", command, "```", "",
             f"{machine['cpus']} CPUs, Python {machine['python']}, grpcio {machine['grpcio']}; strict sync, "
             f"T = {opts.steps_per_env}, {ENV_ID} spaces, MLP [16], one gradient step per phase; "
             f"{opts.seconds:g} s of training per size; {opts.actors_per_process} simulated actors per client process.",
             "", "| actors | envs/actor | messages/s | env steps/s | learner CPU µs/msg | client CPU µs/msg | "
             "publish→last release p50 / p99 ms | phases | learner RSS MB idle → running | KB/connection | "
             "marginal KB/actor | batch mean | time split s (inf / ser / train / other) | stalls | errors | "
             "load 1m start / end |", "|" + "---|" * 16]
    for r in rows:
        split = r["time_split_s"] or {}
        parts = [cell(split.get(k)) for k in ("inference", "serialization", "training", "other")]
        lines.append(
            f"| {cell(r['actors'])} | {r['envs_per_actor']} | {cell(r['messages_per_s'])} | "
            f"{cell(r['env_steps_per_s'])} | {cell(r['learner_cpu_us_per_message'])} | "
            f"{cell(r['client_cpu_us_per_message'])} | "
            f"{cell(r['publish_release_p50_ms'])} / {cell(r['publish_release_p99_ms'])} | {cell(r['phases'])} | "
            f"{cell(r['learner_rss_idle_mb'])} → {cell(r['learner_rss_mb'])} | {cell(r['kb_per_connection'])} | "
            f"{cell(marginal_kb(rows, r))} | {cell(r['inference_batch_mean'])} | {' / '.join(parts)} | "
            f"{cell(r['stalls'])} ({r['stall_warnings'] or 0} warned) | {len(r['errors'])} | "
            f"{cell(r['load_1m_start'])} / {cell(r['load_1m_end'])} |")
    lines += ["", "messages: Actions sent by the learner (one per Step); learner CPU includes training. "
              "publish→last release: per phase, from publishing the new version to the last held request "
              "resuming on the learner's event loop. KB/connection counts every cost that grows with the actors "
              "(against the idle learner); the marginal column compares with the next smaller size."]
    problems = [f"- {r['actors']} x {r['envs_per_actor']}: {e}" for r in rows for e in r["errors"]]
    return "\n".join(lines + (["", "## Errors", "", *problems] if problems else [])) + "\n"
