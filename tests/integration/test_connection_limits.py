"""Connections cannot exhaust the learner: the hello deadline, idle gRPC connections closed, a cap on
connections, and the open-file limit raised to fit; against a real learner with real sockets.
"""

from __future__ import annotations

import queue
import re
import resource
import socket
import subprocess
import threading
import time

import grpc
import pytest
from conftest import lockstep_cmd

from lockstep import config as config_lib
from lockstep.learner.wiring import Learner
from lockstep.transport import SERVICE
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.grpc import security
from lockstep.transport.shm import layout as wire


class RunningLearner:
    """A CartPole learner in a thread (no actors: nothing here trains), with ``learner`` fields set."""

    def __init__(self, tmp_path, **learner_fields) -> None:
        config = config_lib.Config()
        config.run.progress = False
        config.actors.count = 1
        for key, value in learner_fields.items():
            setattr(config.learner, key, value)
        self.learner = Learner(config, tmp_path / "run")
        self.thread = threading.Thread(target=self.learner.serve)
        self.thread.start()
        self.port = self.learner.wait_ready(timeout=30)
        self.path = self.learner.local_address[len("unix:"):]

    def close(self) -> None:
        self.learner.stop()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()


def _stream(channel: grpc.Channel, token: str | None, timeout: float = 30.0):
    """A stream that sends nothing (its request iterator blocks until ``done`` is set)."""
    done = threading.Event()

    def requests():
        done.wait()
        return
        yield

    call = channel.stream_stream(f"/{SERVICE}/Connect", request_serializer=pb.ActorMessage.SerializeToString,
                                 response_deserializer=pb.LearnerMessage.FromString)
    return call(requests(), timeout=timeout, metadata=security.metadata(token)), done


def _refusal(sock: socket.socket) -> tuple[str, str]:
    frame = sock.recv(wire.MAX_REPLY)
    assert frame, "closed without a refusal"
    kind, _ = wire.REPLY.unpack_from(frame)
    assert kind == wire.REFUSED, kind
    return wire.parse_refusal(frame[wire.REPLY.size:])


def test_connections_that_say_nothing_are_closed_at_the_hello_deadline(tmp_path):
    running = RunningLearner(tmp_path, hello_timeout_s=0.5)
    channel = grpc.insecure_channel(f"127.0.0.1:{running.port}")
    try:
        raw = socket.create_connection(("127.0.0.1", running.port), timeout=20)  # never speaks HTTP/2
        while raw.recv(1024):  # the server's SETTINGS frame, then the end (a timeout: it was kept)
            pass
        raw.close()

        call, done = _stream(channel, running.learner.token)  # a stream that never says hello
        with pytest.raises(grpc.RpcError) as refused:
            next(call)
        done.set()
        assert refused.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "no hello within 0.5 s (learner.hello_timeout_s)" in refused.value.details()

        states: queue.SimpleQueue = queue.SimpleQueue()  # an HTTP/2 connection with no stream is closed
        channel.subscribe(states.put, try_to_connect=True)
        seen, deadline = [], time.monotonic() + 20
        while grpc.ChannelConnectivity.IDLE not in seen[1:] and time.monotonic() < deadline:
            try:
                seen.append(states.get(timeout=1))
            except queue.Empty:
                pass
        assert grpc.ChannelConnectivity.READY in seen and seen[-1] == grpc.ChannelConnectivity.IDLE, seen
    finally:
        channel.close()
        running.close()


def test_connections_beyond_the_cap_are_refused_by_name(tmp_path):
    running = RunningLearner(tmp_path, max_connections=3)
    local = [socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(4)]
    channel = grpc.insecure_channel(f"127.0.0.1:{running.port}")
    streams = []
    try:
        for sock in local:
            sock.settimeout(20)
            sock.connect(running.path)
        code, message = _refusal(local[3])
        assert code == "RESOURCE_EXHAUSTED" and "at most 3 connections" in message and "max_connections" in message
        local[0].settimeout(0.5)
        with pytest.raises(TimeoutError):  # the first three are served (waiting for their hello)
            local[0].recv(wire.MAX_REPLY)

        streams = [_stream(channel, running.learner.token) for _ in range(4)]
        deadline = time.monotonic() + 20
        while not any(call.done() for call, _ in streams) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # a second refusal would come as fast
        refused = [call for call, _ in streams if call.done()]
        assert len(refused) == 1, "expected exactly the fourth stream refused"
        assert refused[0].code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "at most 3 actor streams" in refused[0].details()
    finally:
        for _, done in streams:
            done.set()
        for sock in local:
            sock.close()
        channel.close()
        running.close()


IDLE = 1_100  # idle connections, more than a common soft open-file limit (1024) allows


def _lower_open_files() -> None:
    """In the learner's process: the soft open-file limit most systems start a shell with."""
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))


def test_a_thousand_idle_connections_leave_checkpoints_written_and_the_run_finishes(tmp_path, free_port):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < IDLE + 256:  # this process holds the client ends
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, IDLE + 512), hard))
    run_dir = tmp_path / "run"
    learner = subprocess.Popen(
        [*lockstep_cmd(), "train", "--env", "CartPole-v1", "--actors", "2", "--envs-per-actor", "2",
         "--steps-per-env", "64", "--total-steps", str(256 * 25), "--checkpoint-every", "1", "--no-progress",
         "--listen", f"127.0.0.1:{free_port}", "--run-dir", str(run_dir)],
        stderr=subprocess.PIPE, text=True, preexec_fn=_lower_open_files)
    lines: list[str] = []
    listening = threading.Event()

    def read() -> None:
        for line in learner.stderr:
            lines.append(line)
            if "listening on port" in line:
                listening.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    held: list[socket.socket] = []
    try:
        assert listening.wait(60), "".join(lines)
        path = re.search(r"and unix:(\S+),", next(line for line in lines if "listening on port" in line)).group(1)
        for i in range(IDLE):
            if i % 2:
                sock = socket.create_connection(("127.0.0.1", free_port), timeout=10)
            else:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                sock.connect(path)
            held.append(sock)
        checkpoints = run_dir / "checkpoints"
        at_full = {p.name for p in checkpoints.glob("*.pt")} if checkpoints.exists() else set()
        assert learner.wait(timeout=120) == 0, "".join(lines[-30:])
    finally:
        for sock in held:
            sock.close()
        if learner.poll() is None:
            learner.kill()
            learner.wait()
    written = {p.name for p in (run_dir / "checkpoints").glob("*.pt")}
    assert "final.pt" in written and written - at_full - {"final.pt"}, (at_full, written)
    assert (run_dir / "summary.json").exists()
