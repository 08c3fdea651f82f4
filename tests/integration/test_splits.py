"""An actor of ``actors.splits`` S is, to the learner, S actors: S members, each its own slots of the rollout,
seeded by its own id, with the same audit and the same bitwise-repeatable strict run.

Real ``lockstep train`` runs (learner and actor processes over shared memory or gRPC, CartPole), read back from
their run directories: metrics.csv, the audit's batches and ``lockstep audit``'s verdict.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import lockstep_cmd
from lockstep_bench import repro

from lockstep import actor
from lockstep.envs import SpaceSpec, action_spec, env_seeds, make_vector_env
from lockstep.observe.run_dir import RunDir
from lockstep.tools import audit

pytestmark = pytest.mark.slow

T, ITERATIONS, SEED = 16, 5, 3


def _train(run_dir: Path, *flags: str) -> list[dict]:
    """A strict CartPole run of ``ITERATIONS`` iterations of 4 envs x ``T`` steps; its metrics.csv rows."""
    result = subprocess.run([
        *lockstep_cmd(), "train", "--env", "CartPole-v1", "--steps-per-env", str(T),
        "--total-steps", str(4 * T * ITERATIONS), "--sync", "strict", "--seed", str(SEED), "--no-progress",
        "--run-dir", str(run_dir), *flags,
    ], capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return RunDir(run_dir).metrics()


def test_an_actor_of_two_splits_is_two_members_with_their_own_slots_and_passes_its_audit(tmp_path, capsys):
    run_dir = tmp_path / "run"
    rows = _train(run_dir, "--transport", "shm", "--actors", "1", "--envs-per-actor", "4", "--splits", "2",
                  "--audit")
    assert [int(r["actors"]) for r in rows] == [2] * ITERATIONS  # members, as the learner counts them
    assert int(rows[-1]["env_steps"]) == 4 * T * ITERATIONS and int(rows[-1]["off_policy_samples"]) == 0

    with np.load(run_dir / "audit" / "batch_000001.npz") as batch:
        assert batch["obs"].shape == (T, 4, 4) and batch["actions"].shape == (T, 4)
        assert batch["lengths"].tolist() == [T] * 4
        first = batch["obs"][0]  # [slots, obs]: member 0's two envs, then member 1's
    for member in (0, 1):  # each group's envs start from the reset seeded by its member id, in its own slots
        vec = make_vector_env("CartPole-v1", 2)
        try:
            np.testing.assert_array_equal(first[2 * member:2 * member + 2],
                                          vec.reset(seed=env_seeds(SEED, member, 2))[0])
        finally:
            vec.close()

    assert audit.main(str(run_dir)) == 0
    verdict = capsys.readouterr().out.strip().splitlines()[-1]
    assert verdict.startswith("PASS") and f"{ITERATIONS} iteration(s), {4 * T * ITERATIONS} samples" in verdict


def test_a_strict_run_with_splits_repeats_bitwise_and_is_what_two_actors_give(tmp_path):
    """1 actor x 4 envs x 2 splits, twice (once over shm, once over gRPC with each env in a process of its own),
    and 2 actors x 2 envs: every compared column of every row is the same."""
    split = _train(tmp_path / "split", "--transport", "shm", "--actors", "1", "--envs-per-actor", "4",
                   "--splits", "2")
    again = _train(tmp_path / "again", "--transport", "grpc", "--vector", "async", "--actors", "1",
                   "--envs-per-actor", "4", "--splits", "2")
    two_actors = _train(tmp_path / "two", "--transport", "shm", "--actors", "2", "--envs-per-actor", "2")
    assert len(split) == ITERATIONS
    assert repro.first_difference(split, again) is None, repro.first_difference(split, again)
    assert repro.first_difference(split, two_actors) is None, repro.first_difference(split, two_actors)
    assert int(split[-1]["episodes"]) > 0  # the groups' finished episodes reach the metrics


def test_lockstep_actor_refuses_envs_that_do_not_divide_into_its_splits():
    result = subprocess.run([*lockstep_cmd(), "actor", "--learner", "127.0.0.1:1", "--envs-per-actor", "3",
                             "--splits", "2"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode != 0
    assert "actors.splits 2" in result.stderr and "actors.envs_per_actor 3 does not divide" in result.stderr


class CountingLoop(actor.EnvLoop):
    """An env loop that sets ``reached`` at its ``mark``-th step and, given ``fail_after``, raises at that step
    once ``fail_after`` is set, as a broken env does."""

    def __init__(self, vec, mark: int, fail_after: threading.Event | None = None) -> None:
        super().__init__(vec, action_spec(vec.single_action_space), SpaceSpec.from_space(vec.single_observation_space))
        self.mark, self.fail_after, self.reached, self.steps = mark, fail_after, threading.Event(), 0

    def step(self, actions) -> None:
        self.steps += 1
        if self.steps == self.mark:
            self.reached.set()
            if self.fail_after is not None:
                assert self.fail_after.wait(timeout=30)
                raise RuntimeError("the env broke")
        super().step(actions)


@pytest.mark.parametrize("transport", ["shm", "grpc"])
def test_a_group_that_ends_ends_the_others_even_one_held_at_the_gate(running_learner, transport):
    """Group 0's env breaks at its T-th step (once group 1 has stepped its T), before it sends the step that would
    close the phase; group 1 then waits at the gate until group 0's connection ends, which only the actor can end
    (it joins its threads before it closes any). It must stop both (the held wait interrupted) and raise group
    0's error."""
    running = running_learner({"ppo.steps_per_env": 4, "actors.splits": 2}, transport=transport)  # 2 members
    opts = actor.ActorOptions(learner=running.address, env="CartPole-v1", envs_per_actor=4, splits=2)
    held = CountingLoop(make_vector_env("CartPole-v1", 2), 4)
    loops = [CountingLoop(make_vector_env("CartPole-v1", 2), 4, fail_after=held.reached), held]
    opened: list = []
    raised: list[BaseException] = []

    def act() -> None:
        try:
            actor._act_side_by_side(loops, conns, opened, [])
        except BaseException as err:
            raised.append(err)

    try:
        conns = [actor._connect_group(opts, member, loop, loop.obs_spec, opened) for member, loop in enumerate(loops)]
        for member, loop in enumerate(loops):
            loop.reset(env_seeds(conns[0].welcome.seed, member, 2))
        thread = threading.Thread(target=act, daemon=True)
        thread.start()
        thread.join(timeout=60)
        assert not thread.is_alive(), "the held group was never interrupted"
    finally:
        for conn in opened:
            conn.close()
        for loop in loops:
            loop.vec.close()
    assert [str(err) for err in raised] == ["the env broke"]
    # group 1 stepped its T steps and sent the step after them, held until the interrupt (the learner closes the
    # phase without group 0 once it leaves, which may answer group 1 first)
    assert loops[0].steps == 4 and held.steps >= 4
