"""The batcher on an asyncio loop with a real policy snapshot: when it flushes and how it answers."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from lockstep.algo import noise
from lockstep.envs import SpaceSpec
from lockstep.learner.inference import Batcher, PolicySnapshot
from lockstep.models import ActorCritic

OBS = SpaceSpec("box", (3,), "float32", low=np.full(3, -np.inf, np.float32), high=np.full(3, np.inf, np.float32))
ACTIONS = SpaceSpec("discrete", (), "int64", n=4)
FOREVER = 3600.0  # a max_wait no test may wait for


@pytest.fixture(scope="module")
def snapshot() -> PolicySnapshot:
    torch.manual_seed(0)
    model = ActorCritic(OBS, ACTIONS, [16])
    with torch.no_grad():
        model.actor[-1].weight.mul_(100.0)  # actions that depend on the observation, not only on the noise
    return PolicySnapshot(3, model, None, None, 10.0, torch.device("cpu"))


def request(rows: int, first_key: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``rows`` observations with their own slot keys, step counters and (empty) states."""
    rng = np.random.default_rng(first_key)
    keys = np.arange(first_key, first_key + rows, dtype=np.uint64)
    state = np.zeros((rows, 0), np.float32)  # a feedforward policy's
    return rng.normal(size=(rows, 3)).astype(np.float32), keys, np.full(rows, 5 + first_key, np.uint64), state


def run(coro, timeout: float = 10.0):
    async def bounded():
        return await asyncio.wait_for(coro, timeout)
    return asyncio.run(bounded())


def expected(snapshot: PolicySnapshot, req) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What the snapshot answers for these rows alone, with the same noise."""
    obs, keys, counters, state = req
    return snapshot.step(obs, noise.uniform(keys, counters, snapshot.model.noise_width), state)[:3]


def assert_answers(result, snapshot: PolicySnapshot, req) -> None:
    actions, logprobs, values = expected(snapshot, req)
    np.testing.assert_array_equal(result.actions, actions)
    np.testing.assert_allclose(result.logprobs, logprobs, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result.values, values, rtol=1e-5, atol=1e-6)
    assert result.version == snapshot.version


def test_flushes_at_once_when_every_expected_request_is_in(snapshot):
    batcher = Batcher(lambda: snapshot, max_batch=1000, max_wait_s=FOREVER, expected=lambda: 2)
    reqs = [request(2, 0), request(3, 10)]

    async def main():
        return await asyncio.gather(*(batcher.infer(*r) for r in reqs))

    results = run(main())
    assert batcher.forward_passes == 1 and batcher.rows_inferred == 5
    for result, req in zip(results, reqs):
        assert_answers(result, snapshot, req)


def test_flushes_on_the_timeout_when_fewer_requests_arrive(snapshot):
    batcher = Batcher(lambda: snapshot, max_batch=1000, max_wait_s=0.5, expected=lambda: 3)
    reqs = [request(1, 0), request(2, 10)]

    async def main():
        loop = asyncio.get_running_loop()
        start = loop.time()
        tasks = [asyncio.create_task(batcher.infer(*r)) for r in reqs]
        for _ in range(3):  # let both requests reach the batcher, without waiting on the clock that flushes them
            await asyncio.sleep(0)
        waiting = not any(t.done() for t in tasks) and batcher.forward_passes == 0
        results = await asyncio.gather(*tasks)
        return waiting, loop.time() - start, results

    waiting, elapsed, results = run(main())
    assert waiting  # two of three expected requests do not flush by themselves
    assert elapsed >= 0.5
    assert batcher.forward_passes == 1 and batcher.rows_inferred == 3
    for result, req in zip(results, reqs):
        assert_answers(result, snapshot, req)


def test_flushes_when_max_batch_rows_are_pending(snapshot):
    batcher = Batcher(lambda: snapshot, max_batch=4, max_wait_s=FOREVER, expected=lambda: 10)
    reqs = [request(3, 0), request(2, 10)]  # 3 rows wait; 3 + 2 >= 4 flushes both

    async def main():
        first = asyncio.create_task(batcher.infer(*reqs[0]))
        await asyncio.sleep(0.01)
        waiting = not first.done()
        second = await batcher.infer(*reqs[1])
        return waiting, [await first, second]

    waiting, results = run(main())
    assert waiting
    assert batcher.forward_passes == 1 and batcher.rows_inferred == 5
    for result, req in zip(results, reqs):
        assert_answers(result, snapshot, req)


def test_one_request_of_max_batch_rows_flushes_alone(snapshot):
    batcher = Batcher(lambda: snapshot, max_batch=4, max_wait_s=FOREVER, expected=lambda: 10)
    req = request(4, 0)
    result = run(batcher.infer(*req))
    assert batcher.forward_passes == 1
    assert_answers(result, snapshot, req)


def test_cancelled_request_is_skipped_and_the_others_are_answered(snapshot):
    batcher = Batcher(lambda: snapshot, max_batch=1000, max_wait_s=FOREVER, expected=lambda: 3)
    gone, kept, last = request(2, 0), request(1, 10), request(3, 20)

    async def main():
        cancelled = asyncio.create_task(batcher.infer(*gone))
        waiting = asyncio.create_task(batcher.infer(*kept))
        await asyncio.sleep(0)
        cancelled.cancel()
        await asyncio.sleep(0)
        assert cancelled.cancelled()
        # the third pending request completes the expected count: one forward pass without the cancelled rows
        return await asyncio.gather(waiting, batcher.infer(*last))

    results = run(main())
    assert batcher.forward_passes == 1 and batcher.rows_inferred == 4
    for result, req in zip(results, (kept, last)):
        assert_answers(result, snapshot, req)


class Broken(PolicySnapshot):
    def step(self, obs, uniform, state):
        raise RuntimeError("forward pass failed")


def test_error_in_the_forward_pass_reaches_every_waiter_and_the_batcher_serves_on(snapshot):
    broken = Broken(3, snapshot.model, None, None, 10.0, torch.device("cpu"))
    current = [broken]
    batcher = Batcher(lambda: current[0], max_batch=1000, max_wait_s=FOREVER, expected=lambda: 3)
    reqs = [request(1, 0), request(2, 10), request(1, 20)]

    async def main():
        failed = await asyncio.gather(*(batcher.infer(*r) for r in reqs), return_exceptions=True)
        current[0] = snapshot
        answered = await asyncio.gather(*(batcher.infer(*r) for r in reqs))
        return failed, answered

    failed, answered = run(main())
    assert [type(e) for e in failed] == [RuntimeError] * 3
    assert all(str(e) == "forward pass failed" for e in failed)
    assert batcher.forward_passes == 1 and batcher.rows_inferred == 4  # only the pass that worked
    for result, req in zip(answered, reqs):
        assert_answers(result, snapshot, req)


def test_results_are_split_back_to_each_request_in_order(snapshot):
    batcher = Batcher(lambda: snapshot, max_batch=1000, max_wait_s=FOREVER, expected=lambda: 4)
    reqs = [request(1, 0), request(3, 10), request(2, 20), request(1, 30)]

    async def main():
        return await asyncio.gather(*(batcher.infer(*r) for r in reqs))

    results = run(main())
    assert batcher.forward_passes == 1 and batcher.rows_inferred == 7
    assert [len(r.actions) for r in results] == [1, 3, 2, 1]
    for result, req in zip(results, reqs):
        assert_answers(result, snapshot, req)
    # the batch's answer, row for row, is the concatenation of the requests' own answers
    obs = np.concatenate([r[0] for r in reqs])
    uniform = noise.uniform(np.concatenate([r[1] for r in reqs]), np.concatenate([r[2] for r in reqs]), 4)
    together = snapshot.step(obs, uniform, np.zeros((len(obs), 0)))[0]
    np.testing.assert_array_equal(np.concatenate([r.actions for r in results]), together)
    assert len(set(np.concatenate([r.actions for r in results]).tolist())) > 1  # the rows do differ
