"""The fixed-layout batcher: a slot's numbers do not depend on which requests share its forward pass.

Float results of a row can depend on the shape of the pass and on the row's position in it, not
on the other rows' values; the batcher therefore gives every placed actor fixed rows of one
fixed-shape pass. These tests check the premise on ``PolicySnapshot.act`` itself, then the
batcher: bit-identical answers whatever shares the flush, across block boundaries, after the
layout changes, and for requests outside the layout.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from lockstep.algo import noise
from lockstep.envs import SpaceSpec
from lockstep.learner.inference import Batcher, PolicySnapshot
from lockstep.models import ActorCritic

OBS = SpaceSpec("box", (4,), "float32", low=np.full(4, -np.inf, np.float32), high=np.full(4, np.inf, np.float32))
DISCRETE = SpaceSpec("discrete", (), "int64", n=3)
BOX = SpaceSpec("box", (2,), "float32", low=-np.ones(2, np.float32), high=np.ones(2, np.float32))
FOREVER = 3600.0
LAYOUT = {2: 3, 5: 1, 9: 4}  # member -> slots: rows 0-2, 3, 4-7


def _snapshot(action: SpaceSpec, normalize: bool) -> PolicySnapshot:
    torch.manual_seed(0)
    model = ActorCritic(OBS, action, [64, 64])
    mean, var = (np.full(4, 0.1), np.full(4, 2.0)) if normalize else (None, None)
    return PolicySnapshot(1, model, mean, var, 10.0, torch.device("cpu"))


@pytest.fixture(scope="module", params=[(DISCRETE, False), (BOX, True)], ids=["discrete", "gaussian-normalized"])
def snapshot(request) -> PolicySnapshot:
    torch.set_num_threads(1)  # the learner's setting (learner.torch_threads)
    return _snapshot(*request.param)


def _request(member: int, slots: int, step: int, rng: np.random.Generator):
    """obs, keys, counters and the slots' state (a feedforward policy's: [slots, 0])."""
    obs = rng.normal(size=(slots, 4)).astype(np.float32) * rng.uniform(0.1, 30.0)
    return obs, noise.slot_keys(7, member, slots), np.full(slots, step, np.uint64), np.zeros((slots, 0), np.float32)


def _act(snapshot: PolicySnapshot, obs: np.ndarray, uniform: np.ndarray) -> tuple[np.ndarray, ...]:
    """One pass over these rows alone: actions, log-probs, values."""
    return snapshot.step(obs, uniform, snapshot.initial_state(len(obs)))[:3]


def _flush(batcher: Batcher, requests: dict[int, tuple]) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Send ``requests`` (member -> request) together; return member -> (actions, log-probs, values)."""
    async def main():
        return await asyncio.gather(*(batcher.infer(*req, member=m) for m, req in requests.items()))

    results = asyncio.run(main())
    return {m: (r.actions, r.logprobs, r.values) for m, r in zip(requests, results)}


def _placed(snapshot: PolicySnapshot, expected: int, max_batch: int = 4096) -> Batcher:
    batcher = Batcher(lambda: snapshot, max_batch, FOREVER, expected=lambda: expected)
    for member, slots in LAYOUT.items():
        batcher.place(member, slots)
    return batcher


def _same(a: tuple, b: tuple) -> None:
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)  # bit for bit, not close


@pytest.mark.parametrize("rows", [2, 5, 8, 17, 64, 257])
def test_premise_for_a_fixed_shape_a_row_does_not_depend_on_the_other_rows(snapshot, rows):
    rng = np.random.default_rng(rows)
    row_obs = rng.normal(size=4).astype(np.float32)
    row_u = noise.uniform(np.array([11], np.uint64), np.array([3], np.uint64), snapshot.model.noise_width)[0]
    for position in {0, rows // 2, rows - 1}:  # the last rows of a pass can take a remainder kernel
        answers = set()
        for trial in range(6):
            obs = rng.normal(size=(rows, 4)).astype(np.float32) * [0.0, 1.0, 1e3, 1e-3, 50.0, 1.0][trial]
            u = rng.uniform(1e-6, 1 - 1e-6, size=(rows, snapshot.model.noise_width))
            obs[position], u[position] = row_obs, row_u
            actions, logprobs, values = _act(snapshot, obs, u)
            answers.add((actions[position].tobytes(), logprobs[position].tobytes(), values[position].tobytes()))
        assert len(answers) == 1, (rows, position)


def test_a_slot_gets_the_same_numbers_whatever_shares_its_pass(snapshot):
    rng = np.random.default_rng(0)
    mine = _request(5, 1, step=4, rng=rng)
    reference = None
    companions = [{}, {2: 3}, {9: 4}, {2: 3, 9: 4}, {2: 3, 9: 4}, {9: 4}]
    for others in companions:
        batcher = _placed(snapshot, expected=1 + len(others))
        requests = {m: _request(m, k, step=4, rng=rng) for m, k in others.items()}  # fresh random rows each time
        requests[5] = mine
        got = _flush(batcher, requests)[5]
        if reference is None:
            reference = got
        _same(got, reference)
    # a second flush on the same batcher, after others' rows were filled with different contents
    batcher = _placed(snapshot, expected=3)
    _flush(batcher, {m: _request(m, k, step=1, rng=rng) for m, k in LAYOUT.items()})
    batcher._expected = lambda: 1
    _same(_flush(batcher, {5: mine})[5], reference)


def test_answers_are_the_rows_of_the_full_layout_pass(snapshot):
    rng = np.random.default_rng(1)
    requests = {m: _request(m, k, step=2, rng=rng) for m, k in LAYOUT.items()}
    batcher = _placed(snapshot, expected=3)
    got = _flush(batcher, {m: requests[m] for m in (9, 2, 5)})  # arrival order is not layout order
    obs = np.concatenate([requests[m][0] for m in sorted(LAYOUT)])  # members in id order
    u = noise.uniform(np.concatenate([requests[m][1] for m in sorted(LAYOUT)]),
                      np.concatenate([requests[m][2] for m in sorted(LAYOUT)]), snapshot.model.noise_width)
    full = _act(snapshot, obs, u)
    rows = {2: slice(0, 3), 5: slice(3, 4), 9: slice(4, 8)}
    for m, r in rows.items():
        _same(got[m], tuple(a[r] for a in full))
    assert batcher.forward_passes == 1 and batcher.rows_inferred == 8


def test_blocks_of_max_batch_rows_keep_every_pass_at_a_fixed_shape(snapshot):
    rng = np.random.default_rng(2)
    requests = {m: _request(m, k, step=3, rng=rng) for m, k in LAYOUT.items()}
    full = _flush(_placed(snapshot, expected=3, max_batch=3), requests)  # blocks: rows 0-2, 3-5, 6-7
    alone = _placed(snapshot, expected=1, max_batch=3)
    _same(_flush(alone, {9: requests[9]})[9], full[9])  # member 9 spans blocks 1 and 2
    assert alone.forward_passes == 2
    _same(_flush(alone, {2: requests[2]})[2], full[2])
    assert alone.forward_passes == 3


def test_the_layout_follows_joins_and_leaves(snapshot):
    rng = np.random.default_rng(3)
    batcher = _placed(snapshot, expected=2)
    requests = {2: _request(2, 3, step=0, rng=rng), 9: _request(9, 4, step=0, rng=rng)}
    batcher.remove(5)  # members 2 and 9 now hold rows 0-2 and 3-6 of a 7-row pass
    got = _flush(batcher, requests)
    obs = np.concatenate([requests[m][0] for m in (2, 9)])
    u = noise.uniform(np.concatenate([requests[m][1] for m in (2, 9)]),
                      np.concatenate([requests[m][2] for m in (2, 9)]), snapshot.model.noise_width)
    seven = _act(snapshot, obs, u)
    _same(got[2], tuple(a[0:3] for a in seven))
    _same(got[9], tuple(a[3:7] for a in seven))
    batcher.place(5, 1)  # back to 8 rows: the result is the 8-row layout's again
    again = _flush(batcher, requests)
    _same(again[9], _flush(_placed(snapshot, expected=2), requests)[9])


def test_requests_outside_the_layout_are_answered_in_a_pass_of_their_own(snapshot):
    rng = np.random.default_rng(4)
    batcher = _placed(snapshot, expected=3)
    placed = _request(2, 3, step=0, rng=rng)
    stranger = _request(42, 2, step=0, rng=rng)  # never placed
    wrong = _request(5, 2, step=0, rng=rng)  # placed with 1 slot, asks with 2 (a replaced connection)

    async def main():
        return await asyncio.gather(batcher.infer(*placed, member=2), batcher.infer(*stranger, member=42),
                                    batcher.infer(*wrong, member=5))

    got_placed, got_stranger, got_wrong = asyncio.run(main())
    assert batcher.forward_passes == 2 and batcher.rows_inferred == 7
    _same((got_placed.actions, got_placed.logprobs, got_placed.values),
          _flush(_placed(snapshot, expected=1), {2: placed})[2])
    loose_obs = np.concatenate([stranger[0], wrong[0]])
    loose_u = noise.uniform(np.concatenate([stranger[1], wrong[1]]), np.concatenate([stranger[2], wrong[2]]),
                            snapshot.model.noise_width)
    actions, logprobs, values = _act(snapshot, loose_obs, loose_u)
    _same((got_stranger.actions, got_stranger.logprobs, got_stranger.values), (actions[:2], logprobs[:2], values[:2]))
    _same((got_wrong.actions, got_wrong.logprobs, got_wrong.values), (actions[2:], logprobs[2:], values[2:]))
