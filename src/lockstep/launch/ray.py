"""``lockstep train --launcher ray``: the learner in this process (Ray's driver), the actors as Ray actors.

Ray places each actor (``actors.ray_cpus_per_actor`` CPUs and the custom resources of ``actors.ray_resources``,
which only the nodes started with them offer), restarts one whose worker process dies (at most
``actors.restarts`` times; a restarted actor says hello with a new run id, so the learner drops its
unfinished unroll and counts it) and forwards the actors' log lines to this process's stderr. Whether,
and when, an actor's loop runs again is the ``RestartPolicy``'s call, as for every launcher. The actors
reach the learner over gRPC, with its token and TLS when configured, whatever ``actors.transport`` says:
a Ray actor may run on another machine.

Where Ray runs
    No address (``actors.ray_address``, else ``$RAY_ADDRESS``): a Ray instance is started on this host for the
    run and stopped after it. It advertises 127.0.0.1, starts no dashboard, sends no usage statistics, gets
    a token of its own (unless ``RAY_AUTH_*`` is set), and keeps its temporary files in a short folder under
    the temp directory (its unix sockets must fit in 107 bytes, which a run directory rarely leaves room
    for); its logs are copied to ``RUN_DIR/ray-logs/`` when it stops. With an address (``HOST:6379``,
    ``auto``) this process joins that cluster, of which this host must be a node, and at the end kills the
    actors it created and disconnects.

Restarts
    A Ray actor runs its calls in order. The driver calls ``where`` and then ``run``; when a worker dies,
    ``run`` fails (or returns an exit code a restart can help), and when the policy says so the driver
    calls ``where`` and ``run`` again after its backoff: both wait for Ray's restart of a dead worker.
    ``where`` answering counts one restart; ``where`` failing means Ray could not bring the actor back
    (its restarts are spent, or it cannot start), and the actor is gone for good.

A node that dies
    takes its actors' workers with it: their streams close, the learner trains on with the actors it still
    has, and Ray restarts each lost actor on a node with room for it (its CPUs and ``actors.ray_resources``).
    Until one has room (a node joins, or the autoscaler adds one) the calls find the actor restarting, and
    are made again for up to ``RESTARTING_LIMIT_S``; then it is given up and the run goes on without it.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lockstep.actor import ActorOptions
from lockstep.config import Config, ConfigError
from lockstep.launch.ray_actor import RayActor
from lockstep.launch.restart import FINISHED, LEARNER_FAILED, REFUSED, RestartPolicy
from lockstep.transport.grpc import security

if TYPE_CHECKING:
    from lockstep.learner.wiring import Learner

log = logging.getLogger("lockstep.train")

INSTALL = "pip install -e '.[ray]'"
PLACEMENT_WARNING_S = 60.0  # an actor Ray has not placed after this long is logged, with the free CPUs
RESTARTING_POLL_S = 1.0  # while Ray restarts a worker, calls to it fail at once: they are made again this often
RESTARTING_LIMIT_S = 600.0  # ... for at most this long, after which the actor is given up
_UNIX_PATH_MAX = 107
_SOCKET_TAIL = len("/lockstep-ray-xxxxxxxx/session_2000-01-01_00-00-00_000000_4194304/sockets/plasma_store")
_WILDCARDS = ("", "0.0.0.0", "::")
_AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


@dataclass
class _Actor:
    actor_id: int
    handle: Any
    where: Any = None  # the pending `where` call
    run: Any = None  # the pending `run` call
    answered: bool = False  # `where` answered since the last `run` was called
    again: bool = False  # `run` ended and was called again: the next answer to `where` is a restart
    died: bool = False  # ... of a worker that died (Ray restarted it), not of one whose loop returned
    pid: int | None = None
    host: str = ""
    restart_at: float | None = None  # when `where` and `run` are due to be called again
    restarting_since: float | None = None  # the calls found Ray still restarting the worker, since then
    gone: bool = False  # returned from `run` for good, or dead for good


class RayActors:
    """The actors of one run on Ray, a ``Launcher``: ``prepare`` (start or join Ray), ``start``, then
    ``check`` while the learner trains, then ``stop``."""

    def __init__(self, config: Config, run_dir: Path, token: str | None, policy: RestartPolicy) -> None:
        if importlib.util.find_spec("ray") is None:
            raise ConfigError(f"actors.launcher is ray, but Ray is not installed: {INSTALL}")
        actors = config.actors
        self.config, self.run_dir, self.token, self.policy = config, run_dir, token, policy
        self.address = actors.ray_address or os.environ.get("RAY_ADDRESS", "")
        if "://" in self.address:
            raise ConfigError(f"actors.ray_address {self.address!r}: Ray Client addresses are not supported; run "
                              "lockstep train on a node of the cluster and give the cluster's address (HOST:6379) "
                              "or auto")
        needed = actors.count * actors.ray_cpus_per_actor
        self.num_cpus = actors.ray_num_cpus or max(os.cpu_count() or 1, math.ceil(needed))
        self.resources = _resources(actors.ray_resources)
        if not self.address and self.num_cpus < needed:
            raise ConfigError(f"actors.ray_num_cpus={self.num_cpus} cannot place {actors.count} actors of "
                              f"{actors.ray_cpus_per_actor} CPUs each: raise actors.ray_num_cpus or lower "
                              "actors.ray_cpus_per_actor")
        self.actors: list[_Actor] = []
        self._ray: Any = None
        self._own = False  # this launcher started the Ray instance (and stops it)
        self._connected = False  # this launcher connected to Ray (and disconnects)
        self._temp_dir: str | None = None
        self._environ: list[str] = []  # variables set here for Ray, removed again at the end
        self._started = 0.0
        self._warned = False

    @property
    def restarts(self) -> int:
        return self.policy.restarts

    def start(self, learner: Learner) -> None:
        """Create the actors, which connect to the learner's gRPC port."""
        ray = self._ray
        address = self._learner_address(learner.port)
        env, learner, actors = self.config.env, self.config.learner, self.config.actors
        if actors.transport != "grpc":
            log.info("actors.transport is %s, which applies to local actors; Ray actors connect over gRPC",
                     actors.transport)
        ca = Path(learner.tls_cert).read_bytes() if learner.tls_cert else None  # the actors trust this chain
        remote = ray.remote(num_cpus=actors.ray_cpus_per_actor, resources=self.resources, max_restarts=actors.restarts,
                            max_task_retries=0)(RayActor)  # calls are not retried: `check` calls `run` again
        level = logging.getLogger().getEffectiveLevel()
        for i in range(actors.count):
            options = ActorOptions(learner=address, env=env.id, obs_keys=tuple(env.obs_keys),
                                   env_kwargs=self.config.vector_kwargs(), envs_per_actor=actors.envs_per_actor,
                                   vector=actors.vector, splits=actors.splits, actor_id=i,
                                   token=self.token, tls_server_name="localhost" if ca and self._own else None)
            actor = _Actor(i, remote.remote(options, level, ca))
            self._call(actor)
            self.actors.append(actor)
        self._started = time.monotonic()
        where = (f"a Ray instance on this host with {self.num_cpus} CPUs (its files in {self._temp_dir})" if self._own
                 else f"the Ray cluster at {ray.get_runtime_context().gcs_address}: "
                      f"{sum(1 for n in ray.nodes() if n.get('Alive'))} node(s), "
                      f"{ray.cluster_resources().get('CPU', 0):g} CPUs")
        log.info("%d Ray actor(s) x %d env(s) at %s, on %s", actors.count, actors.envs_per_actor, address, where)

    def check(self, training: bool) -> None:
        """Note what the actors' calls answered; call ``where`` and ``run`` again on an actor due to restart."""
        now = time.monotonic()
        for actor in self.actors:
            if actor.restart_at is not None and (now >= actor.restart_at or not training):
                actor.restart_at = None
                if training:
                    self._call(actor)
                else:
                    actor.gone = True
        pending = [ref for a in self.actors if not a.gone for ref in (a.where, a.run) if ref is not None]
        if not pending:
            return
        ready, _ = self._ray.wait(pending, num_returns=len(pending), timeout=0)
        done = set(ready)
        for actor in self.actors:
            if actor.where is not None and actor.where in done:
                self._answered(actor)
            if actor.run is not None and actor.run in done:
                self._returned(actor, training)
        self._warn_unplaced()

    def all_exited(self) -> bool:
        return all(a.gone for a in self.actors)

    def prepare(self) -> None:
        """Start a Ray instance on this host, or join the cluster at the address (``connect``)."""
        self.connect()

    def stop(self, grace_s: float = 5.0) -> None:
        """Give the actors ``grace_s`` to return from ``run`` (training is over), then kill them; stop the
        Ray instance started here, or disconnect from the cluster."""
        ray = self._ray
        for actor in self.actors:
            if actor.restart_at is not None:
                actor.restart_at, actor.gone = None, True
        try:
            if ray is not None:
                pending = [a.run for a in self.actors if a.run is not None and not a.gone]
                if pending:
                    ray.wait(pending, num_returns=len(pending), timeout=grace_s)
                self.check(training=False)
                for actor in self.actors:
                    ray.kill(actor.handle, no_restart=True)
        finally:
            if ray is not None and self._connected:
                ray.shutdown()
            self._ray = None
            self._keep_logs()
            for key in self._environ:
                os.environ.pop(key, None)
            self._environ = []

    # -- the actors' calls ------------------------------------------------------------

    def _call(self, actor: _Actor) -> None:
        actor.where, actor.run, actor.answered = actor.handle.where.remote(), actor.handle.run.remote(), False

    def _answered(self, actor: _Actor) -> None:
        ref, actor.where = actor.where, None
        try:
            actor.pid, actor.host = self._ray.get(ref)
        except self._ray.exceptions.RayActorError:
            return  # it did not come back: its `run` fails too, and `_returned` says so
        actor.answered, actor.restarting_since = True, None
        if actor.again:
            count = self.policy.restarted(actor.actor_id)
            log.warning("actor %d %s (restart %d of at most %d): worker pid %d on %s", actor.actor_id,
                        "restarted by Ray" if actor.died else "runs again", count, self.policy.max_restarts,
                        actor.pid, actor.host)
            actor.again = actor.died = False
        else:
            log.info("actor %d runs in Ray worker pid %d on %s", actor.actor_id, actor.pid, actor.host)

    def _returned(self, actor: _Actor, training: bool) -> None:
        ref, actor.run = actor.run, None
        try:
            code = self._ray.get(ref)
        except self._ray.exceptions.RayActorError as err:
            if actor.where is not None:  # `where` ran before `run`: its answer is on its way, if it has one
                self._ray.wait([actor.where], timeout=10.0)
                self._answered(actor)
            reason = str(err).strip().splitlines()[0]
            if not actor.answered and actor.again and self._still_restarting(actor, err):
                return
            if not actor.answered:
                actor.gone = True
                log.error("actor %d is gone: Ray could not %s it (%s)", actor.actor_id,
                          "restart" if actor.again else "start", reason)
                return
            code, died, cause = None, True, f"died (worker pid {actor.pid} on {actor.host}): {reason}"
        else:
            died, cause = False, (f"exited with code {code} (1: no learner; 2: refused; 3: the learner failed; "
                                  "4: an env process died; see its log above)")
            if code == FINISHED:
                log.info("actor %d finished", actor.actor_id)
        delay = self.policy.delay(actor.actor_id, code, cause, training)
        if delay is None:
            actor.gone = True
            # (else the policy said why)
            if code in (REFUSED, LEARNER_FAILED) or (code not in (None, FINISHED) and not training):
                log.error("actor %d %s", actor.actor_id, cause)
            return
        actor.again, actor.died, actor.restart_at = True, died, time.monotonic() + delay

    def _still_restarting(self, actor: _Actor, err: Exception) -> bool:
        """Whether calls to a worker Ray is restarting failed only because it is not back yet (Ray answers calls
        made during a restart with ``ActorUnavailableError`` rather than queueing them): then they are made
        again in ``RESTARTING_POLL_S``, for up to ``RESTARTING_LIMIT_S``."""
        unavailable = getattr(self._ray.exceptions, "ActorUnavailableError", None)  # Ray 2.22 and later
        if unavailable is None or not isinstance(err, unavailable):
            return False
        now = time.monotonic()
        actor.restarting_since = actor.restarting_since or now
        if now - actor.restarting_since > RESTARTING_LIMIT_S:
            return False
        log.debug("actor %d: Ray is still restarting its worker; calling it again in %.0f s", actor.actor_id,
                  RESTARTING_POLL_S)
        actor.restart_at = now + RESTARTING_POLL_S
        return True

    def _warn_unplaced(self) -> None:
        if self._warned or time.monotonic() - self._started < PLACEMENT_WARNING_S:
            return
        waiting = [a.actor_id for a in self.actors if a.pid is None and not a.gone]
        if waiting:
            self._warned = True
            available = self._ray.available_resources()
            needs = {"CPU": self.config.actors.ray_cpus_per_actor, **self.resources}
            log.warning("Ray has not placed actor(s) %s after %.0f s: each needs %s, the cluster has %s free "
                        "(actors.ray_cpus_per_actor, actors.ray_resources)", waiting, PLACEMENT_WARNING_S,
                        _amounts(needs), _amounts({key: available.get(key, 0) for key in needs}))

    # -- Ray itself -------------------------------------------------------------------

    def connect(self) -> None:
        """Start a Ray instance on this host, or join the cluster at the address. Call it before the learner
        starts serving: ``ray.init`` forks, and gRPC's threads do not survive a fork."""
        self._own = not self.address
        settings = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_DEDUP_LOGS": "0"}  # dedup would merge actors' lines
        if self._own or security.is_loopback(self.address.rpartition(":")[0]):
            # Read when ray is imported. Without it Ray replaces 127.0.0.1 with the host's outside address: the
            # instance started here would advertise that, and a head on loopback could not be joined.
            settings["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        if self._own:
            if not any(key in os.environ for key in _AUTH_VARIABLES):  # else Ray writes one to ~/.ray/auth_token
                settings.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
        for key, value in settings.items():
            if key not in os.environ:
                os.environ[key] = value
                self._environ.append(key)
        import ray

        self._ray = ray
        if ray.is_initialized():  # the caller's own connection (Python API): use it, leave it open
            self._own = False
            return
        main = threading.current_thread() is threading.main_thread()
        sigterm = signal.getsignal(signal.SIGTERM) if main else None
        try:
            if self._own:
                self._temp_dir = _short_temp_dir()
                ray.init(address="local", num_cpus=self.num_cpus, _node_ip_address="127.0.0.1",
                         resources={key: amount * self.config.actors.count for key, amount in self.resources.items()},
                         include_dashboard=False, _temp_dir=self._temp_dir, log_to_driver=True)
            else:
                ray.init(address=self.address, log_to_driver=True)
            self._connected = True
        except BaseException:
            self._connected = ray.is_initialized()
            self.stop()
            raise
        finally:
            if main:  # ray.init replaces it with one that exits at once; lockstep's stops the run in order
                signal.signal(signal.SIGTERM, sigterm)

    def _learner_address(self, port: int) -> str:
        """Where the actors reach the learner: ``learner.listen``'s host, or for a wildcard, this host's
        address as Ray knows it (127.0.0.1 on a Ray instance started here)."""
        listen = self.config.learner.listen
        host = security.split_address(listen)[0].strip("[]")
        here = self._ray.util.get_node_ip_address()
        if host in _WILDCARDS:
            host = here
        elif not self._own and security.is_loopback(host):
            others = sorted({n["NodeManagerAddress"] for n in self._ray.nodes() if n.get("Alive")} - {here})
            if others:
                raise ConfigError(f"the learner listens on {listen}, which the Ray nodes at {', '.join(others)} "
                                  "cannot reach: listen on an address they can, e.g. --listen 0.0.0.0:50051, "
                                  "with --token (docs/cluster-and-security.md)")
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def _keep_logs(self) -> None:
        """Copy the logs of the Ray instance started here into the run directory; remove its temporary files."""
        if self._temp_dir is None:
            return
        session = Path(self._temp_dir) / "session_latest"
        try:
            if (session / "logs").is_dir():
                target = self.run_dir / "ray-logs" / session.resolve().name
                shutil.copytree(session / "logs", target, dirs_exist_ok=True)
                log.info("Ray's logs (the actors' in worker-*.err) are in %s", target)
        except OSError as err:
            log.warning("could not copy Ray's logs from %s: %s", session, err)
        shutil.rmtree(self._temp_dir, ignore_errors=True)
        self._temp_dir = None


def _resources(resources: dict[str, Any]) -> dict[str, float]:
    """``actors.ray_resources`` checked: custom resources by name (Ray's CPUs have ``actors.ray_cpus_per_actor``);
    each amount's range (> 0) is the config's own."""
    for key in resources:
        if key in ("CPU", "GPU", "memory", "object_store_memory"):
            raise ConfigError(f"actors.ray_resources names {key}, one of Ray's own resources: give custom "
                              "resources only (e.g. {actor_host: 1}); the CPUs are actors.ray_cpus_per_actor")
    return {key: float(amount) for key, amount in resources.items()}


def _amounts(resources: dict[str, float]) -> str:
    return ", ".join(f"{amount:g} {key}" for key, amount in resources.items())


def _short_temp_dir() -> str:
    """A fresh folder for Ray's temporary files, short enough for the unix sockets Ray makes inside it."""
    parent = tempfile.gettempdir()
    if len(parent) + _SOCKET_TAIL > _UNIX_PATH_MAX:
        parent = "/tmp"
    return tempfile.mkdtemp(prefix="lockstep-ray-", dir=parent)
