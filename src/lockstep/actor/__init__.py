"""The actor: steps a Gymnasium vector env and lets the learner choose every action.

It imports no torch: Gymnasium, numpy and gRPC only, so it starts fast and stays small.
It reaches the learner over gRPC (``host:port``) or, on the learner's host, over shared memory
(``unix:/path``); its loop is the same for both (``Connection.act``, ``LocalConnection.act``). With
``actors.splits`` S its envs are S groups, each with a connection and a thread of its own: one group's envs
step while the learner infers the actions of the others (``_act_side_by_side``).
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import uuid
from dataclasses import dataclass, field

import numpy as np

from lockstep import envs as envs_lib
from lockstep.common.backoff import Backoff
from lockstep.config import ActorsConfig, EnvConfig, splits_problem
from lockstep.transport import PROTOCOL
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.grpc import security
from lockstep.transport.grpc.client import Connection, LearnerClosed, LearnerFailed, LearnerRefused, Misconfigured
from lockstep.transport.messages import OPPONENT, StepData, space_to_proto
from lockstep.transport.shm.client import LocalConnection
from lockstep.transport.shm.layout import is_local

log = logging.getLogger("lockstep.actor")

# An actor told this many times that its learner failed (INTERNAL), with no action from it in between, stops:
# a learner restarted after a failure may serve again, but one that fails the same way each time would not.
LEARNER_FAILURES = 3

# the exit code of an actor one of whose env processes died (actors.vector async): a restart starts new ones
ENV_DIED = 4


@dataclass
class ActorOptions:
    learner: str = "127.0.0.1:50051"  # host:port (gRPC) or unix:/path (same host, shared memory)
    env: str = EnvConfig.id
    obs_keys: tuple[str, ...] = ()  # env.obs_keys: the keys of a Dict observation to keep (empty: all)
    env_kwargs: dict = field(default_factory=dict)  # env.kwargs: for the env's constructor
    envs_per_actor: int = ActorsConfig.envs_per_actor  # envs; a multi-agent env's vector has a slot per agent
    vector: str = ActorsConfig.vector  # actors.vector: sync, or async (each env in a process of its own)
    splits: int = ActorsConfig.splits  # actors.splits: groups of envs, each with its connection and thread
    actor_id: int = 0
    connect_timeout: float = 60.0  # for each connection attempt
    retry_for_s: float = 300.0  # keep reconnecting this long after the learner went away (0: never)
    token: str | None = field(default=None, repr=False)  # None: the token file of a learner on this host, if any
    tls_ca: str | None = None
    tls_server_name: str | None = None


class EnvLoop:
    """The actor's environments and what it must tell the learner about their last step."""

    def __init__(self, vec, act_spec: envs_lib.SpaceSpec, obs_spec: envs_lib.SpaceSpec | None = None) -> None:
        self.vec = vec
        # a Dict or Tuple space's observations go to the learner as records (``envs.spaces``); the spec
        # (with env.obs_keys applied) is the hello's, or else the vector env's whole space
        self.obs_spec = obs_spec or envs_lib.SpaceSpec.from_space(vec.single_observation_space)
        k = vec.num_envs
        self.act_spec = act_spec
        self.obs: np.ndarray | None = None
        self.reward = np.zeros(k, np.float32)
        self.terminated = np.zeros(k, bool)
        self.truncated = np.zeros(k, bool)
        self.final_index, self.final_obs = np.zeros(0, np.int64), None
        self.ep_return, self.ep_length = np.zeros(0, np.float64), np.zeros(0, np.int64)

    def reset(self, seeds: list[int]) -> None:
        self.reset_to(self.vec.reset(seed=seeds)[0])

    def reset_to(self, obs) -> None:
        """Start from the observations of a reset of the vector env."""
        self.obs = envs_lib.to_records(obs, self.obs_spec)
        self.final_obs = np.zeros((0, *self.obs.shape[1:]), self.obs.dtype)

    def forget_outcome(self) -> None:
        """After a reconnect the learner has dropped the unroll the last outcome belongs to.

        The finished episodes go too: the message that carried them may have reached the learner
        before the connection broke, and reporting them again would count them twice (an episode
        lost with an unreceived message is the lesser error: it only delays the statistics).
        """
        self.reward[:] = 0
        self.terminated[:] = False
        self.truncated[:] = False
        self.final_index, self.final_obs = np.zeros(0, np.int64), self.final_obs[:0]
        self.ep_return, self.ep_length = np.zeros(0, np.float64), np.zeros(0, np.int64)

    def outcome(self) -> StepData:
        """What the actor sends for the last step: its arrays as they are, read before the next ``step``."""
        return StepData(self.obs, self.reward, self.terminated, self.truncated, self.final_index, self.final_obs,
                        self.ep_return, self.ep_length)

    def step(self, actions: np.ndarray) -> None:
        self.record(self.vec.step(self.env_actions(actions)))

    def env_actions(self, actions: np.ndarray) -> np.ndarray:
        """The learner's actions as the env takes them: Box parts clipped (the learner keeps the unclipped
        action), flat vectors cut into the env's parts."""
        return envs_lib.env_actions(actions, self.act_spec)

    def record(self, result: tuple) -> None:
        """Keep what the vector env's step returned (obs, reward, terminated, truncated, info) for ``outcome``."""
        obs, reward, self.terminated, self.truncated, info = result
        self.obs = obs = envs_lib.to_records(obs, self.obs_spec)
        self.reward = reward.astype(np.float32, copy=False)
        # Same-step autoreset: `obs` already holds reset observations where an episode ended;
        # a truncated episode's last observation is needed to bootstrap its value.
        ended_by_time = self.truncated & ~self.terminated
        if ended_by_time.any():
            self.final_index = np.flatnonzero(ended_by_time).astype(np.int64)
            final = envs_lib.stack_records([info["final_obs"][i] for i in self.final_index], self.obs_spec)
            self.final_obs = final.astype(obs.dtype, copy=False)
        else:
            self.final_index, self.final_obs = np.zeros(0, np.int64), self.final_obs[:0]
        if "episode" in info:
            done = info["_episode"]
            self.ep_return = np.asarray(info["episode"]["r"][done], np.float64)
            self.ep_length = np.asarray(info["episode"]["l"][done], np.int64)
        else:
            self.ep_return, self.ep_length = np.zeros(0, np.float64), np.zeros(0, np.int64)


def opponent_request(obs, waiting: np.ndarray, obs_spec: envs_lib.SpaceSpec,
                     decided: tuple[np.ndarray, np.ndarray] | None = None) -> StepData:
    """A self-play env's request for its opponents' moves as a step of the opponents' connection
    (``learner.opponents``): their observations [k, *obs], ``terminated`` [k] marking the slots that wait, and
    as its finished episodes the games decided before the learning player moved since the last request
    (``decided``: ``SelfPlayVectorEnv.take_decided``'s returns [d] and plies [d], at most one per slot)."""
    records = envs_lib.to_records(obs, obs_spec)
    k = len(records)
    returns, plies = decided if decided is not None else (np.zeros(0, np.float64), np.zeros(0, np.int64))
    return StepData(records, np.zeros(k, np.float32), np.asarray(waiting, bool), np.zeros(k, bool),
                    np.zeros(0, np.int64), records[:0], np.asarray(returns, np.float64), np.asarray(plies, np.int64))


def member_id(actor_id: int, splits: int, group: int) -> int:
    """The id by which the learner knows group ``group`` of actor ``actor_id`` (``actors.splits`` groups): its
    member of the phases, which seeds the group's envs and action noise. An actor of S groups of k envs is, to
    the learner, S actors of k envs with ids ``actor_id * S`` .. ``actor_id * S + S - 1``; with one group, itself."""
    return actor_id * splits + group


def run(opts: ActorOptions) -> int:
    """Connect, act until the learner finishes training, reconnecting if it goes away. Returns an exit code:
    0 training finished, 1 no learner (any more), 2 the learner refused this actor or the actor's connection
    settings cannot work with it (one log line names the cause and the flag that fixes it), 3 the learner
    failed ``LEARNER_FAILURES`` times without an action in between (the log line names its error), 4
    (``ENV_DIED``) a process of one of its envs died (the log line names the env)."""
    problem = splits_problem(opts.envs_per_actor, opts.splits)
    if problem:
        log.error("actor %d: %s", opts.actor_id, problem)
        return 2
    vecs = []
    try:
        for _ in range(opts.splits):
            vecs.append(envs_lib.make_vector_env(opts.env, opts.envs_per_actor // opts.splits, opts.env_kwargs,
                                                 opts.vector))
        return _run(opts, vecs)
    except envs_lib.EnvProcessDied as err:
        log.error("actor %d: %s; exiting", opts.actor_id, err)
        return ENV_DIED
    finally:
        for vec in vecs:
            vec.close()


def _run(opts: ActorOptions, vecs: list) -> int:
    """Connect each group of envs (``actors.splits``; one without splits) as its member and act until one of them
    ends: training over, a refusal, a failure, a lost connection (``_act``, ``_act_side_by_side``).

    The groups share one fate: what ends one ends every connection, and the actor reconnects them all, with one
    backoff: they reach the same learner (over gRPC, one TCP connection), and a learner lost to one is lost to
    all. The learner drops the unroll of each (``forget_outcome``)."""
    obs_spec = envs_lib.SpaceSpec.from_space(vecs[0].single_observation_space, opts.obs_keys)
    act_spec = envs_lib.action_spec(vecs[0].single_action_space)
    loops = [EnvLoop(vec, act_spec, obs_spec) for vec in vecs]
    members = [member_id(opts.actor_id, opts.splits, g) for g in range(opts.splits)]
    backoff = Backoff(base_s=0.5, cap_s=10.0, budget_s=opts.retry_for_s)
    name = f"actor {opts.actor_id}" + (f" (members {', '.join(map(str, members))})" if opts.splits > 1 else "")
    failures: list[str] = []  # what the learner said each time it failed since its last action
    while True:
        opened: list[Connection | LocalConnection] = []  # every connection open, the opponents' too
        try:
            conns = [_connect_group(opts, member, loop, obs_spec, opened) for member, loop in zip(members, loops)]
            log.info("%s: connected to %s (learner run %s)", name, opts.learner, conns[0].welcome.learner_run)
            backoff.reset()
            for member, loop, conn in zip(members, loops, conns):
                if loop.obs is None:
                    loop.reset(envs_lib.env_seeds(conn.welcome.seed, member, loop.vec.num_envs))
                else:
                    loop.forget_outcome()
            if len(loops) == 1:
                _act(loops[0], conns[0], failures)
            else:
                _act_side_by_side(loops, conns, opened, failures)
        except LearnerClosed:
            log.info("%s: the learner finished training", name)
            return 0
        except LearnerRefused as err:
            log.error("%s: the learner at %s refused this actor: %s", name, opts.learner, err.message)
            return 2
        except Misconfigured as err:
            log.error("%s: %s", name, err)
            return 2
        except LearnerFailed as err:
            failures.append(str(err))
            if len(failures) >= LEARNER_FAILURES:
                log.error("%s: the learner at %s failed %d times without an action in between; giving up (fix "
                          "its error and restart it): %s", name, opts.learner, len(failures), err)
                return 3
            log.warning("%s: %s (%d of %d times before this actor gives up)", name, err, len(failures),
                        LEARNER_FAILURES)
        except ConnectionError as err:  # also what a transport makes of a lost learner
            log.warning("%s: %s", name, err)
        finally:
            for c in reversed(opened):
                c.close()
        if not backoff.wait():
            log.error("%s: no learner at %s for %.0f s; giving up%s", name, opts.learner, opts.retry_for_s,
                      f" (it had failed: {failures[-1]})" if failures else "")
            return 1
        log.info("%s: reconnecting to %s", name, opts.learner)


def _act(loop: EnvLoop, conn: Connection | LocalConnection, failures: list[str]) -> None:
    """Send the step of ``loop``'s envs, receive the actions, step: until the connection ends (it raises)."""
    while True:
        actions, _version = conn.act(loop.outcome())
        failures.clear()
        loop.step(actions)


def _act_side_by_side(loops: list[EnvLoop], conns: list, opened: list, failures: list[str]) -> None:
    """Each group's ``_act`` in a thread of its own: while one steps its envs, the learner infers the actions of
    the others (a thread that waits for the learner, or for env processes, holds no GIL). Each group waits only
    for the answer to its own step, as an actor of its own would, so the gate treats them as it treats actors
    (a phase never waits for a step that a waiting group holds back). The first group to end (it raises) ends
    the others: its exception is raised here once every thread has stopped."""
    ended: queue.SimpleQueue = queue.SimpleQueue()

    def act(loop: EnvLoop, conn: Connection | LocalConnection) -> None:
        try:
            _act(loop, conn, failures)
        except BaseException as err:  # what ends it, ends the actor's connections: raised by the caller
            ended.put(err)

    threads = [threading.Thread(target=act, args=pair, name=f"lockstep-split-{g}", daemon=True)
               for g, pair in enumerate(zip(loops, conns))]
    for thread in threads:
        thread.start()
    try:
        first = ended.get()
    finally:
        for conn in opened:  # the others' waits end with a ConnectionError; an env step in progress finishes
            conn.interrupt()
        for thread in threads:
            thread.join()
    raise first


def _connect_group(opts: ActorOptions, member: int, loop: EnvLoop, obs_spec: envs_lib.SpaceSpec,
                   opened: list) -> Connection | LocalConnection:
    """Say hello for one group of envs as ``member``, with a new run id; a self-play group also opens its
    opponents' connection. Each connection is appended to ``opened`` as it opens (the caller closes them)."""
    vec = loop.vec
    hello = pb.Hello(protocol=PROTOCOL, actor_id=member, run_id=uuid.uuid4().hex, num_envs=vec.num_envs,
                     env_id=opts.env, observation_space=space_to_proto(obs_spec),
                     action_space=space_to_proto(loop.act_spec), agent_policies=envs_lib.pettingzoo.agent_policies(vec))
    conn = _connect(opts, hello)
    opened.append(conn)
    if isinstance(vec, envs_lib.selfplay.SelfPlayVectorEnv):  # a second connection plays the opponents
        hello.run_id, hello.role = uuid.uuid4().hex, OPPONENT
        opponents = _connect(opts, hello)
        opened.append(opponents)
        vec.opponent = functools.partial(_opponent_moves, opponents, obs_spec, vec)
    return conn


def _opponent_moves(conn: Connection | LocalConnection, obs_spec: envs_lib.SpaceSpec,
                    vec: envs_lib.selfplay.SelfPlayVectorEnv, obs, waiting: np.ndarray):
    return conn.act(opponent_request(obs, waiting, obs_spec, vec.take_decided()))[0]


def _connect(opts: ActorOptions, hello: pb.Hello) -> Connection | LocalConnection:
    if is_local(opts.learner):  # same host: the socket's permissions stand in for a token and TLS
        return LocalConnection(opts.learner, hello, connect_timeout=opts.connect_timeout)
    token = opts.token or functools.partial(security.local_token, opts.learner)  # read when the learner listens
    return Connection.open(opts.learner, hello, connect_timeout=opts.connect_timeout, token=token,
                           tls_ca=opts.tls_ca, tls_server_name=opts.tls_server_name)


def process_main(opts: ActorOptions, log_level: int = logging.INFO) -> None:
    """A local actor process started by ``lockstep train``, once ``launch.actor_process`` has tied it to its
    parent's life (spawned, never forked)."""
    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    raise SystemExit(run(opts))
