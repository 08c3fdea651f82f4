"""The honest in-process reference: the same PPO, without the distribution.

One process, no RPC, no gate, no extra processes. It uses the same pieces the
learner uses, in the same order:

    the SAME Gymnasium vector env  (``envs.make_vector_env``, N = actors * envs_per_actor envs)
    the SAME policy forward        (``Trainer.snapshot().step`` with ``noise.uniform`` over
                                    each actor's ``noise.slot_keys`` and per-step counters, and
                                    each slot's policy state, zeroed where an episode starts)
    the SAME rollout store         (``rollout.Unroll`` + ``assemble``: ``record_action``,
                                    ``record_outcome`` of step t, truncated envs' final obs,
                                    ``finish`` with the observation after T steps)
    the SAME PPO update            (``Trainer.train``), then a new snapshot per iteration.

The env loop is the actor's own (``actor.EnvLoop``): same-step autoreset, Box actions
clipped before stepping (the unclipped action is what is trained on), and the last
observation of each episode that ended by truncation only. Its N slots are the actors'
slots in actor order, with their noise keys and reset seeds, and a strict learner's forward
pass has the same fixed shape: for the same config and seed the two learn the same curve
(tested), so the comparison is of speed alone.

Timing is measured like the learner's ``sps``: from the first env step to the end of
the last update; env steps are trained transitions. ``time_split_s`` is a cheap
in-process account: env (vector env steps and their bookkeeping), inference (noise +
forward pass), training (``Trainer.train``; with ``--collect-only``, ``hooks.CollectOnlyTrainer``'s),
other (rollout store, episode statistics, new snapshots).

    python -m lockstep_bench.baseline CONFIG_YAML OUT_JSON [--collect-only] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lockstep import config as config_lib
from lockstep import envs as envs_lib
from lockstep.actor import EnvLoop
from lockstep.algo import noise
from lockstep.learner.device import resolve_device
from lockstep.learner.rollout import Unroll, assemble
from lockstep.learner.trainer import Trainer
from lockstep.observe.metrics import EpisodeTracker
from lockstep_bench.hooks import CollectOnlyTrainer


def run(config: config_lib.Config, collect_only: bool = False) -> dict[str, Any]:
    """Train (or, with ``collect_only``, only collect) to ``ppo.total_steps``, ``run.time_limit_s`` or
    ``run.stop_at_return``, whichever comes first, as the learner does."""
    config.validate()
    torch.set_num_threads(config.learner.torch_threads)
    device = resolve_device(config.learner.device)
    n = config.actors.count * config.actors.envs_per_actor
    T = config.ppo.steps_per_env
    seed = config.run.seed
    vec = envs_lib.make_vector_env(config.env.id, n)
    try:
        obs_spec = envs_lib.SpaceSpec.from_space(vec.single_observation_space)
        act_spec = envs_lib.SpaceSpec.from_space(vec.single_action_space)
        spec = envs_lib.EnvSpec(config.env.id, obs_spec, act_spec)
        shapes = (obs_spec.shape, np.dtype(obs_spec.dtype), act_spec.element_shape, act_spec.action_dtype)
        trainer = (CollectOnlyTrainer if collect_only else Trainer)(config, spec, device, max_lag=0)
        episodes = EpisodeTracker(config.return_thresholds())  # the learner's thresholds
        loop = EnvLoop(vec, act_spec)  # the actor's own env loop
        actors = range(config.actors.count)  # the learner's layout: actor a's k slots after actor a-1's
        k = config.actors.envs_per_actor
        loop.reset([s for a in actors for s in envs_lib.env_seeds(seed, a, k)])
        keys = np.concatenate([noise.slot_keys(seed, a, k) for a in actors])
        snapshot = trainer.snapshot()
        width = snapshot.model.noise_width
        state = snapshot.initial_state(n)  # [n, S], carried across iterations as a session carries it
        limit, target = config.run.time_limit_s, config.run.stop_at_return
        env_s = inference_s = training_s = 0.0
        counter = 0  # every slot's noise counter: steps taken so far
        collected = 0
        curve: list[list[float]] = []  # [env_steps, wall_s, running mean return of the last 20 episodes]
        t0 = time.perf_counter()
        wall = 0.0
        while True:
            unroll = Unroll(0, n, T, *shapes, initial_state=state)
            for t in range(T):
                start = time.perf_counter()
                uniform = noise.uniform(keys, np.full(n, counter, np.uint64), width)
                actions, logprobs, values, state = snapshot.step(loop.obs, uniform, state)
                counter += 1
                mid = time.perf_counter()
                unroll.record_action(t, loop.obs, actions, logprobs, values, snapshot.version)
                stepped = time.perf_counter()
                loop.step(actions)
                env_s += time.perf_counter() - stepped
                inference_s += mid - start
                unroll.record_outcome(t, loop.reward, loop.terminated, loop.truncated, loop.final_index,
                                      loop.final_obs)
                # the next observation of a slot whose episode ended starts a new one (``Session.step``)
                state = np.where((loop.terminated | loop.truncated)[:, None], np.float32(0), state)
                collected += n
                episodes.add(loop.ep_return, loop.ep_length, collected, time.perf_counter() - t0)
            unroll.finish(loop.obs)
            batch = assemble(snapshot.version, [unroll])
            start = time.perf_counter()
            trainer.train(batch)
            training_s += time.perf_counter() - start
            wall = time.perf_counter() - t0
            curve.append([trainer.env_steps, round(wall, 3), episodes.stats()["episode_return_mean20"]])
            if trainer.env_steps >= config.ppo.total_steps or (limit is not None and wall >= limit):
                break
            if target is not None and episodes.reached(target):  # the learner's run.stop_at_return
                break
            snapshot = trainer.snapshot()
    finally:
        vec.close()
    ep = episodes.stats()
    split = {"env": env_s, "inference": inference_s, "training": training_s}
    split["other"] = max(0.0, wall - sum(split.values()))
    return {
        "env": config.env.id,
        "seed": seed,
        "envs": n,
        "steps_per_env": T,
        "collect_only": collect_only,
        "iterations": trainer.iteration,
        "env_steps": trainer.env_steps,
        "wall_s": round(wall, 3),
        "env_steps_per_s": round(trainer.env_steps / wall, 1) if wall > 0 else 0.0,
        "time_limited": trainer.env_steps < config.ppo.total_steps,
        "inference_batch_mean": n,
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "time_split_s": {k: round(v, 3) for k, v in split.items()},
        "episodes": ep["episodes"],
        "episode_return_mean": None if math.isnan(ep["episode_return_mean"]) else ep["episode_return_mean"],
        "first_reached": episodes.first_reached,
        "device": str(device),
        "torch_threads": config.learner.torch_threads,
        "curve": [[s, w, None if math.isnan(r) else round(r, 2)] for s, w, r in curve],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lockstep_bench.baseline", description=__doc__.split("\n")[0])
    parser.add_argument("config", metavar="CONFIG_YAML")
    parser.add_argument("out", metavar="OUT_JSON")
    parser.add_argument("--collect-only", action="store_true", help="collect and count batches, never train")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    args = parser.parse_args(argv)
    config = config_lib.load(args.config)
    try:
        config_lib.apply_sets(config, args.set)
    except config_lib.ConfigError as err:
        parser.error(str(err))
    result = run(config, args.collect_only)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    ret = result["episode_return_mean"]
    print(f"baseline: {result['env_steps']:,} env steps in {result['wall_s']:.1f} s "
          f"({result['env_steps_per_s']:,.0f} steps/s), mean return (last 100) "
          f"{'n/a' if ret is None else f'{ret:.1f}'}; wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
