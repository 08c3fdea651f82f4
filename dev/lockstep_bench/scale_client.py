"""Simulated actors for ``lockstep bench scale``: many gRPC streams driven by one asyncio process.

Each simulated actor speaks the real protocol (``transport/lockstep.proto``) over its own channel, so
the learner sees one TCP connection per actor, as it would with real actors: a hello with the
learner's spaces, then one Step per step of its k trivial envs, each answered by an Action. The envs
cost nothing: fixed observations inside the observation space, reward 1, and every env of an actor
ends an episode (terminated) every ``episode_length`` steps. No Gymnasium and no torch are loaded,
so a few of these processes stand in for a thousand actors.

Run by the benchmark as ``python -m lockstep_bench.scale_client PLAN.json COUNTS.json``. The plan
names the learner's address, the actor ids, k, the hello (a serialized ``pb.Hello`` holding the
spaces) and a deadline; the counts written at the end are what the benchmark checks the learner's
books against:

    sent          Step messages written
    replies       Actions received (each one answers one Step)
    ended         streams the learner ended normally (training is over)
    errors        streams that ended any other way, by status code
    first_error   the first such status, in words
    max_version   the newest policy version seen in an Action
    cpu_s, wall_s this process's CPU and wall seconds
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from lockstep.transport import METHOD
from lockstep.transport import lockstep_pb2 as pb
from lockstep.transport.codec import decode, encode
from lockstep.transport.grpc import security

# One TCP connection per simulated actor: without a local subchannel pool, channels of one process to one
# address share a connection, and the learner would serve a handful of connections instead of N.
CHANNEL_OPTIONS = [
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
]


def step_messages(hello: pb.Hello, episode_length: int, seed: int) -> tuple[bytes, bytes, bytes]:
    """Serialized ActorMessages (first step, ordinary step, step that ends every env's episode) for k envs."""
    space, k = hello.observation_space, hello.num_envs
    shape = tuple(int(d) for d in space.shape)
    low = decode(space.low, "low", shape=shape).astype(np.float64)
    high = decode(space.high, "high", shape=shape).astype(np.float64)
    rng = np.random.default_rng(seed)
    obs = np.clip(rng.uniform(-0.05, 0.05, (k, *shape)), low, high).astype(space.dtype)
    empty_final = np.zeros((0, *shape), space.dtype)

    def message(reward: float, ended: bool) -> bytes:
        step = pb.Step(
            observation=encode(obs), reward=encode(np.full(k, reward, np.float32)),
            terminated=encode(np.full(k, ended)), truncated=encode(np.zeros(k, bool)),
            final_index=encode(np.zeros(0, np.int64)), final_observation=encode(empty_final),
            episode_return=encode(np.full(k if ended else 0, float(episode_length))),
            episode_length=encode(np.full(k if ended else 0, episode_length, np.int64)))
        return pb.ActorMessage(step=step).SerializeToString()

    return message(0.0, False), message(1.0, False), message(1.0, True)


class Tally:
    """What this process's actors did, summed."""

    def __init__(self) -> None:
        self.sent = self.replies = self.ended = self.max_version = 0
        self.errors: Counter[str] = Counter()
        self.first_error: str | None = None

    def error(self, code: str, details: str) -> None:
        self.errors[code] += 1
        if self.first_error is None:
            self.first_error = f"{code}: {details}"


async def simulated_actor(address: str, hello: pb.Hello, episode_length: int, tally: Tally) -> None:
    """One actor: hello, then steps until the learner ends the stream (or refuses it)."""
    first, ordinary, ending = step_messages(hello, episode_length, seed=hello.actor_id)
    async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
        call = channel.stream_stream(METHOD)(  # no serializers: bytes both ways
            wait_for_ready=True, metadata=security.metadata(security.token_from(None)))  # $LOCKSTEP_TOKEN
        try:
            await call.write(pb.ActorMessage(hello=hello).SerializeToString())
            reply = await call.read()
            if reply is grpc.aio.EOF or pb.LearnerMessage.FromString(reply).WhichOneof("kind") != "welcome":
                tally.error("NO_WELCOME", f"actor {hello.actor_id}: the hello was not answered with a welcome")
                return
            n = 0
            while True:
                await call.write(first if n == 0 else ending if (n + hello.actor_id) % episode_length == 0
                                 else ordinary)
                tally.sent += 1
                n += 1
                reply = await call.read()
                if reply is grpc.aio.EOF:
                    break
                action = pb.LearnerMessage.FromString(reply).action
                if action.retry or not action.action.data:
                    tally.error("NO_ACTION", f"actor {hello.actor_id}: an Action without actions")
                    return
                tally.replies += 1
                tally.max_version = max(tally.max_version, action.policy_version)
            code = await call.code()
            if code == grpc.StatusCode.OK:
                tally.ended += 1
            else:
                tally.error(code.name, await call.details())
        except grpc.aio.AioRpcError as err:
            tally.error(err.code().name, err.details() or "")


async def run_actors(plan: dict[str, Any]) -> Tally:
    hello_template = pb.Hello.FromString(bytes.fromhex(plan["hello"]))
    tally = Tally()
    tasks = []
    for actor_id in plan["actor_ids"]:
        hello = pb.Hello()
        hello.CopyFrom(hello_template)
        hello.actor_id, hello.run_id = actor_id, uuid.uuid4().hex
        tasks.append(asyncio.create_task(simulated_actor(plan["address"], hello, plan["episode_length"], tally)))
    _, late = await asyncio.wait(tasks, timeout=plan["deadline_s"])
    for task in late:
        task.cancel()
        tally.error("DEADLINE", f"{len(late)} stream(s) still open after {plan['deadline_s']:.0f} s")
    await asyncio.gather(*late, return_exceptions=True)
    return tally


def main(argv: list[str]) -> int:
    plan_path, counts_path = argv
    plan = json.loads(Path(plan_path).read_text())
    start = time.perf_counter()
    tally = asyncio.run(run_actors(plan))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    counts = {"actors": len(plan["actor_ids"]), "sent": tally.sent, "replies": tally.replies, "ended": tally.ended,
              "errors": dict(tally.errors), "first_error": tally.first_error, "max_version": tally.max_version,
              "cpu_s": round(usage.ru_utime + usage.ru_stime, 3), "wall_s": round(time.perf_counter() - start, 3),
              "peak_rss_mb": round(usage.ru_maxrss / 1024, 1)}
    Path(counts_path).write_text(json.dumps(counts, indent=2) + "\n")
    return 0 if not tally.errors else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
