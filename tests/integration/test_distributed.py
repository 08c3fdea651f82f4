"""Several learners with torch.distributed (gloo on the CPU): each rank serves its own actors, the ranks
train one policy. Checked: a rank with no samples takes part in the update without changing it (the
result equals one learner's update on the other rank's batch, bit for bit); the statistics and the
step count are the run's; ``torchrun`` with 2 ranks x 2 actors trains strictly on-policy, every rank's
audit passes and the parameters are identical on both ranks after every update."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from conftest import unused_port

from lockstep.config import Config
from lockstep.envs import EnvSpec, SpaceSpec
from lockstep.learner.distributed import ParametersDiverged, Ranks
from lockstep.learner.rollout import Unroll, assemble
from lockstep.learner.trainer import Trainer
from lockstep.tools import audit

OBS = SpaceSpec("box", (3,), "float32", low=np.full(3, -np.inf, np.float32), high=np.full(3, np.inf, np.float32))
SPEC = EnvSpec("test", OBS, SpaceSpec("discrete", (), "int64", n=2))


def _config() -> Config:
    config = Config()
    config.model.hidden = [8]
    config.ppo.epochs, config.ppo.minibatches = 2, 2
    config.env.normalize_obs = config.env.normalize_reward = True
    return config


def _batch(seed: int, slots: int = 3, steps: int = 8):
    rng = np.random.default_rng(seed)
    u = Unroll(0, slots, steps, (3,), np.dtype(np.float32), (), np.dtype(np.int64))
    for t in range(steps):
        u.record_action(t, rng.normal(size=(slots, 3)), rng.integers(0, 2, slots), rng.normal(size=slots) - 1,
                        rng.normal(size=slots), 0)
        u.record_outcome(t, rng.normal(size=slots), rng.random(slots) < 0.1, np.zeros(slots, bool),
                         np.zeros(0, np.int64), np.zeros((0, 3)))
    u.finish(rng.normal(size=(slots, 3)))
    return assemble(0, [u])


def _rank_main(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                      GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    ranks = Ranks.from_env(torch.device("cpu"), timeout_s=60)
    trainer = Trainer(_config(), SPEC, torch.device("cpu"), ranks=ranks)
    if rank == 0:
        stats = trainer.train(_batch(1))
    else:  # this rank's phase closed empty: it takes part with no samples
        stats = trainer.train_empty()
    result = {"model": {k: v.clone() for k, v in trainer.model.state_dict().items()}, "obs_mean": trainer.obs_rms.mean,
              "env_steps": trainer.env_steps, "samples": stats.samples, "checks": ranks.checks,
              "reward_var": trainer.reward_scaler.rms.var}
    if rank == 1:  # then one rank's parameters drift: every rank must notice at the next comparison
        with torch.no_grad():
            next(trainer.model.parameters())[0].add_(1e-6)
    try:
        ranks.check_identical(trainer.model)
    except ParametersDiverged as err:
        result["diverged"] = str(err)
    torch.save(result, Path(out) / f"rank{rank}.pt")
    ranks.close()


def test_an_empty_rank_takes_part_without_changing_the_update(tmp_path):
    mp.spawn(_rank_main, args=(unused_port(), str(tmp_path)), nprocs=2, join=True)
    single = Trainer(_config(), SPEC, torch.device("cpu"))  # one learner, the same batch
    single.train(_batch(1))
    got = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    for r in got:
        for name, tensor in single.model.state_dict().items():
            assert torch.equal(r["model"][name], tensor), name  # bit for bit: the empty rank adds nothing
        np.testing.assert_array_equal(r["obs_mean"], single.obs_rms.mean)  # statistics of the run's samples
        np.testing.assert_array_equal(r["reward_var"], single.reward_scaler.rms.var)
        assert r["env_steps"] == 24 and r["checks"] == 1  # the run's env steps; parameters compared once
    assert [r["samples"] for r in got] == [24, 0]
    assert all("parameters differ" in r.get("diverged", "") for r in got)


@pytest.mark.slow
def test_torchrun_two_learners_train_one_policy_on_policy(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    torchrun = Path(sys.executable).with_name("torchrun")
    result = subprocess.run(
        [str(torchrun), "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(unused_port()),
         "-m", "lockstep", "train", "--config", "cartpole-cleanrl", "--transport", "shm", "--steps-per-env", "32",
         "--total-steps", str(2 * 4 * 32 * 4), "--audit", "--no-progress", "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log
    summaries = [json.loads((run_dir / f"rank{r}" / "summary.json").read_text()) for r in (0, 1)]
    for rank, summary in enumerate(summaries):
        assert summary["ranks"] == {"rank": rank, "world": 2, "identical_parameter_checks": 4}
        assert summary["env_steps"] == 1024 and summary["transitions_trained"] == 512  # the run's, this rank's
        assert summary["off_policy_samples"] == 0
        report = audit.check(run_dir / f"rank{rank}")
        assert report.exit_code == 0 and len(report.iterations) == 4, audit.format_report(report)
    models = [torch.load(run_dir / f"rank{r}" / "checkpoints" / "final.pt", weights_only=False)["trainer"]["model"]
              for r in (0, 1)]
    assert all(torch.equal(models[0][k], models[1][k]) for k in models[0])
    with np.load(run_dir / "rank0" / "audit" / "batch_000001.npz") as a, \
            np.load(run_dir / "rank1" / "audit" / "batch_000001.npz") as b:
        assert not np.array_equal(a["obs"], b["obs"])  # each rank's actors saw their own envs
