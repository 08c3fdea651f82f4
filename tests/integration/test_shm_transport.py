"""The same-host transport against a real learner: real unix sockets, real shared memory, real processes.

A learner runs in a thread; well-behaved actors are the real client (``LocalConnection``) or a
``lockstep actor --learner unix:...`` process; hostile clients speak raw frames on the socket and
write into the shared memory the learner hands them.
"""

from __future__ import annotations

import itertools
import os
import socket
import stat
import subprocess
import time
import uuid

import numpy as np
import pytest
from conftest import lockstep_cmd
from protocol import hello

from lockstep.envs import env_spec
from lockstep.transport import PROTOCOL
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.grpc.client import LearnerClosed, LearnerRefused
from lockstep.transport.messages import StepData
from lockstep.transport.shm import layout as wire
from lockstep.transport.shm.client import LocalConnection

CARTPOLE = env_spec("CartPole-v1")
T = 8  # steps per env per policy version
_ROGUE_IDS = itertools.count(60)  # a distinct actor id per hostile client


STRICT = {"ppo.steps_per_env": T}  # the learner of these tests: strict CartPole, one actor


@pytest.fixture
def learner(running_learner):
    return running_learner(STRICT, transport="shm")


class _Steps:
    """Steps with nothing finished and random observations, as ``LocalConnection.act`` takes them (``StepData``,
    what the actor's ``EnvLoop.outcome()`` returns)."""

    def __init__(self, num_envs: int, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.k = num_envs

    def next(self) -> StepData:
        k = self.k
        return StepData(obs=self.rng.standard_normal((k, 4)).astype(np.float32), reward=np.zeros(k, np.float32),
                        terminated=np.zeros(k, bool), truncated=np.zeros(k, bool),
                        final_index=np.zeros(0, np.int64), final_obs=np.zeros((0, 4), np.float32),
                        episode_return=np.zeros(0, np.float64), episode_length=np.zeros(0, np.int64))


# -- a raw client: frames by hand ---------------------------------------------------------------


def _raw(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.settimeout(20)
    sock.connect(path)
    return sock


def _send_hello(sock: socket.socket, hello: pb.Hello) -> None:
    body = hello.SerializeToString()
    sock.send(wire.HELLO.pack(wire.HELLO_MAGIC, len(body)))
    for start in range(0, len(body), wire.CHUNK):
        sock.send(body[start:start + wire.CHUNK])


def _welcomed(sock: socket.socket, hello: pb.Hello) -> wire.Region:
    """Say hello; map the shared memory of the welcome."""
    _send_hello(sock, hello)
    frame, fds, _, _ = socket.recv_fds(sock, wire.MAX_REPLY, 1)
    assert wire.REPLY.unpack_from(frame)[0] == wire.WELCOME and len(fds) == 1, frame
    try:
        return wire.Region(fds[0], wire.Layout(hello.num_envs, CARTPOLE.observation, CARTPOLE.action))
    finally:
        os.close(fds[0])


def _refusal(sock: socket.socket) -> tuple[str, str]:
    """The refusal the learner answers with, and that it closes the connection after it."""
    frame = sock.recv(wire.MAX_REPLY)
    kind, _ = wire.REPLY.unpack_from(frame)
    assert kind == wire.REFUSED, f"expected a refusal, got reply kind {kind}"
    assert sock.recv(wire.MAX_REPLY) == b"", "the learner kept the connection open after refusing it"
    sock.close()
    return wire.parse_refusal(frame[wire.REPLY.size:])


def _step_refused(path: str, write, m: int = 0, e: int = 0, frame: bytes | None = None) -> tuple[str, str]:
    """A client that says a good hello, writes a step with ``write(region)`` and sends its frame."""
    sock = _raw(path)
    region = _welcomed(sock, hello(actor_id=next(_ROGUE_IDS)))
    write(region)
    sock.send(frame if frame is not None else wire.STEP.pack(wire.STEP_KIND, m, e))
    region.close()
    return _refusal(sock)


def _nan(region: wire.Region) -> None:
    region.obs[1, 2] = np.nan


def _truncated_without_final_observation(region: wire.Region) -> None:
    region.truncated[1] = True


# -- tests --------------------------------------------------------------------------------------


def test_the_socket_and_its_folder_are_owner_only_and_removed_when_the_learner_stops(learner):
    folder = os.path.dirname(learner.socket_path)
    assert len(learner.socket_path.encode()) <= 100
    for path, mode in ((folder, 0o700), (learner.socket_path, 0o600)):
        info = os.stat(path)
        assert stat.S_IMODE(info.st_mode) == mode, (path, oct(info.st_mode))
        assert info.st_uid == os.getuid()
    assert stat.S_ISSOCK(os.stat(learner.socket_path).st_mode)
    assert os.listdir(folder) == ["learner.sock"]
    learner.stop()
    assert not os.path.exists(folder)


def test_actions_are_stamped_with_the_policy_version_and_training_over_closes(learner):
    """Strict: every step of phase v is answered by version v, as over gRPC (tests/integration/test_transport.py)."""
    phases = 3
    conn = LocalConnection(learner.address, hello(num_envs=3), connect_timeout=10)
    steps, stamps = _Steps(3), []
    try:
        assert conn.welcome.learner_run == "run"
        for _ in range(phases * T + 1):
            actions, version = conn.act(steps.next())
            assert actions.shape == (3,) and actions.dtype == np.int64 and set(actions.tolist()) <= {0, 1}
            stamps.append(version)
        assert stamps == [i // T for i in range(phases * T + 1)]
        learner.learner.stop()  # training over: the next step is answered "over", as a gRPC stream ends with OK
        with pytest.raises(LearnerClosed):
            for _ in range(10 * T):
                conn.act(steps.next())
    finally:
        conn.close()


def test_a_replaced_connection_is_refused_by_name(learner):
    old = LocalConnection(learner.address, hello(actor_id=5), connect_timeout=10)
    steps = _Steps(2)
    for _ in range(3):
        old.act(steps.next())
    new_run = uuid.uuid4().hex
    new = LocalConnection(learner.address, hello(actor_id=5, run_id=new_run), connect_timeout=10)
    assert new.act(steps.next())[1] == 0
    with pytest.raises(LearnerRefused) as err:
        old.act(steps.next())
    assert err.value.code == "FAILED_PRECONDITION" and "replaced" in err.value.message and new_run in err.value.message
    assert learner.learner.report.counters.dropped_transitions == 3 * 2
    new.close()
    old.close()


def test_an_actor_that_goes_away_while_its_request_is_held_leaves_at_once(running_learner):
    """Below --min-actors every step is held; closing the socket still ends the session (no step is due)."""
    running = running_learner({**STRICT, "learner.min_actors": 2}, transport="shm")
    sock = _raw(running.socket_path)
    region = _welcomed(sock, hello(actor_id=3))
    sock.send(wire.STEP.pack(wire.STEP_KIND, 0, 0))
    deadline = time.monotonic() + 10
    while running.learner.sessions.actor_ids != [3] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert running.learner.sessions.actor_ids == [3]
    region.close()
    sock.close()
    while running.learner.sessions.actor_ids and time.monotonic() < deadline:
        time.sleep(0.01)
    assert running.learner.sessions.actor_ids == []


def test_hostile_local_clients_are_refused_by_name_while_a_good_actor_trains(learner):
    actor = subprocess.Popen([*lockstep_cmd(), "actor", "--learner", learner.address, "--num-envs", "2",
                              "--actor-id", "0"], stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while learner.learner.trainer.iteration < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        before = learner.learner.trainer.iteration
        assert before >= 2

        refusals = []
        sock = _raw(learner.socket_path)
        sock.send(b"\xff\xff\xff garbage \x00\x01")
        refusals.append(_refusal(sock))
        sock = _raw(learner.socket_path)
        sock.send(wire.HELLO.pack(wire.HELLO_MAGIC, 7))
        sock.send(b"garbage")
        refusals.append(_refusal(sock))
        sock = _raw(learner.socket_path)
        _send_hello(sock, hello(actor_id=91, protocol=PROTOCOL + 1))
        refusals.append(_refusal(sock))
        sock = _raw(learner.socket_path)
        _send_hello(sock, hello(actor_id=92, observation=env_spec("Acrobot-v1").observation))
        refusals.append(_refusal(sock))
        refusals.append(_step_refused(learner.socket_path, lambda region: None, frame=b"\x00" * 5))
        refusals.append(_step_refused(learner.socket_path, lambda region: None, frame=wire.REPLY.pack(wire.ACTION, 0)))
        refusals.append(_step_refused(learner.socket_path, lambda region: None, m=3))
        refusals.append(_step_refused(learner.socket_path, lambda region: None, e=1000))
        refusals.append(_step_refused(learner.socket_path, _nan))
        refusals.append(_step_refused(learner.socket_path, _truncated_without_final_observation))

        expected = [
            ("FAILED_PRECONDITION", "the first message must be a hello header"),
            ("FAILED_PRECONDITION", "not a protobuf Hello"),
            ("FAILED_PRECONDITION", f"actor speaks protocol {PROTOCOL + 1}"),
            ("INVALID_ARGUMENT", "observation space Box(shape=(6,)"),
            ("INVALID_ARGUMENT", "a step frame of 5 bytes; expected 12"),
            ("FAILED_PRECONDITION", "expected a step frame, got kind 0x2"),  # a reply's frame: right size, wrong kind
            ("INVALID_ARGUMENT", "3 final observation(s) and 0 finished episode(s) in one step of 2 env(s)"),
            ("INVALID_ARGUMENT", "0 final observation(s) and 1000 finished episode(s)"),
            ("INVALID_ARGUMENT", "step.observation: 1 non-finite value(s)"),
            ("INVALID_ARGUMENT", "step.final_index: slot 1 was truncated but has no final observation"),
        ]
        for (code, message), (want_code, want) in zip(refusals, expected, strict=True):
            assert code == want_code and want in message, (code, message)

        while learner.learner.trainer.iteration < before + 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert learner.learner.trainer.iteration >= before + 3, "training stalled after the hostile clients"
        assert learner.learner.report.counters.off_policy_samples == 0
    finally:
        learner.stop()
        actor.wait(timeout=30)
    assert actor.returncode == 0, actor.stderr.read()


def test_a_client_that_says_nothing_is_dropped_after_the_hello_deadline(running_learner):
    running = running_learner({**STRICT, "learner.hello_timeout_s": 0.3}, transport="shm")
    code, message = _refusal(_raw(running.socket_path))
    assert code == "DEADLINE_EXCEEDED" and "no hello within 0.3 s (learner.hello_timeout_s)" in message


def test_a_region_larger_than_the_message_limit_is_refused_before_the_actor_joins(running_learner):
    running = running_learner({**STRICT, "learner.max_message_mb": 1}, transport="shm")
    sock = _raw(running.socket_path)
    _send_hello(sock, hello(actor_id=4, num_envs=60_000))  # 60k envs x 2 x 16-byte observations > 1 MB
    code, message = _refusal(sock)
    assert code == "INVALID_ARGUMENT" and "bytes of shared memory" in message and "max_message_mb" in message
    assert running.learner.sessions.actor_ids == []


def test_an_actor_with_the_wrong_array_is_stopped_before_it_writes_to_shared_memory(learner):
    conn = LocalConnection(learner.address, hello(num_envs=2), connect_timeout=10)
    step = _Steps(2).next()
    step.obs = np.zeros((2, 4), np.float64)
    with pytest.raises(LearnerRefused, match="step.observation: float64"):
        conn.act(step)
    conn.close()


def test_no_learner_at_the_address_is_a_connection_error(tmp_path):
    with pytest.raises(ConnectionError, match="no learner at unix:"):
        LocalConnection(f"unix:{tmp_path}/absent.sock", hello(), connect_timeout=2)


def test_socket_folders_of_learners_that_are_gone_are_removed_and_live_ones_kept(tmp_path, monkeypatch):
    from lockstep.transport.shm import server as shm

    monkeypatch.setattr(shm.tempfile, "tempdir", str(tmp_path))
    folders = {}
    for name, listening in (("gone", False), ("live", True)):
        folder = tmp_path / f"{shm.DIR_PREFIX}{name}"
        folder.mkdir(mode=0o700)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.bind(str(folder / shm.SOCKET_NAME))
        if listening:
            sock.listen(1)
        else:
            sock.close()  # as a learner killed with SIGKILL leaves it: the file, no listener
        os.utime(folder / shm.SOCKET_NAME, (time.time() - 120, time.time() - 120))
        folders[name] = (folder, sock)
    young = tmp_path / f"{shm.DIR_PREFIX}young"  # a learner between bind and listen
    young.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as unlistened:
        unlistened.bind(str(young / shm.SOCKET_NAME))
        shm._remove_stale_dirs()
    assert not folders["gone"][0].exists()
    assert folders["live"][0].exists() and young.exists()
    folders["live"][1].close()


def test_a_client_refused_with_frames_still_unread_is_told_why(learner):
    """A bad frame sent with more behind it (a client that does not wait for its replies): the learner refuses it
    and closes with those frames unread, which must not reset the connection before the refusal is read."""
    sock = _raw(learner.socket_path)
    region = _welcomed(sock, hello(actor_id=next(_ROGUE_IDS)))
    sock.send(b"\x00" * 8)  # no step frame, and two frames behind it
    try:
        sock.send(wire.STEP.pack(wire.STEP_KIND, 0, 0))
        sock.send(wire.STEP.pack(wire.STEP_KIND, 0, 0))
    except BrokenPipeError:  # the learner had refused and closed already: nothing was left unread, still told why
        pass
    time.sleep(0.5)  # the learner refuses and closes before the client reads
    region.close()
    code, message = _refusal(sock)
    assert code == "INVALID_ARGUMENT" and "a step frame of 8 bytes" in message, message
