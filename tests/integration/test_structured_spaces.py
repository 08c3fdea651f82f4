"""A Dict observation end to end: real actor processes over shared memory and over gRPC, a real learner,
``lockstep audit`` on the trail; and a learner that refuses a hello whose Dict differs, naming the leaf."""

from __future__ import annotations

import shutil
from pathlib import Path

import grpc
import gymnasium as gym
import numpy as np
import pytest
from conftest import learner_config
from protocol import empty_step, hello
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lockstep import config as config_lib
from lockstep.envs import SpaceSpec, env_spec, stack_records
from lockstep.launch.local import train
from lockstep.learner import checkpoint
from lockstep.observe.run_dir import RunDir
from lockstep.tools import audit
from lockstep.tools.eval import evaluate
from lockstep.transport.grpc.client import Connection, LearnerRefused
from lockstep.transport.shm.client import LocalConnection

GLIMPSE = "lockstep.envs.tasks:Glimpse"  # image (uint8), clock (float32 vector) and step (Discrete) leaves


@pytest.mark.parametrize("transport", ["shm", "grpc"])
def test_a_dict_observation_trains_end_to_end_and_passes_the_audit(tmp_path, transport):
    config = learner_config({"env.id": GLIMPSE, "env.normalize_obs": True, "actors.count": 2,
                             "actors.envs_per_actor": 2, "actors.transport": transport, "ppo.steps_per_env": 32,
                             "ppo.total_steps": 1024, "model.hidden": [16], "learner.device": "cpu",
                             "run.audit": True})
    run_dir = tmp_path / "run"
    config.run.run_dir = str(run_dir)
    train(config, run_dir)
    rows = RunDir(run_dir).metrics()
    assert [int(r["env_steps"]) for r in rows] == [128 * i for i in range(1, 9)]
    report = audit.check(run_dir)
    assert report.exit_code == 0 and report.differing == 0 and report.samples == 1024
    # each leaf of the trail is its own array, in its own dtype
    with np.load(run_dir / "audit" / "batch_000001.npz") as batch:
        assert {name: batch[name].dtype.name for name in batch.files if name.startswith("obs")} == {
            "obs/clock": "float32", "obs/image": "uint8", "obs/step": "int64"}


@pytest.mark.parametrize("transport", ["grpc", "shm"])
def test_a_hello_whose_dict_differs_is_refused_naming_the_leaf(running_learner, transport):
    learner = running_learner({"env.id": GLIMPSE}, transport=transport)
    ours = env_spec(GLIMPSE).observation
    wider = gym.spaces.Dict({"image": gym.spaces.Box(0, 255, (1, 5, 5), np.uint8),
                             "clock": gym.spaces.Box(0.0, 1.0, (3,), np.float32), "step": gym.spaces.Discrete(8)})
    without_step = SpaceSpec.from_space(wider, ["image", "clock"])
    for theirs, named in ((SpaceSpec.from_space(wider), "leaf 'clock': Box(shape=(3,)"),
                          (without_step, "has no leaf 'step'")):
        assert ours.mismatch(theirs)
        message = hello(env_id=GLIMPSE, observation=theirs)
        if transport == "grpc":
            with pytest.raises(grpc.RpcError) as err:
                Connection(learner.address, message, connect_timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            details = err.value.details()
        else:
            with pytest.raises(LearnerRefused) as refused:
                LocalConnection(learner.address, message, connect_timeout=10)
            details = refused.value.message
        assert "observation space" in details and named in details, details
    connect = Connection if transport == "grpc" else LocalConnection  # the learner serves on: the same Dict joins
    connect(learner.address, hello(env_id=GLIMPSE), connect_timeout=10).close()


def _config(env_id: str, transport: str, **overrides) -> config_lib.Config:
    return learner_config({"env.id": env_id, "actors.count": 2, "actors.envs_per_actor": 4,
                           "actors.transport": transport, "ppo.steps_per_env": 32, "ppo.total_steps": 4096,
                           "model.hidden": [16], "learner.device": "cpu", **overrides})


def test_a_multidiscrete_action_learns_the_rewarded_combination(tmp_path):
    # Combination pays 1 a step for the action [2, 1] of MultiDiscrete([3, 4]): chance 8 / 12 a game, at most 8
    # (seeds 1 and 2 reach 7.2 and 7.1 in 4,096 steps)
    config = _config("lockstep.envs.tasks:Combination", "inprocess", **{"ppo.lr": 0.003})
    summary = train(config, tmp_path / "run")
    assert summary["episode_return_mean"] > 4.0, summary["episode_return_mean"]
    # each dimension's entropy is reported (TensorBoard), falling as its Categorical settles on its choice
    events = EventAccumulator(str(tmp_path / "run"))
    events.Reload()
    for dimension, choices in (("[0]", 3), ("[1]", 4)):
        entropy = [e.value for e in events.Scalars(f"lockstep/entropy/{dimension}")]
        assert len(entropy) == 16 and entropy[0] <= np.log(choices) and entropy[-1] < 0.5 * entropy[0], entropy


def test_a_dict_action_of_discrete_box_and_multibinary_parts_trains_over_grpc_and_passes_the_audit(tmp_path):
    run_dir = tmp_path / "run"
    config = _config("lockstep.envs.tasks:Knobs", "grpc", **{"ppo.total_steps": 1024, "run.audit": True})
    summary = train(config, run_dir)
    assert summary["env_steps"] == 1024
    report = audit.check(run_dir)
    assert report.exit_code == 0 and report.differing == 0 and report.samples == 1024
    with np.load(run_dir / "audit" / "batch_000001.npz") as batch:
        assert batch["actions"].shape == (32, 8, 4) and batch["actions"].dtype == np.float32


@pytest.fixture(scope="module")
def masked_run(tmp_path_factory) -> Path:
    """Forbidden (an action_mask leaf over Discrete(5)) over shared memory with the audit trail: 4 iterations."""
    run_dir = tmp_path_factory.mktemp("masked") / "run"
    train(_config("lockstep.envs.tasks:Forbidden", "shm", **{"ppo.total_steps": 1024, "run.audit": True}), run_dir)
    return run_dir


def test_a_masked_run_never_takes_a_forbidden_action_and_passes_the_audit(masked_run):
    report = audit.check(masked_run)
    assert report.exit_code == 0 and report.differing == 0 and report.samples == 1024
    for path in sorted((masked_run / "audit").glob("batch_*.npz")):
        with np.load(path) as batch:
            mask, actions = batch["obs/action_mask"], batch["actions"]  # [T, N, 5], [T, N]
            assert mask[..., 0].dtype == np.int8 and (np.take_along_axis(mask, actions[..., None], -1) == 1).all()


def test_the_audit_fails_when_a_stored_mask_is_changed(masked_run, tmp_path):
    run_dir = Path(shutil.copytree(masked_run, tmp_path / "copy"))
    path = run_dir / "audit" / "batch_000002.npz"
    with np.load(path) as batch:
        arrays = {name: batch[name] for name in batch.files}
    mask = arrays["obs/action_mask"].copy()
    t, n = 3, 1
    allowed = np.flatnonzero(mask[t, n])
    others = [a for a in allowed if a != arrays["actions"][t, n]]
    mask[t, n, others[0] if others else (arrays["actions"][t, n] + 1) % 5] ^= 1  # allow or forbid one more
    np.savez_compressed(path, **{**arrays, "obs/action_mask": mask})
    report = audit.check(run_dir)
    assert report.iteration(2).differing == 1 and report.iteration(1).differing == 0
    assert report.exit_code == 1 and audit.main(str(run_dir)) == 1


def test_a_step_whose_mask_allows_nothing_is_refused_naming_the_slot(running_learner):
    learner = running_learner({"env.id": "lockstep.envs.tasks:Forbidden", "actors.envs_per_actor": 2})
    spec = env_spec("lockstep.envs.tasks:Forbidden").observation
    conn = Connection(learner.address, hello(env_id="lockstep.envs.tasks:Forbidden"), connect_timeout=10)
    obs = stack_records([{"action_mask": np.array(m, np.int8), "clock": np.zeros(1, np.float32)}
                         for m in ([0, 1, 0, 0, 0], [0, 0, 0, 0, 0])], spec)
    with pytest.raises(grpc.RpcError) as err:
        conn.step(empty_step(obs), np.int64, ())
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "leaf 'action_mask': env slot 1 allows no action" in err.value.details()
    conn.close()
    Connection(learner.address, hello(env_id="lockstep.envs.tasks:Forbidden"), connect_timeout=10).close()


def test_a_recurrent_policy_on_a_dict_observation_is_evaluated_from_its_checkpoint_and_while_training(tmp_path):
    # per-leaf normalization statistics go into the checkpoint and come back for `lockstep eval`, and to the
    # evaluation process (run.eval_every), which plays the Dict observation as `lockstep eval` does
    config = _config(GLIMPSE, "inprocess", **{"ppo.total_steps": 512, "model.lstm_size": 8, "env.normalize_obs": True,
                                              "run.eval_every": 1, "run.eval_episodes": 2})
    summary = train(config, tmp_path / "run")
    assert summary["evaluation"]["finished"] >= 1, summary["evaluation"]
    best = checkpoint.load(tmp_path / "run" / "checkpoints" / "best.pt")
    assert best["eval"]["episodes"] == 2 and list(best["trainer"]["obs_rms"]["leaves"]) == ["clock"]
    stored = checkpoint.load(tmp_path / "run" / "checkpoints" / "final.pt")["trainer"]["obs_rms"]
    assert list(stored["leaves"]) == ["clock"]  # the vector leaf; neither the image nor the Discrete leaf
    report = evaluate(tmp_path / "run", episodes=2, deterministic=True)
    assert [e.length for e in report.episodes] == [8, 8]
