"""The trainer: owns the training copy of the policy and turns a phase's batch into the next version.

It checks every sample's version stamp before training: in strict mode a sample
produced by any version but the one being updated is an error, never a warning.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from lockstep.algo import ppo, vtrace
from lockstep.algo.normalize import (
    LeafStatistics,
    ObsNormalizer,
    RunningMeanStd,
    as_tensors,
    normalized,
    observation_statistics,
)
from lockstep.config import Config, ConfigError
from lockstep.envs import EnvSpec
from lockstep.learner.distributed import Ranks
from lockstep.learner.inference import PolicySnapshot
from lockstep.learner.rollout import Batch
from lockstep.models import build_policy
from lockstep.models.networks import CNN
from lockstep.observe.metrics import add_counts

log = logging.getLogger(__name__)


class OffPolicyError(RuntimeError):
    """A batch holds samples whose lag exceeds what the synchronization allows (strict: any lag)."""


@dataclass
class TrainStats:
    version: int  # the version that trained on the batch (the new version is version + 1)
    samples: int
    off_policy_samples: int
    policy_lag_mean: float
    policy_lag_max: int
    train_s: float
    lr: float
    update: ppo.UpdateStats
    # an action of several parts: the mean entropy of each (a MultiDiscrete's dimensions, a Dict's leaves)
    entropy_by_entry: dict[str, float] = field(default_factory=dict)
    policies: dict[str, TrainStats] = field(default_factory=dict)  # several policies: each one's (``team``)
    skipped: bool = False  # no update: the batch held no valid sample (a policy whose agents had all left)
    vtrace_truncated: float | None = None  # ppo.vtrace: the fraction of the valid samples whose ratio ρ̄ truncated
    lag_counts: tuple[int, ...] = ()  # the valid samples of each lag 0, 1, ... (the lag's distribution)


class RewardScaler:
    """Divide rewards by the running std of each slot's discounted return (CleanRL's NormalizeReward)."""

    def __init__(self, gamma: float, clip: float,
                 update: Callable[[RunningMeanStd, np.ndarray], None] = RunningMeanStd.update) -> None:
        self.gamma, self.clip = gamma, clip
        self.rms = RunningMeanStd()
        self._update = update  # folds the discounted returns seen into ``rms`` (on every learner, if several)
        self.returns: dict[int, np.ndarray] = {}  # member -> [k] discounted return so far

    def scale(self, batch: Batch) -> np.ndarray:
        """[T, N] scaled rewards; updates the statistics with this batch."""
        T = batch.num_steps
        running = np.concatenate([self._running(m, k) for m, k in zip(batch.members, batch.slots_per_member)])  # [N]
        valid = batch.valid
        seen = np.empty((T, batch.num_slots))
        done = batch.terminated | batch.truncated
        for t in range(T):
            running = np.where(valid[t], running * self.gamma + batch.rewards[t], running)
            seen[t] = running
            running = np.where(valid[t] & done[t], 0.0, running)
        self._update(self.rms, seen[valid])
        offsets = np.cumsum((0,) + batch.slots_per_member)
        for m, start, end in zip(batch.members, offsets[:-1], offsets[1:]):
            self.returns[m] = running[start:end]
        return np.clip(batch.rewards / np.sqrt(self.rms.var + 1e-8), -self.clip, self.clip).astype(np.float32)

    def _running(self, member: int, num_envs: int) -> np.ndarray:
        """[k] the member's discounted returns so far; zeros for a new member, or for one that came back
        with another number of envs (a restarted actor, a resume): those returns are stale anyway."""
        running = self.returns.get(member)
        if running is None or running.shape != (num_envs,):
            return np.zeros(num_envs)
        return running


def bootstrap(batch: Batch, values: torch.Tensor,
              value_fn: Callable[[np.ndarray, torch.Tensor, torch.Tensor], torch.Tensor]
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """What GAE needs besides rewards and values: the value after each step and where traces continue.

    ``values`` [T, N] are the behaviour values of ``batch``; ``value_fn(obs, t, n)`` maps raw
    observations [M, *obs] that follow step t [M] of slot n [M] to their values [M] under the
    policy being trained (a recurrent policy needs to know which state they follow). Returns, both [T, N]:

    * ``next_values[t, n]``: V of the state after step t in the same episode. The next row's value
      for an ordinary step; 0 where the episode terminated; V(the episode's last observation) where
      it was truncated (the next row holds the reset observation of a new episode); V(bootstrap
      observation) at a slot's last step, L-1 for a slot of length L; 0 past a slot's last step.
    * ``continues[t, n]``: 1 where the advantage trace runs on into step t+1; 0 where the episode
      ended (terminated or truncated), at a slot's last step, and past it.
    """
    N = values.shape[1]
    dev = values.device
    terminated = torch.as_tensor(batch.terminated, dtype=torch.float32, device=dev)  # [T, N]
    truncated = torch.as_tensor(batch.truncated, dtype=torch.float32, device=dev)  # [T, N]
    last = torch.as_tensor(batch.lengths - 1, device=dev)  # [N] each slot's last step
    slots = torch.arange(N, device=dev)  # [N]
    past = ~torch.as_tensor(batch.valid, device=dev)  # [T, N] steps past a slot's last one, or of an agent gone
    next_values = torch.zeros_like(values)  # [T, N]
    next_values[:-1] = values[1:]
    next_values[last, slots] = value_fn(batch.bootstrap_obs, last, slots)  # [N]
    next_values = next_values * (1.0 - terminated)
    if len(batch.final_t):  # truncated: bootstrap from the episode's own last observation
        final_t, final_n = torch.as_tensor(batch.final_t, device=dev), torch.as_tensor(batch.final_n, device=dev)
        next_values[final_t, final_n] = value_fn(batch.final_obs, final_t, final_n)  # [M]
    next_values.masked_fill_(past, 0.0)  # (a mask in the index would read the device for the result's shape)
    continues = 1.0 - torch.maximum(terminated, truncated)  # [T, N]
    continues[last, slots] = 0.0  # nothing after a slot's last step belongs to its trace
    continues.masked_fill_(past, 0.0)
    return next_values, continues


def adam(params: list[torch.nn.Parameter], lr: float, eps: float) -> torch.optim.Adam:
    """Adam, with its step fused into one kernel where this torch has one for the parameters' device
    (CPU from torch 2.4, CUDA): the same update as the loop over parameters, rounded differently, without
    the loop's per-tensor overhead, which is most of a step's cost for small policies
    (docs/benchmarks/2026-12-02-what-was-optimized.md measures it)."""
    try:
        return torch.optim.Adam(params, lr=lr, eps=eps, fused=True)
    except (RuntimeError, TypeError):  # an older torch, or a device without the fused kernel
        return torch.optim.Adam(params, lr=lr, eps=eps)


def placed(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``model`` on ``device``; on the CPU with its convolutions' weights in channels-last (NHWC) memory format, in
    which oneDNN's convolutions run the Nature CNN's backward pass about a fifth faster (docs/performance.md:
    the doom-basic update's profile). Same numbers up to float32 rounding; parameters that are not 4-D stay as
    they are. On a GPU the layout stays the default."""
    model = model.to(device)
    return model.to(memory_format=torch.channels_last) if device.type == "cpu" else model


def lower_update_precision(model: torch.nn.Module, precision: str, device: torch.device) -> str:
    """Give ``model``'s convolutional torsos ``learner.update_precision`` for the update's passes (``networks.CNN``)
    and return the precision the update computes in. ``auto`` is bfloat16 where ``device`` computes it natively,
    float32 elsewhere; an explicit bfloat16 on a CPU without it (emulated, slower) is said, not refused."""
    torsos = [m for m in model.modules() if isinstance(m, CNN)]
    native = _native_bfloat16(device)
    if precision == "auto":
        precision = "bfloat16" if torsos and native else "float32"
        if torsos:
            log.info("learner.update_precision auto: the CNN's update in %s (%s)", precision,
                     f"{device.type} computes bfloat16 natively" if native else f"no native bfloat16 on {device.type}")
    if precision == "float32":
        return precision
    if not torsos:
        log.warning("learner.update_precision %s: the policy has no convolutional torso; its update is float32",
                    precision)
        return "float32"
    if not native:
        log.warning("learner.update_precision %s: this %s has no native bfloat16 (a CPU: AVX512-BF16 or AMX); the "
                    "update's convolutions will be slower than in float32", precision, device.type.upper())
    for torso in torsos:
        torso.update_dtype = torch.bfloat16
    return precision


def _native_bfloat16(device: torch.device) -> bool:
    """Whether ``device`` computes bfloat16 convolutions natively (oneDNN's check on a CPU, CUDA's on a GPU)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check()) if check is not None else False


def align_moments(optimizer: torch.optim.Optimizer) -> None:
    """Give each of the optimizer's per-parameter tensors (Adam's moments) its parameter's memory layout. A checkpoint
    keeps the layout it was saved in (a GPU run's NCHW convolution weights, a CPU run's channels-last: ``placed``),
    and fused Adam pairs a parameter's elements with its moments' by position in memory: two layouts would update
    each weight with another's moments."""
    for param, state in optimizer.state.items():
        for key, value in state.items():
            if torch.is_tensor(value) and value.shape == param.shape and value.stride() != param.stride():
                state[key] = torch.empty_like(param).copy_(value)


class Trainer:
    def __init__(self, config: Config, spec: EnvSpec, device: torch.device, max_lag: int | None = 0,
                 ranks: Ranks | None = None, run_steps: Callable[[], int] | None = None) -> None:
        self.config = config
        self.device = device
        self.ranks = ranks  # several learners (torch.distributed): see distributed.py
        self.max_lag = max_lag  # samples lagging more are an error; None: only counted
        self.lag_sum = 0  # over every trained sample, for the run's mean lag
        self.lag_max = 0
        self.lag_counts = np.zeros(0, np.int64)  # the trained samples of each lag 0, 1, ..., run-long
        self.vtrace_samples = 0  # ppo.vtrace: the valid samples V-trace weighed, run-long ...
        self.vtrace_truncated = 0  # ... and those whose ratio ρ̄ truncated
        torch.manual_seed(config.run.seed)
        images = config.env.normalize_images  # the CNN then takes normalized pixels, not bytes
        if images and spec.observation.tree:
            raise ConfigError("env.normalize_images normalizes a flat image observation; a Dict or Tuple "
                              f"observation's image leaves ({spec.observation.describe()}) are scaled by their "
                              "encoders: leave it false")
        self.model = placed(build_policy(spec.observation, spec.action, config.model, normalized_images=images),
                            device)
        self.update_precision = lower_update_precision(self.model, config.learner.update_precision, device)
        if ranks is not None:
            ranks.broadcast(self.model)
        self.optimizer = adam(list(self.model.parameters()), config.ppo.lr, config.ppo.adam_eps)
        self.spec = spec
        # a flat observation is normalized where a tree's leaf of its kind would be: a Box, not an image (unless
        # env.normalize_images: each pixel by its own moments)
        normalizable = spec.observation.tree or normalized(spec.observation, images)
        self.obs_rms = observation_statistics(spec.observation) if config.env.normalize_obs and normalizable else None
        self.reward_scaler = (RewardScaler(config.ppo.gamma, config.env.clip_reward, self._update_rms)
                              if config.env.normalize_reward else None)
        self.generator = torch.Generator().manual_seed(config.run.seed)
        self.settings = ppo.Settings.of(config.ppo)  # what every update reads, frozen
        self.version = 0
        self.iteration = 0
        self.env_steps = 0  # transitions trained on (by every learner, when there are several)
        self.samples_trained = 0  # ... by this learner
        self.samples_frozen = 0  # acted by policies that never train: none of one policy (a team's: ``team``)
        # the run's transitions so far, which the learning-rate schedule reads (the same fraction for every
        # policy of a run): this trainer's ``env_steps``, or a team's (``team``) for one of its policies
        self.run_steps = run_steps or (lambda: self.env_steps)

    def snapshot(self) -> PolicySnapshot:
        """The current version, frozen for inference."""
        mean = None if self.obs_rms is None else self.obs_rms.mean
        var = None if self.obs_rms is None else self.obs_rms.var
        return PolicySnapshot(self.version, self.model, mean, var, self.config.env.clip_obs, self.device,
                              self.config.learner.inference_kernel)

    def normalizer(self) -> ObsNormalizer:
        mean = None if self.obs_rms is None else self.obs_rms.mean
        var = None if self.obs_rms is None else self.obs_rms.var
        return ObsNormalizer(mean, var, self.config.env.clip_obs, self.device)

    def _apply_learning_rate(self) -> float:
        """Set the optimizer's learning rate for the next update (``learning_rate``) and return it."""
        lr = self.learning_rate()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def learning_rate(self) -> float:
        """``ppo.lr``, annealed with ``ppo.anneal_lr`` linearly to 0 over the run's ``ppo.total_steps``."""
        cfg = self.config.ppo
        if not cfg.anneal_lr:
            return cfg.lr
        return cfg.lr * max(0.0, 1.0 - self.run_steps() / cfg.total_steps)

    def train(self, batch: Batch) -> TrainStats:
        """One PPO update on ``batch``; afterwards ``version`` is one higher. A batch without a valid sample (every
        agent of the policy gone for the whole phase) is no update: the version moves on unchanged, its statistics
        untouched, and the stats say ``skipped`` (several learners still take part in the update, with none).

        Advantages and value targets come from GAE over the values the batch was collected with, or, with
        ``ppo.vtrace``, from V-trace (``algo.vtrace``) over the policy being trained: its log-probs against the
        stored behaviour log-probs, and its critic's values, so that samples of older versions are corrected."""
        start = time.perf_counter()
        cfg = self.config.ppo
        valid = batch.valid  # [T, N]; False past the end of unrolls cut short and where an agent had left
        lag = self._lag(batch)
        if self.ranks is None and not valid.any():
            log.info("version %d: no valid sample in the phase's %d; nothing to learn from, no update",
                     self.version, batch.size)
            nothing = ppo.UpdateStats(0.0, 0.0, 0.0, 0.0, 0.0, gradient_steps=0)
            return replace(self._advance(batch, lag, start, self.learning_rate(), nothing), skipped=True)
        dev = self.device

        def as_t(a: np.ndarray, dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype, device=dev)

        normalize = self.normalizer()
        # [T, N, *obs] (a dict of leaves for a Dict or Tuple observation), normalized with the statistics the batch
        # was collected with; each leaf in its own dtype: uint8 images travel as bytes (a quarter of float32's)
        # and become float32 on the device, the same numbers as converted on the host
        obs = normalize(as_tensors(batch.obs, dev))
        values = as_t(batch.values)  # [T, N]
        rewards = as_t(self.reward_scaler.scale(batch) if self.reward_scaler else batch.rewards)
        model = self.model
        starts = batch.starts  # [T, N] on the host: the state resets where episodes start
        initial_state = as_t(batch.initial_state)  # [N, S]
        actions = as_t(batch.actions, torch.long if model.action_long else torch.float32)  # [T, N, *act]
        logprobs = as_t(batch.logprobs)  # [T, N]
        traced: vtrace.VTrace | None = None
        with torch.no_grad():
            # [T, N, S] the state after each step that a value is bootstrapped from: every slot's last
            # step (a cut at each slot's length) and each step before an episode start (truncations). The states
            # inference left there, where the batch holds them and GAE runs over the behaviour's values; else (and
            # for V-trace, whose values are the trained policy's) recomputed: a forward pass over the whole batch,
            # a quarter of a pixel policy's update (docs/performance.md#the-pixel-update)
            recorded = None if self.config.uses_vtrace() else batch.after()
            after = (as_t(recorded) if recorded is not None
                     else model.states(obs, starts, initial_state, cuts=set(batch.lengths.tolist())))

            def value_after(o: np.ndarray, t: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
                return model.value_after(normalize(as_tensors(o, dev)), after[t, n])

            if self.config.uses_vtrace():
                # π, the policy being trained, beside μ, the versions that acted (the stored log-probs): π's
                # log-probs, and every V of the targets its critic's, the steps' and the bootstrapped ones alike.
                # Where a sample is not valid, the batch's own numbers (a ratio of 1), which no valid sample's
                # trace reads. The value loss's clip is then around this critic's values too.
                current_logprobs, _, current_values = model.evaluate(obs, actions, starts, initial_state)  # [T, N]
                valid_t = torch.from_numpy(valid).to(dev)
                values = torch.where(valid_t, current_values, values)
                next_values, continues = bootstrap(batch, values, value_after)
                traced = vtrace.vtrace(logprobs, torch.where(valid_t, current_logprobs, logprobs), rewards, values,
                                       next_values, continues, cfg.gamma, rho_bar=cfg.vtrace_rho_bar,
                                       c_bar=cfg.vtrace_c_bar, valid=valid_t)
                advantages, returns = traced.advantages, traced.targets
            else:
                next_values, continues = bootstrap(batch, values, value_after)
                advantages, returns = ppo.gae(rewards, values, next_values, continues, cfg.gamma, cfg.gae_lambda)
        lr = self._apply_learning_rate()
        model.train()
        stats = ppo.update(model, self.optimizer, obs, actions, starts, initial_state, valid, logprobs, advantages,
                           returns, values, self.settings, **self._runtime())
        with torch.no_grad():  # an action of several parts: each part's entropy, after the update
            entropies = model.entropy_by_entry(obs, starts, initial_state, torch.from_numpy(valid).to(dev))
        if self.obs_rms is not None:
            self._update_obs_rms(batch.obs[valid])
        advanced = self._advance(batch, lag, start, lr, stats, entropies)
        if traced is None:
            return advanced
        fraction = float(traced.truncated_fraction)  # read once the update has read the device anyway
        weighed = len(lag)  # the valid samples
        self.vtrace_samples += weighed
        self.vtrace_truncated += round(fraction * weighed)
        return replace(advanced, vtrace_truncated=fraction)

    def train_empty(self) -> TrainStats:
        """Several learners: this one's phase closed with no data, and it takes part in the update with
        none (zero gradients), so that every learner trains every version (``distributed.py``)."""
        start = time.perf_counter()
        if self.reward_scaler is not None:
            self._update_rms(self.reward_scaler.rms, np.zeros(0))
        lr = self._apply_learning_rate()
        self.model.train()
        stats = ppo.optimize(self.model, self.optimizer, lambda *_: (), 0, self.settings, device=self.device,
                             **self._runtime())
        if self.obs_rms is not None:
            self._update_obs_rms(np.zeros(0, self.spec.observation.array_dtype))
        return self._advance(None, np.zeros(0, np.int64), start, lr, stats)

    def _runtime(self) -> dict:
        """What an update needs beyond its settings: the minibatches' generator, and with several learners the
        gradients' average and the KL's agreement (``ppo.optimize``)."""
        ranks = self.ranks
        runtime: dict = dict(generator=self.generator)
        if ranks is not None:
            runtime.update(reduce_gradients=lambda n: ranks.reduce_gradients(self.model, n), agree=ranks.mean)
        return runtime

    def _update_obs_rms(self, obs: np.ndarray) -> None:
        """Fold observations [B, *obs] into the observation statistics: of each normalized leaf of a tree."""
        if isinstance(self.obs_rms, LeafStatistics):
            for path, rms in self.obs_rms.leaves.items():
                self._update_rms(rms, obs[path])
        else:
            self._update_rms(self.obs_rms, obs)

    def _update_rms(self, rms: RunningMeanStd, x: np.ndarray) -> None:
        """Fold ``x`` into ``rms``; with several learners, every learner's rows, in rank order."""
        if self.ranks is None:
            rms.update(x)
            return
        for mean, var, n in self.ranks.moments(x, rms.mean.shape):
            rms.update_moments(mean, var, n)

    def _lag(self, batch: Batch) -> np.ndarray:
        """[B] (this version) - (version that produced the sample); an error beyond what is allowed."""
        lag = self.version - batch.versions[batch.valid]
        if self.max_lag is not None:
            bad = (lag < 0) | (lag > self.max_lag)
            if bad.any():
                raise OffPolicyError(
                    f"{int(bad.sum())} of {batch.size} samples were produced by versions "
                    f"{sorted(set((self.version - lag[bad]).tolist()))}; version {self.version} trains on them "
                    f"and allows a lag of at most {self.max_lag}"
                )
        return lag

    def _advance(self, batch: Batch | None, lag: np.ndarray, start: float, lr: float,
                 update: ppo.UpdateStats, entropies: dict[str, float] | None = None) -> TrainStats:
        """Count the batch and move to the next version. ``env_steps`` counts every learner's samples:
        the learning-rate schedule and the step budget are the run's, not one learner's."""
        if self.ranks is not None:  # after every update, on every learner: the parameters must be identical
            self.ranks.check_identical(self.model)  # (before counting: a diverged update is no iteration)
        if update.skipped_steps:
            log.warning("version %d: %d of %d gradient steps skipped: their loss or gradient was not finite "
                        "(NaN or inf); the parameters did not take them (skipped_updates in metrics.csv)",
                        self.version, update.skipped_steps, update.skipped_steps + update.gradient_steps)
        trained_version = self.version
        size = 0 if batch is None else batch.size
        self.version += 1
        self.iteration += 1
        self.env_steps += size if self.ranks is None else self.ranks.total(size)
        self.samples_trained += size
        self.lag_sum += int(lag.sum())
        self.lag_max = max(self.lag_max, int(lag.max(initial=0)))
        counts = np.bincount(lag[lag >= 0])  # (a stamp newer than the trainer's, possible only unbounded, is no lag)
        self.lag_counts = add_counts(self.lag_counts, counts)
        return TrainStats(
            version=trained_version, samples=size, off_policy_samples=int(np.count_nonzero(lag)),
            policy_lag_mean=float(lag.mean()) if len(lag) else 0.0, policy_lag_max=int(lag.max(initial=0)),
            train_s=time.perf_counter() - start, lr=lr, update=update, entropy_by_entry=entropies or {},
            lag_counts=tuple(counts.tolist()),
        )

    def skip(self) -> None:
        """A phase closed with no data: the next version is this one, unchanged."""
        self.version += 1

    # -- checkpoints ----------------------------------------------------------------

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "obs_rms": None if self.obs_rms is None else self.obs_rms.state_dict(),
            "reward_rms": None if self.reward_scaler is None else self.reward_scaler.rms.state_dict(),
            "reward_returns": None if self.reward_scaler is None else self.reward_scaler.returns,
            "version": self.version,
            "iteration": self.iteration,
            "env_steps": self.env_steps,
            "samples_trained": self.samples_trained,
            "lag_sum": self.lag_sum,
            "lag_max": self.lag_max,
            "lag_counts": self.lag_counts.copy(),
            "vtrace_samples": self.vtrace_samples,
            "vtrace_truncated": self.vtrace_truncated,
            "torch_rng": torch.get_rng_state(),
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict) -> None:
        try:
            self.model.load_state_dict(state["model"])
        except RuntimeError as err:  # an older layout of the network (``LeafActorCritic``), or another network
            raise ConfigError(f"--resume: the checkpoint's parameters do not fit the network the run's config "
                              f"(model:) describes: {str(err).splitlines()[0]}") from err
        self.optimizer.load_state_dict(state["optimizer"])
        align_moments(self.optimizer)
        if self.obs_rms is not None and state["obs_rms"] is not None:
            self.obs_rms.load_state_dict(state["obs_rms"])
        if self.reward_scaler is not None and state["reward_rms"] is not None:
            self.reward_scaler.rms.load_state_dict(state["reward_rms"])
            self.reward_scaler.returns = dict(state["reward_returns"])
        self.version, self.iteration, self.env_steps = state["version"], state["iteration"], state["env_steps"]
        self.samples_trained = state.get("samples_trained", self.env_steps)
        self.lag_sum, self.lag_max = state["lag_sum"], state["lag_max"]
        self.lag_counts = np.asarray(state.get("lag_counts", np.zeros(0)), np.int64)  # (older checkpoints: none)
        self.vtrace_samples = state.get("vtrace_samples", 0)  # (a checkpoint from before ppo.vtrace: none)
        self.vtrace_truncated = state.get("vtrace_truncated", 0)
        torch.set_rng_state(state["torch_rng"])
        self.generator.set_state(state["generator"])
