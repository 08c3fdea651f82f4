"""``python -m lockstep_bench.profile_update [--preset doom-basic] [--repeats 5] [--set model.rnn=gru ...]``: where
the time of one PPO update and of one inference step of a pixel preset goes, on the CPU.

Builds the preset's real policy and ``Trainer`` for its observation (uint8 frames [C, H, W], a Discrete action)
and trains on a synthetic batch of its shapes: random frames, episode starts where a random 1 in ``--episode``
steps ends one (ViZDoom's basic: up to 75 steps). Reports, as the median of ``--repeats`` runs, the whole
``Trainer.train`` and its parts timed one by one on the same batch:

- ``to_float``: the batch's frames as tensors, through the observation normalizer (what the model is given);
- ``bootstrap``: ``model.states`` under no_grad, the forward pass over the batch that the bootstrap values need;
- ``torso``, ``core``, ``heads+loss``: the forward pass with gradients, the CNN over T x N frames, the recurrent
  core over T (its segments cut at episode starts), the heads and PPO's loss;
- ``core_bwd``, ``torso_bwd``: the loss's backward pass through the heads and the core, then through the CNN;
- ``optimizer``: clipping and Adam's step (``algo.optim.GradientStep``);

(a feedforward policy, ``--preset breakout --frames 4,84,84``: the whole update and ``to_float`` only)

and ``infer[B]``, one ``PolicySnapshot.step`` of B slots (what the actors wait on). Several ``--variant
NAME:KEY=VALUE,...`` (each a set of overrides of the preset, ``model.rnn=gru``) are timed in turn, interleaved per
repeat, so that a change of the machine's load reaches every variant alike. Two items are no settings: ``+nchw``
puts the CNN's weights back in the default NCHW layout (``learner.trainer.placed`` makes them channels-last on the
CPU), ``+raw_frames`` gives the network the uint8 frames instead of the float32 copy that the observation
normalizer makes (a preset whose frames are not normalized), ``+recompute`` drops the states the batch holds where
values are bootstrapped (what inference left there), so that ``Trainer.train`` recomputes them with ``model.states``
(the ``bootstrap`` part, timed on its own in every variant).

    PYTHONPATH=src:dev python -m lockstep_bench.profile_update --variant gru: --variant lstm:model.rnn=lstm \\
        --variant gru-nchw:+nchw --variant lstm-nchw:model.rnn=lstm,+nchw
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch

from lockstep.algo import ppo
from lockstep.algo.normalize import as_tensors
from lockstep.algo.optim import GradientStep
from lockstep.config import apply_sets, load
from lockstep.envs import EnvSpec
from lockstep.envs.spaces import SpaceSpec, action_spec
from lockstep.learner.rollout import Batch
from lockstep.learner.trainer import Trainer

NCHW = "+nchw"  # a variant's item: the CNN's weights in the default layout, not the CPU's channels-last (``placed``)
RAW_FRAMES = "+raw_frames"  # one that hands the model the uint8 frames (no float copy before the network's Scale)
RECOMPUTE = "+recompute"  # one whose batch holds no recorded states: the update recomputes them (``bootstrap``)
EXPERIMENTS = (NCHW, RAW_FRAMES, RECOMPUTE)


def synthetic_batch(shape: tuple[int, ...], actions: int, T: int, N: int, state_size: int, episode: int,
                    seed: int = 0) -> Batch:
    """A [T, N] batch of random uint8 frames whose episodes end at random, 1 step in ``episode``."""
    rng = np.random.default_rng(seed)
    terminated = rng.random((T, N)) < 1.0 / episode
    return Batch(version=0, members=(0,), slots_per_member=(N,),
                 obs=rng.integers(0, 256, (T, N, *shape), dtype=np.uint8),
                 actions=rng.integers(0, actions, (T, N)), logprobs=np.full((T, N), -np.log(actions), np.float32),
                 values=rng.standard_normal((T, N)).astype(np.float32),
                 rewards=rng.standard_normal((T, N)).astype(np.float32), terminated=terminated,
                 truncated=np.zeros((T, N), bool), versions=np.zeros((T, N), np.int64),
                 bootstrap_obs=rng.integers(0, 256, (N, *shape), dtype=np.uint8), lengths=np.full(N, T, np.int64),
                 initial_state=np.zeros((N, state_size), np.float32),
                 # the states inference left after each slot's last step (a learner's batches hold them)
                 bootstrap_state=rng.uniform(-1, 1, (N, state_size)).astype(np.float32),
                 final_state=np.zeros((0, state_size), np.float32))


class Features(torch.nn.Module):
    """A torso that returns features computed beforehand: the recurrent core timed without the CNN."""

    def __init__(self, x: torch.Tensor) -> None:
        super().__init__()
        self.x = x

    def forward(self, _: object) -> torch.Tensor:
        return self.x


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def parts(trainer: Trainer, batch: Batch) -> dict[str, float]:
    """One update's parts, each timed on its own (module docstring)."""
    model, dev = trainer.model, trainer.device
    T, N = batch.num_steps, batch.num_slots
    times: dict[str, float] = {}
    normalize = trainer.normalizer()
    times["to_float"], obs = timed(lambda: normalize(as_tensors(batch.obs, dev)))
    if not hasattr(model, "core"):  # a feedforward policy: its update is timed whole
        return times
    starts = batch.starts
    state = torch.as_tensor(batch.initial_state)
    actions = torch.as_tensor(batch.actions)
    with torch.no_grad():
        times["bootstrap"], _ = timed(lambda: model.states(obs, starts, state, cuts={T}))
    model.train()
    times["torso"], x = timed(lambda: model.torso(obs.reshape(T * N, *obs.shape[2:])))
    features = x.detach().requires_grad_(True)  # the backward pass in two: the core's and heads', the CNN's
    torso = model.torso
    model.torso = Features(features)
    try:
        times["core"], (out, _) = timed(lambda: model.core(obs, starts, state))
    finally:
        model.torso = torso

    def heads_and_loss() -> torch.Tensor:
        flat = out.reshape(T * N, -1)
        head, value = model.actor(model._policy_in(flat)), model.critic(model._value_in(flat)).reshape(T * N)
        logprob, entropy = model.evaluate_head(head, actions.reshape(-1))
        old = torch.as_tensor(batch.logprobs).reshape(-1)
        adv, ret = torch.as_tensor(batch.rewards).reshape(-1), torch.as_tensor(batch.values).reshape(-1)
        return ppo.ppo_loss(logprob, old, adv, value, ret, ret, entropy, trainer.settings).loss

    times["heads+loss"], loss = timed(heads_and_loss)
    step = GradientStep(model, trainer.optimizer, trainer.settings.max_grad_norm)
    step.zero()
    times["core_bwd"], _ = timed(loss.backward)
    times["torso_bwd"], _ = timed(lambda: x.backward(features.grad))

    def optimizer() -> None:
        step.clip()
        step.step(skip=torch.zeros((), dtype=torch.bool))

    times["optimizer"], _ = timed(optimizer)
    return times


def variant(preset: str, sets: list[str], episode: int, seed: int,
            frames: tuple[int, ...] = (3, 72, 128)) -> tuple[Trainer, Batch]:
    config = load(preset)
    apply_sets(config, [s for s in sets if s not in EXPERIMENTS])
    observation = SpaceSpec.from_space(gym.spaces.Box(0, 255, frames, np.uint8))
    spec = EnvSpec(config.env.id, observation, action_spec(gym.spaces.Discrete(4)))
    trainer = Trainer(config, spec, torch.device("cpu"))
    if NCHW in sets:  # each convolution's input and output follow its weights' layout
        trainer.model.to(memory_format=torch.contiguous_format)
    if RAW_FRAMES in sets:  # the normalizer is off for frames: it only converts them to float32
        trainer.normalizer = lambda: (lambda obs: obs)
    T, N = config.ppo.steps_per_env, config.actors.count * config.actors.envs_per_actor
    batch = synthetic_batch(observation.shape, 4, T, N, trainer.model.state_size, episode, seed)
    if RECOMPUTE in sets:
        batch.bootstrap_state = batch.final_state = None
    return trainer, batch


def infer(trainer: Trainer, batch: Batch, slots: int) -> float:
    snapshot = trainer.snapshot()
    rng = np.random.default_rng(slots)
    obs = rng.integers(0, 256, (slots, *batch.obs.shape[2:]), dtype=np.uint8)
    uniform = rng.uniform(0.01, 0.99, (slots, trainer.model.noise_width)).astype(np.float32)
    state = np.zeros((slots, trainer.model.state_size), np.float32)
    snapshot.step(obs, uniform, state)  # warm-up
    return timed(lambda: snapshot.step(obs, uniform, state))[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="doom-basic")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--episode", type=int, default=50, help="mean episode length in steps")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME:KEY=VALUE,... a variant of the preset (default: the preset as it is)")
    parser.add_argument("--frames", default="3,72,128",
                        help="C,H,W of the uint8 frames (doom-basic's 3,72,128; breakout's 4,84,84)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--out", default="", help="write the medians here as JSON")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    variants = {}
    for item in args.variant or [":"]:
        name, _, sets = item.partition(":")
        variants[name or "preset"] = variant(args.preset, [s for s in sets.split(",") if s], args.episode, 0,
                                             tuple(int(n) for n in args.frames.split(",")))
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in variants}
    for _ in range(args.repeats + 1):  # the first round warms up and is dropped
        for name, (trainer, batch) in variants.items():
            batch.version, batch.versions[:] = trainer.version, trainer.version  # strict: the version trained
            row = {"train": timed(functools.partial(trainer.train, batch))[0], **parts(trainer, batch)}
            row.update({f"infer[{b}]": infer(trainer, batch, b) for b in (32, 64)})
            for key, seconds in row.items():
                samples[name].setdefault(key, []).append(seconds)
    medians = {name: {key: statistics.median(v[1:]) for key, v in rows.items()} for name, rows in samples.items()}
    keys = list(next(iter(medians.values())))
    print(f"threads {torch.get_num_threads()}, {args.repeats} repeats, median ms")
    print(f"{'part':<12}" + "".join(f"{name:>12}" for name in medians))
    for key in keys:
        print(f"{key:<12}" + "".join(f"{medians[name][key] * 1e3:>12.1f}" for name in medians))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(medians, f, indent=1)


if __name__ == "__main__":
    main()
