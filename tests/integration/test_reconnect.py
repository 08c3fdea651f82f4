"""An actor that notices a broken connection before the learner does reconnects and trains on.

A TCP proxy between a real actor process and a real learner cuts the actor's side of
the connection and keeps the learner's side open, so the learner still holds the old
session (it would notice only through keepalive, seconds later) when the actor says
hello again with the same actor id and a new run id.
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
import uuid

import grpc
import numpy as np
import pytest
from conftest import lockstep_cmd
from protocol import empty_step, hello

from lockstep.transport.grpc.client import Connection

pytestmark = pytest.mark.slow


class CuttingProxy:
    """Forwards TCP connections to ``upstream``; ``cut()`` closes the client sides only."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.client_sides: list[socket.socket] = []
        self.learner_sides: list[socket.socket] = []
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            self.client_sides.append(client)
            self.learner_sides.append(server)
            self.connections += 1
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass

    def cut(self) -> None:
        """The actor sees its connection reset; the learner sees nothing (no FIN, no RST reaches it)."""
        for s in self.client_sides:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            s.close()
        self.client_sides.clear()

    def close(self) -> None:
        self.listener.close()
        for s in self.client_sides + self.learner_sides:
            s.close()


STRICT = {"ppo.steps_per_env": 16, "learner.min_actors": 1}  # the learner these tests reach over real gRPC


def _train_through_a_cut(running_learner, envs: int, *flags: str, **overrides) -> tuple[str, int, list[int]]:
    """A real actor of ``envs`` envs trains through the proxy, which cuts it once the learner has trained 3
    iterations; the run must end as if nothing happened. The actor's output, the proxy's connections and the
    members the learner saw before the cut."""
    running = running_learner({**STRICT, "ppo.total_steps": envs * 16 * 30, **overrides})
    learner = running.learner
    proxy = CuttingProxy(running.port)
    actor = subprocess.Popen([*lockstep_cmd(), "actor", "--learner", f"127.0.0.1:{proxy.port}", "--num-envs",
                              str(envs), "--actor-id", "0", "--retry-for", "30", *flags],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while learner.trainer.iteration < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert learner.trainer.iteration >= 3
        members = sorted(learner.sessions.actor_ids)
        proxy.cut()
        out, _ = actor.communicate(timeout=120)
        running.wait_finished(timeout=60)
    finally:
        actor.kill()
        proxy.close()
    assert actor.returncode == 0, out
    assert learner.error is None
    assert learner.trainer.env_steps >= envs * 16 * 30
    counters = learner.report.counters
    assert counters.off_policy_samples == 0
    assert counters.transitions_collected == learner.trainer.env_steps + counters.dropped_transitions
    return out, proxy.connections, members


def test_actor_that_reconnects_before_the_learner_noticed_replaces_its_old_session(running_learner):
    out, connections, _ = _train_through_a_cut(running_learner, 2)
    assert connections >= 2 and "reconnecting" in out


def test_an_actor_of_two_splits_reconnects_both_groups_and_trains_on(running_learner):
    """Its groups' streams share one TCP connection to the learner (gRPC's channels to one address do), which the
    proxy cuts: both groups say hello again as their members, with new run ids, and replace their old sessions."""
    out, connections, members = _train_through_a_cut(running_learner, 4, "--splits", "2", **{"learner.min_actors": 2})
    assert members == [0, 1]
    assert connections >= 2 and out.count("reconnecting") == 1 and "actor 0 (members 0, 1)" in out


def test_the_replaced_connection_is_refused_by_name_and_its_unroll_dropped(running_learner):
    running = running_learner(STRICT)
    old = Connection(running.address, hello(actor_id=5, run_id=uuid.uuid4().hex), connect_timeout=10)
    for _ in range(3):
        old.step(empty_step(np.zeros((2, 4), np.float32)), np.int64, ())
    new_run = uuid.uuid4().hex
    new = Connection(running.address, hello(actor_id=5, run_id=new_run), connect_timeout=10)
    _, version = new.step(empty_step(np.zeros((2, 4), np.float32)), np.int64, ())
    assert version == 0
    with pytest.raises(grpc.RpcError) as err:
        old.step(empty_step(np.zeros((2, 4), np.float32)), np.int64, ())
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "replaced" in err.value.details() and new_run in err.value.details()
    assert running.learner.report.counters.dropped_transitions == 3 * 2
    assert running.learner.sessions.actor_ids == [5]
    new.close()
    old.close()
