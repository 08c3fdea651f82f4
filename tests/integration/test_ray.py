"""``lockstep train --launcher ray``: Ray actors on a Ray instance on this host, with real processes.

The end-to-end test starts its own Ray instance, as ``lockstep train --launcher ray`` does; the kill test
joins a Ray head started once for the module (``--ray-address``). Both run on loopback with 2 CPUs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import lockstep_cmd

from lockstep import config as config_lib
from lockstep.launch.ray import INSTALL, RayActors
from lockstep.launch.restart import RestartPolicy
from lockstep.observe.run_dir import RunDir

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason=f"Ray is not installed ({INSTALL})")

# A Ray head on loopback that lives until its stdin closes; it prints its address when it is up.
HEAD = """
import shutil, sys, tempfile, ray
temp_dir = tempfile.mkdtemp(prefix="lockstep-ray-test-", dir="/tmp")
ray.init(address="local", num_cpus=2, _node_ip_address="127.0.0.1", include_dashboard=False, _temp_dir=temp_dir)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
ray.shutdown()
shutil.rmtree(temp_dir, ignore_errors=True)
"""

# Short phases of few envs, and one gradient step per phase: collection takes most of each phase.
RUN = ["--config", "cartpole-cleanrl", "--actors", "2", "--envs-per-actor", "2", "--no-progress",
       "--set", "ppo.epochs=1", "--set", "ppo.minibatches=1"]


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """The address of a Ray head with 2 CPUs, and the environment that joins it (its own Ray token)."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    log = tmp_path_factory.mktemp("ray-head") / "head.log"
    with log.open("w") as err:
        head = subprocess.Popen([sys.executable, "-c", HEAD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err, text=True, env=env)
    try:
        address = head.stdout.readline().strip()
        assert address, log.read_text()
        yield address, env
    finally:
        head.stdin.close()
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            head.kill()


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _worker_pids(out: str) -> dict[int, int]:
    return {int(a): int(p) for a, p in re.findall(r"actor (\d+) runs in Ray worker pid (\d+)", out)}


@needs_ray
@pytest.mark.slow
def test_train_on_a_ray_instance_of_its_own_collects_the_actors_logs_and_leaves_nothing_behind(tmp_path):
    # the actors' custom resource (for a cluster's nodes): the instance started for the run offers enough of it
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [*lockstep_cmd(), "train", "--launcher", "ray", "--ray-num-cpus", "2", "--ray-resources", "{actor_host: 0.5}",
         *RUN, "--steps-per-env", "32",
         "--total-steps", str(4 * 32 * 4), "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=240, env={**os.environ, "RAY_ADDRESS": ""})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    summary = _summary(run_dir)
    assert summary["iterations"] == 4 and summary["env_steps"] == 4 * 32 * 4
    assert summary["off_policy_samples"] == 0 and summary["actor_restarts"] == 0
    for actor in (0, 1):  # forwarded by Ray to the driver's stderr, prefixed with the actor's name
        assert re.search(rf"\(lockstep-actor-{actor} pid=\d+\).*lockstep.actor INFO actor {actor}: connected", out)
        assert f"actor {actor} finished" in out
    assert sorted(_worker_pids(out)) == [0, 1]
    worker_logs = "".join(p.read_text() for p in run_dir.glob("ray-logs/session_*/worker-*.err"))
    assert "actor 0: connected" in worker_logs and "actor 1: connected" in worker_logs
    temp_dir = re.search(r"its files in (\S+)\)", out).group(1)
    assert not Path(temp_dir).exists()


@needs_ray
@pytest.mark.slow
def test_a_ray_actor_killed_mid_phase_is_restarted_by_ray_and_its_unroll_is_dropped(tmp_path, ray_head):
    address, env = ray_head
    run_dir, log = tmp_path / "run", tmp_path / "train.log"
    steps = 128
    with log.open("w") as out_file:
        proc = subprocess.Popen(  # a budget no run reaches here: it is stopped once the restart has been counted
            [*lockstep_cmd(), "train", "--launcher", "ray", "--ray-address", address, *RUN,
             "--steps-per-env", str(steps), "--total-steps", str(4 * steps * 10_000), "--run-dir", str(run_dir)],
            stdout=out_file, stderr=subprocess.STDOUT, env=env)
    killed = []
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and (len(_worker_pids(log.read_text())) < 2 or not RunDir(run_dir).metrics()):
            time.sleep(0.1)
        pids = _worker_pids(log.read_text())
        assert len(pids) == 2 and RunDir(run_dir).metrics(), log.read_text()
        # A kill lands mid-unroll unless that actor had finished its part of the phase: then try the other one.
        for actor in (0, 1):
            rows = RunDir(run_dir).metrics()
            time.sleep(0.3 * float(rows[-1]["collect_s"]))  # into the next phase's collection
            os.kill(pids[actor], signal.SIGKILL)
            killed.append(actor)
            while time.monotonic() < deadline and len(RunDir(run_dir).metrics()) < len(rows) + 2:
                time.sleep(0.1)
            if sum(int(r["dropped_transitions"]) for r in RunDir(run_dir).metrics()) > 0:
                break
        # however long Ray takes to bring the workers back (on a busy host, many seconds): each restart is
        # counted, then a phase trains with it
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and log.read_text().count("restarted by Ray") < len(killed):
            time.sleep(0.1)
        rows = len(RunDir(run_dir).metrics())
        while time.monotonic() < deadline and len(RunDir(run_dir).metrics()) < rows + 1:
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        proc.kill()
    out = log.read_text()
    assert proc.returncode == 128 + signal.SIGTERM, out
    summary = _summary(run_dir)
    assert summary["off_policy_samples"] == 0
    assert summary["dropped_transitions"] > 0, out
    assert summary["transitions_collected"] == summary["transitions_trained"] + summary["dropped_transitions"]
    assert summary["actor_restarts"] == len(killed), out
    for actor in killed:
        assert re.search(rf"actor {actor} restarted by Ray \(restart 1 of at most 10\): worker pid \d+", out), out


def test_the_module_that_ray_workers_import_loads_no_torch():
    code = "import sys, lockstep.launch.ray_actor; print('torch' in sys.modules, 'ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_without_ray_the_launcher_names_the_line_that_installs_it(tmp_path, monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    config = config_lib.Config()
    config.actors.launcher = "ray"
    with pytest.raises(config_lib.ConfigError, match=re.escape("pip install -e '.[ray]'")):
        RayActors(config, tmp_path, None, RestartPolicy(10))


@needs_ray
def test_a_ray_instance_too_small_for_the_actors_is_refused_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    config = config_lib.Config()
    config.actors.count, config.actors.ray_num_cpus, config.actors.ray_cpus_per_actor = 4, 2, 1.0
    with pytest.raises(config_lib.ConfigError, match="cannot place 4 actors"):
        RayActors(config, tmp_path, None, RestartPolicy(10))


@needs_ray
def test_ray_resources_naming_one_of_rays_own_are_refused_before_anything_starts(tmp_path):
    """Amounts Ray cannot reserve (0, not a number) are the config's to refuse (test_config); a resource of Ray's
    own is the launcher's."""
    config = config_lib.Config()
    config_lib.set_value(config, "actors.ray_resources", {"CPU": 1})
    with pytest.raises(config_lib.ConfigError, match="names CPU, one of Ray's own resources: give custom resources"):
        RayActors(config, tmp_path, None, RestartPolicy(10))
