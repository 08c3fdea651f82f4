"""An actor in another language trains against a real learner: the protocol of docs/protocol.md is enough.

examples/node-actor/actor.js shares no code with lockstep: it loads lockstep.proto with Node's gRPC packages and
steps CartPole written in JavaScript. Here a real ``lockstep learner`` (strict, with its audit trail) trains on
its steps alone, to a return far above a random policy's (~22), and ``lockstep audit`` passes on every batch.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
from conftest import lockstep_cmd

NODE_ACTOR = Path(__file__).resolve().parents[2] / "examples" / "node-actor"
TOKEN = "node-actor-secret"
pytestmark = pytest.mark.slow

STEPS = 32 * 16 * 64  # the cartpole-fast preset's phase (32 envs x T 16), 64 versions


def _node_actor_ready() -> None:
    if shutil.which("node") is None:
        pytest.skip("node is not installed: install Node.js 18 or newer, then `npm ci --prefix examples/node-actor`")
    if not (NODE_ACTOR / "node_modules" / "@grpc" / "grpc-js").is_dir():
        pytest.skip("examples/node-actor is not built: `npm ci --prefix examples/node-actor` (make install-all does)")


def _start_learner(run_dir: Path, port: int) -> tuple[subprocess.Popen, list[str], threading.Event]:
    learner = subprocess.Popen(
        [*lockstep_cmd(), "learner", "--config", "cartpole-fast", "--listen", f"127.0.0.1:{port}", "--token", TOKEN,
         "--min-actors", "1", "--total-steps", str(STEPS), "--sync", "strict", "--audit", "--no-progress",
         "--device", "cpu", "--run-dir", str(run_dir)],
        stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    listening = threading.Event()

    def read() -> None:
        for line in learner.stderr:
            lines.append(line)
            if "listening on port" in line:
                listening.set()

    threading.Thread(target=read, daemon=True).start()
    return learner, lines, listening


def test_a_node_actor_trains_cartpole_strictly_and_the_audit_passes(tmp_path, free_port):
    _node_actor_ready()
    run_dir = tmp_path / "run"
    learner, lines, listening = _start_learner(run_dir, free_port)
    try:
        assert listening.wait(120), "".join(lines)
        actor = subprocess.run(["node", "actor.js", "--learner", f"127.0.0.1:{free_port}", "--token", TOKEN,
                                "--num-envs", "32"], cwd=NODE_ACTOR, capture_output=True, text=True, timeout=300)
        assert actor.returncode == 0, actor.stderr
        assert "the learner finished training" in actor.stderr
        assert learner.wait(timeout=120) == 0, "".join(lines[-30:])
    finally:
        if learner.poll() is None:
            learner.kill()
            learner.wait()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env_steps"] == STEPS
    assert summary["episode_return_mean"] > 100, summary["episode_return_mean"]  # random play: ~22
    audit = subprocess.run([*lockstep_cmd(), "audit", str(run_dir)], capture_output=True, text=True, timeout=300)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert "PASS" in audit.stdout

