"""``lockstep train``: one learner in this process and its actors, started and restarted by the launcher
that ``actors.launcher`` and ``actors.transport`` name (``launch/__init__.py``): local actor processes on
loopback, in-process env loops, or Ray actors.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lockstep.actor import ActorOptions
from lockstep.config import Config, ConfigError
from lockstep.launch import ActorsGone, Launcher
from lockstep.launch.inprocess import InProcessActors
from lockstep.launch.processes import ActorProcesses
from lockstep.launch.ray import RayActors
from lockstep.launch.restart import RestartPolicy
from lockstep.learner.device import resolve_device
from lockstep.learner.distributed import Ranks, ranks_run
from lockstep.learner.parts import DEFAULT_PARTS, Parts
from lockstep.learner.wiring import Learner
from lockstep.observe.metrics import write_summary
from lockstep.observe.progress import Progress
from lockstep.transport.grpc import security

log = logging.getLogger("lockstep.train")


STOP_WAIT_S = 60.0  # how long a stopped learner may take to finish, asked and then at once, before it is left


class Interrupted(KeyboardInterrupt):
    """``lockstep train`` was stopped by ``signum`` (SIGINT or SIGTERM); the command exits with 128 + signum."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def launcher(config: Config, run_dir: Path, token: str | None) -> Launcher:
    """The launcher of ``lockstep train``'s own actors. Ray actors always use gRPC (they may run on other
    hosts); a missing Ray fails here, before the learner is built."""
    env, actors = config.env, config.actors
    policy = RestartPolicy(actors.restarts)
    if actors.launcher == "ray":
        return RayActors(config, run_dir, token, policy)
    if config.actors.transport == "inprocess":
        return InProcessActors(env.id, actors.envs_per_actor, list(range(actors.count)), policy, tuple(env.obs_keys),
                               config.vector_kwargs())
    tls = config.learner.tls_cert or None
    options = [ActorOptions(learner="", env=env.id, obs_keys=tuple(env.obs_keys), env_kwargs=config.vector_kwargs(),
                            envs_per_actor=actors.envs_per_actor, vector=actors.vector, splits=actors.splits,
                            actor_id=i, token=token,
                            tls_ca=tls, tls_server_name="localhost" if tls else None) for i in range(actors.count)]
    return ActorProcesses(options, policy,
                          address=lambda learner: _local_actor_address(config, learner.port, learner.local_address))


def _local_actor_address(config: Config, port: int, local_address: str | None) -> str:
    """Where ``lockstep train``'s own actors connect: ``actors.transport`` decides, gRPC when there is no choice."""
    if config.actors.transport == "shm":
        if local_address:
            return local_address
        log.warning("actors.transport is shm, but this host has no same-host transport; local actors use gRPC")
    return f"127.0.0.1:{port}"


def check_local_actors(config: Config) -> None:
    """A ConfigError where the config refuses the actors ``lockstep train`` starts itself: a first phase that
    waits for more actors than it starts, fewer connections than they hold (``learner.max_connections``), or
    learner limits (``learner.max_envs_per_actor``, ``max_id_length``, ``max_space_elements``) that the hello
    of each of them breaks, checked here as the learner would check it, or a ``learner.max_observation`` below the
    finite bounds of the env's own observation space, so that the run is refused by name before anything starts
    instead of failing once every actor is refused.
    The in-process transport's actors send no hello over a wire, and are not checked against the limits."""
    from lockstep import envs
    from lockstep.transport import lockstep_pb2 as pb
    from lockstep.transport.codec import CodecError
    from lockstep.transport.messages import check_hello, space_to_proto

    if config.learner.min_actors > config.actors.count:  # nobody else would ever come
        raise ConfigError(f"learner.min_actors is {config.learner.min_actors}, but lockstep train starts "
                          f"actors.count {config.actors.count} actor(s), so the first phase would wait for the "
                          f"others forever: set learner.min_actors to at most {config.actors.count} (0: all of "
                          "them), or start the learner alone (lockstep learner) for actors started elsewhere")
    spec = envs.env_spec(config.env.id, config.env.obs_keys, config.env.action_mask_key, config.vector_kwargs())
    _check_observation_bound(spec.observation, config.learner.max_observation)
    if config.actors.transport == "inprocess" and config.actors.launcher == "local":
        return
    scheme, _, name = config.env.id.partition(":")
    each = 2 if scheme == "pettingzoo" and envs.selfplay.is_turn_based(name) else 1  # a game's opponents: another
    held = config.actors.count * config.actors.splits * each  # a connection per split of each actor
    if config.learner.max_connections < held:
        raise ConfigError(f"learner.max_connections is {config.learner.max_connections}, but the "
                          f"{config.actors.count} actor(s) lockstep train starts hold {held} "
                          "connection(s) at once, so some would be refused and the first phase would wait for "
                          f"them forever: set learner.max_connections to at least {held}")
    group = config.actors.envs_per_actor // config.actors.splits  # the envs of one connection's hello
    hello = pb.Hello(run_id=32 * "0", num_envs=group * spec.agents, env_id=config.env.id,
                     observation_space=space_to_proto(spec.observation), action_space=space_to_proto(spec.action))
    try:
        check_hello(hello, config.learner.hello_limits)  # the run id: a uuid's 32 hex digits, as actors send
    except CodecError as err:
        raise ConfigError(f"the learner would refuse the actors lockstep train starts: {err}") from None


def _check_observation_bound(observation, limit: float) -> None:
    """A ConfigError where a Box leaf of the env's observation space declares finite bounds beyond
    ``learner.max_observation``: the learner would refuse the env's own observations (``messages.check_step``
    bounds float leaves and integers of 4 bytes or more; an unbounded space can only be checked step by step)."""
    import numpy as np

    for path, leaf in observation.leaves or (("", observation),):
        dtype = np.dtype(leaf.dtype) if leaf.kind == "box" else None
        if dtype is None or dtype.kind not in "fiu" or (dtype.kind != "f" and dtype.itemsize < 4):
            continue
        bounds = np.abs(np.concatenate([np.ravel(leaf.low), np.ravel(leaf.high)]).astype(np.float64))
        widest = float(bounds[np.isfinite(bounds)].max(initial=0.0))
        if widest > limit:
            where = f"leaf {path!r} of the" if path else "the"
            raise ConfigError(f"learner.max_observation is {limit:g}, but {where} env's observation space reaches "
                              f"{widest:g}, so the learner would refuse the env's own observations: raise "
                              "learner.max_observation above it (the default 1e10 is far above any real one)")


@dataclass
class _Run:
    """What ``train`` knows of its run as it goes, shared with the learner's thread and the signal handler."""

    learner: Learner | None = None  # once built
    signal: int | None = None  # the first SIGINT or SIGTERM
    summary: dict[str, Any] | None = None  # what the learner's ``serve`` returned
    error: BaseException | None = None  # what it raised instead
    forced: bool = False  # the learner had to be stopped at once
    published: int | None = None  # the port whose token file ``publish`` wrote
    token_file: str = ""


def train(config: Config, run_dir: Path, token: str | None = None, resume: bool = False,
          local_actors: bool = True, parts: Parts = DEFAULT_PARTS) -> dict[str, Any]:
    """Train to the step budget; every process started here is gone when this returns.

    With ``local_actors=False`` (``lockstep learner``) no actor is started: actors connect from
    elsewhere. SIGINT and SIGTERM stop the run in order either way, from the moment this is called: one
    that comes before the learner serves ends the run there; a second one stops waiting. Either way
    ``Interrupted`` is raised at the end. ``parts``: see ``learner.parts``.
    """
    if local_actors:
        check_local_actors(config)
    run = _Run()
    thread = threading.Thread(target=lambda: _serve(run), name="lockstep-learner", daemon=True)

    def on_signal(signum, _frame) -> None:
        # Stop in order from the main loop rather than raising wherever the signal lands
        # (a KeyboardInterrupt inside a join or a waitpid can leave nothing to clean up with).
        if run.signal is not None:
            raise Interrupted(signum)  # a second Ctrl-C: stop waiting
        run.signal = signum
        log.warning("%s: stopping the learner and the actors", signal.Signals(signum).name)
        if run.learner is not None:
            run.learner.stop()

    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    actors: Launcher | None = None
    failed, error = False, None
    try:
        ranks = Ranks.from_env(resolve_device(config.learner.device))  # under torchrun: one of several learners
        if ranks is not None:
            run_dir, config.run.seed = ranks_run(ranks, run_dir, config.run.seed)
            config.run.run_dir = str(run_dir)
        security.check_listen(config.learner.listen, token)  # off loopback, actors elsewhere must be told the token
        generated = not token
        token = token or security.new_token()  # a token always (security.py), never written to the run directory
        actors = launcher(config, run_dir, token) if local_actors else None
        learner = run.learner = Learner(config, run_dir, token=token, resume=resume, ranks=ranks, parts=parts)
        if run.signal is None and actors is not None:  # else nothing is started: the run ends before it began
            actors.prepare()

        def publish(port: int) -> str:
            """Write a generated token where actors started by hand find it (``lockstep learner`` only)."""
            if not generated or local_actors:
                return ""
            if run.published != port:
                run.published, run.token_file = port, security.publish_token(port, token)
            return run.token_file

        # a fixed port's token file is written before listening, so that no actor started at the same time
        # as the learner connects before the token is there to read
        fixed = int(config.learner.listen.rsplit(":", 1)[1])
        if fixed:
            publish(fixed)
        if run.signal is None:
            thread.start()
            _supervise(config, run_dir, learner, actors, thread, stopped=lambda: run.signal is not None,
                       publish=publish if generated else None)
    except BaseException as err:
        failed = True  # an error, or a second signal: the learner stops at once
        if isinstance(err, Exception):  # the run failed (every actor gone), not interrupted: its summary says so
            error = err
        raise
    finally:
        try:
            if run.learner is not None:
                run.forced = not _stop_learner(run.learner, thread, at_once=failed, error=error)
        finally:
            if run.published:
                security.unpublish_token(run.published)
            if actors is not None:  # and Ray, when it was started here: on every path; the actors of a learner
                actors.stop(grace_s=0.0 if run.error is not None else 5.0)  # that failed would only retry: no grace
            for sig, handler in handlers.items():
                signal.signal(sig, handler)
    summary = run.summary
    if ranks is not None and summary is not None and not run.forced:
        ranks.close()  # every rank finished its run (a stop too is agreed): leave the process group together
    if summary is not None and actors is not None:  # a run stopped by a signal has its summary too
        summary["actor_restarts"] = actors.restarts
        write_summary(run_dir / "summary.json", summary)
    if run.signal is not None:
        raise Interrupted(run.signal)
    if run.error is not None:
        raise run.error
    return summary


def _serve(run: _Run) -> None:
    try:
        run.summary = run.learner.serve()
    except BaseException as err:
        run.error = err


def _supervise(config: Config, run_dir: Path, learner: Learner, actors: Launcher | None,
               thread: threading.Thread, stopped: Callable[[], bool],
               publish: Callable[[int], str] | None = None) -> None:
    """Start the actors once the learner listens (unless ``stopped`` by then), then watch both until the
    learner is done. ``publish(port)``: where a generated token was written for actors started by hand."""
    port = learner.wait_ready(timeout=60)
    if actors is not None and stopped():
        actors = None  # stopped while the learner started: none is started now
    elif actors is not None:
        log.info("run directory %s", run_dir)
        actors.start(learner)  # it logs where the actors run
    else:
        host = config.learner.listen.rsplit(":", 1)[0]
        log.info("run directory %s; start actors with: lockstep actor --learner %s:%d --env %s --actor-id N",
                 run_dir, host, port, config.env.id)
        if publish is not None:
            log.info("no token given: this run's token is in %s; other actors need it with --token or $%s",
                     publish(port), security.TOKEN_ENV)
        if learner.local_address:
            log.info("actors on this host can use shared memory instead: --learner %s", learner.local_address)
    with Progress(config, enabled=config.run.progress) as progress:
        while thread.is_alive():
            thread.join(timeout=0.25)
            progress.update(learner.status)
            if actors is not None:
                actors.check(training=not learner.status.finished)
                # no one is left to collect a phase; with several learners a rank without actors closes its
                # phases empty and trains on with the others
                alone = not learner.status.started or learner.ranks is None
                if alone and not learner.status.finished and actors.all_exited():
                    when = ("while training, and none is due to restart (actors.restarts)" if learner.status.started
                            else "before training started")
                    raise ActorsGone(f"every actor exited {when}; see the log above")


def _stop_learner(learner: Learner, thread: threading.Thread, at_once: bool,
                  error: BaseException | None = None) -> bool:
    """Ask the learner to finish and wait for it, boundedly: asked (several learners finish together after
    the iteration under way), then at once (first, with ``at_once``); a learner that still runs then is
    left behind, with an error logged. False when it was stopped at once (or left). ``error``: why the run
    failed outside the learner (``Learner.stop``)."""
    for now in (True,) if at_once else (False, True):
        learner.stop(at_once=now, error=error)
        if thread.is_alive():
            thread.join(timeout=STOP_WAIT_S)
        if not thread.is_alive():
            return not now
    log.error("the learner did not stop within %.0f s of being stopped at once; leaving it (a collective that "
              "another rank never joined?)", STOP_WAIT_S)
    return False
