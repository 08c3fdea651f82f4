"""Several policies in one run (the ``policies`` config): one trainer and one snapshot per policy, one phase clock.

A PettingZoo parallel env's agents are mapped to named policies (``envs.pettingzoo``). Every actor's k slots are
its envs' agents in ``possible_agents`` order, so slot n of a member belongs to the policy of agent n mod A.
A slot's observation holds each policy's own leaves under the policy's name (zeros for the other policies) beside
the leaves every slot has (``agent_active``, ``agent_id``); ``PolicyView`` reads one policy's out of it, and its
part of the action.

Versions. The admission gate keeps one phase clock for the run: phase u closes when every member's unroll of it
is complete, whichever policies its slots belong to, and the learner publishes the next phase once every policy
that trains has trained on its part of the batch. Each policy has its own version counter: a policy that trains
advances with every phase (so its version is the phase), a frozen one (``train: false``) keeps the version it
was loaded with. Inference stamps every sample with its own policy's version. Strict holds per policy: the batch
of policy P in phase u holds only samples stamped with P's version at u, and ``Team.train`` refuses any other
(``OffPolicyError``, as ``Trainer`` does for one policy). A policy whose part of a phase holds no valid sample
(every one of its agents gone for the whole phase) skips it: no update, and its version still moves on with the
clock, so that the next phase's samples are stamped with the phase's version as every other policy's are.

Progress. The run's step count (``env_steps``: every policy's slots' steps, a frozen one's included) is what
``ppo.total_steps`` and every policy's learning-rate schedule read, so that all reach the schedule's end
together whatever share of the samples each takes.

The learner sees a ``Team`` where it would see one ``Trainer`` (the phase clock's version, iterations, step
counts, ``train``, ``skip``, checkpoints) and a ``TeamBackend`` where it would see one ``SnapshotBackend``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lockstep.algo import ppo
from lockstep.algo.normalize import observation_statistics
from lockstep.config import Config, ConfigError
from lockstep.envs import EnvSpec, action_entries, policy_spaces
from lockstep.learner import checkpoint as checkpoint_lib
from lockstep.learner.audit_trail import AuditWriter
from lockstep.learner.backends import InferenceStats, SnapshotBackend
from lockstep.learner.inference import InferenceResult
from lockstep.learner.parts import DEFAULT_PARTS, Parts
from lockstep.learner.rollout import Batch
from lockstep.learner.trainer import OffPolicyError, Trainer, TrainStats
from lockstep.observe.metrics import add_counts
from lockstep.sync import Strategy
from lockstep.transport.messages import check_action_mask
from lockstep.transport.protocol import INVALID_ARGUMENT, Refused

log = logging.getLogger(__name__)


class PolicyView:
    """One policy's part of a slot's observation and action (module docstring), and where its slots lie."""

    def __init__(self, spec: EnvSpec, name: str, mask_key: str) -> None:
        self.name = name
        self.observation, self.action = policy_spaces(spec.observation, spec.action, spec.policies, name, mask_key)
        self.state_size = 0  # the policy's recurrent state per slot (``Team`` sets it once its network exists)
        self.spec = dataclasses.replace(spec, observation=self.observation, action=self.action, agents=1,
                                        policy_of=())
        own = f"{name}."
        # (the policy's path, the slot's path) of each of its observation's leaves
        self._paths = [(path, own + path if own + path in spec.observation.paths() else path)
                       for path in self.observation.paths()]
        self._agents = np.array([p == name for p in spec.policy_of])  # [A] its agents among the env's
        entries = {path: (first, size) for path, _, first, size in action_entries(spec.action)}
        self._part = entries[name] if self.action is not spec.action else None  # its entries of a slot's action

    def columns(self, slots: int) -> np.ndarray:
        """Which of a member's ``slots`` (whole envs of the env's agents) are this policy's: indices [m]."""
        return np.flatnonzero(np.tile(self._agents, slots // len(self._agents)))

    def obs(self, records: np.ndarray) -> np.ndarray:
        """A slot's observation records [...] -> this policy's [...] (a copy)."""
        out = np.empty(records.shape, self.observation.array_dtype)
        for path, slot_path in self._paths:
            out[path] = records[slot_path]
        return out

    def actions(self, actions: np.ndarray) -> np.ndarray:
        """Actions of a slot [..., *slot act] -> this policy's [..., *act]."""
        if self._part is None:
            return actions
        first, size = self._part
        part = actions[..., first:first + size]
        return part.reshape(*actions.shape[:-1], *self.action.element_shape).astype(self.action.action_dtype)

    def put_actions(self, into: np.ndarray, rows: np.ndarray, actions: np.ndarray) -> None:
        """Write this policy's actions [m, *act] into rows ``rows`` of a slot's actions [k, *slot act]."""
        if self._part is None:
            into[rows] = actions
            return
        first, size = self._part
        into[rows, first:first + size] = actions.reshape(len(rows), size)

    def batch(self, batch: Batch, columns: np.ndarray, slots_per_member: tuple[int, ...]) -> Batch:
        """Its columns of a phase's batch: its observations, its part of the actions, the slots' state cut to
        its own (``TeamBackend`` pads every policy's state to the longest)."""
        where = np.full(batch.num_slots, -1)
        where[columns] = np.arange(len(columns))  # a column's place among this policy's
        final = where[batch.final_n] >= 0
        own = min(batch.initial_state.shape[1], self.state_size)
        return Batch(
            version=batch.version, members=batch.members, slots_per_member=slots_per_member,
            obs=self.obs(batch.obs[:, columns]), actions=self.actions(batch.actions[:, columns]),
            logprobs=batch.logprobs[:, columns], values=batch.values[:, columns], rewards=batch.rewards[:, columns],
            terminated=batch.terminated[:, columns], truncated=batch.truncated[:, columns],
            versions=batch.versions[:, columns], bootstrap_obs=self.obs(batch.bootstrap_obs[columns]),
            lengths=batch.lengths[columns], final_t=batch.final_t[final], final_n=where[batch.final_n[final]],
            final_obs=self.obs(batch.final_obs[final]),
            initial_state=batch.initial_state[columns][:, :own],
            bootstrap_state=None if batch.bootstrap_state is None else batch.bootstrap_state[columns][:, :own],
            final_state=None if batch.final_state is None else batch.final_state[final][:, :own],
        )


def _seed(seed: int, index: int) -> int:
    """Policy ``index``'s seed (its initial parameters and minibatch order): the run's for the first policy."""
    return seed + 1_000_003 * index


class Team:
    """The trainers of a run's policies, seen by the learner as one trainer (module docstring)."""

    def __init__(self, config: Config, spec: EnvSpec, device: torch.device, max_lag: int | None = 0,
                 ranks: Any = None) -> None:
        if ranks is not None:
            raise ConfigError("several learners (torchrun) train one policy; a run with several policies "
                              "(policies) runs one learner")
        self.config, self.spec, self.device, self.ranks, self.max_lag = config, spec, device, None, max_lag
        self.views: dict[str, PolicyView] = {}
        self.trainers: dict[str, Trainer] = {}
        for index, name in enumerate(spec.policies):
            view = PolicyView(spec, name, config.env.action_mask_key)
            own = dataclasses.replace(config, model=config.model_of(name), policies={},
                                      run=dataclasses.replace(config.run, seed=_seed(config.run.seed, index)))
            trainer = Trainer(own, view.spec, device, max_lag=max_lag, run_steps=lambda: self.env_steps)
            view.state_size = trainer.model.state_size
            self.views[name], self.trainers[name] = view, trainer
        self.training = tuple(name for name in spec.policies if config.policies[name].train)
        self.frozen = tuple(name for name in spec.policies if name not in self.training)
        for name in spec.policies:
            if config.policies[name].load:
                self._load(name)
        self.version = 0  # the phase clock: the version of every policy that trains
        self.iteration = 0
        self.samples: dict[str, int] = {}  # each policy's samples (its slots' steps), trained on or (frozen) acted
        self._split: tuple[Batch, dict[str, Batch]] | None = None  # the last batch split, and its parts (``split``)

    @property
    def env_steps(self) -> int:
        """The run's progress (``ppo.total_steps``, the learning-rate schedule of every policy): the slots' steps
        of every phase, trained on or acted by a frozen policy."""
        return sum(self.samples.values())

    @property
    def samples_trained(self) -> int:
        """The steps trained on: those of the policies that train (summary.json's ``transitions_trained``)."""
        return sum(self.samples.get(name, 0) for name in self.training)

    @property
    def samples_frozen(self) -> int:
        """The steps frozen policies acted, never to be trained on (``transitions_frozen``)."""
        return sum(self.samples.get(name, 0) for name in self.frozen)

    @property
    def lag_sum(self) -> int:
        """Over every sample: (the version that trained it) - (the one that produced it); a frozen one's is 0."""
        return sum(self.trainers[name].lag_sum for name in self.training)

    @property
    def lag_max(self) -> int:
        return max(self.trainers[name].lag_max for name in self.training)

    @property
    def lag_counts(self) -> np.ndarray:
        """The trained samples of each lag 0, 1, ..., over every policy that trains."""
        return functools.reduce(add_counts, (self.trainers[name].lag_counts for name in self.training))

    @property
    def vtrace_samples(self) -> int:
        """ppo.vtrace: the valid samples V-trace weighed, over every policy that trains ..."""
        return sum(self.trainers[name].vtrace_samples for name in self.training)

    @property
    def vtrace_truncated(self) -> int:
        """... and those whose ratio ρ̄ truncated."""
        return sum(self.trainers[name].vtrace_truncated for name in self.training)

    @property
    def state_size(self) -> int:
        """A slot's recurrent state: the longest of the policies' (each reads its own first entries)."""
        return max(view.state_size for view in self.views.values())

    def version_of(self, name: str) -> int:
        """Policy ``name``'s version now: the phase clock's for a policy that trains, its own for a frozen one."""
        return self.version if name in self.training else self.trainers[name].version

    def _load(self, name: str) -> None:
        """Start policy ``name`` from the parameters and observation statistics of ``policies.NAME.load``.

        The statistics are the source's whatever the run's ``env.normalize_obs``: its parameters learned on
        observations normalized with them (or on raw ones, when the source kept none), so the policy acts with
        them, and, if it trains, keeps them up to date as its source did."""
        policy = self.config.policies[name]
        source = Path(policy.load)
        try:
            path = checkpoint_lib.find(source / "checkpoints", checkpoint_lib.FINAL) if source.is_dir() else source
            state = checkpoint_lib.load(path)["trainer"]
        except (FileNotFoundError, KeyError, RuntimeError, OSError) as err:
            raise ConfigError(f"policies.{name}.load: cannot read a checkpoint from {source}: {err}") from err
        if "policies" in state:  # a run of several policies: one of them
            which = policy.load_policy or name
            if which not in state["policies"]:
                raise ConfigError(f"policies.{name}.load: {path} holds the policies {sorted(state['policies'])}, "
                                  f"not {which!r}; name one with policies.{name}.load_policy")
            state = state["policies"][which]
        elif policy.load_policy:
            raise ConfigError(f"policies.{name}.load_policy: {path} holds one policy, not several")
        trainer = self.trainers[name]
        try:
            trainer.model.load_state_dict(state["model"])
        except RuntimeError as err:
            raise ConfigError(f"policies.{name}.load: {path}'s parameters do not fit policy {name}'s network "
                              f"for its agents' spaces: {str(err).splitlines()[0]}") from err
        if state.get("obs_rms") is None:
            trainer.obs_rms = None
        else:
            trainer.obs_rms = trainer.obs_rms or observation_statistics(trainer.spec.observation)
            try:
                trainer.obs_rms.load_state_dict(state["obs_rms"])
            except (KeyError, ValueError) as err:
                raise ConfigError(f"policies.{name}.load: {path}'s observation statistics do not fit policy "
                                  f"{name}'s observations: {err!r}") from err
        if name in self.frozen:
            trainer.version = int(state.get("version", 0))  # its samples are stamped with it, run-long
        log.info("policy %s starts from %s (version %d there)%s", name, path, int(state.get("version", 0)),
                 "" if name in self.training else ", frozen")

    # -- training ---------------------------------------------------------------------

    def columns(self, batch: Batch) -> dict[str, tuple[np.ndarray, tuple[int, ...]]]:
        """Each policy's columns of ``batch`` and its slots per member."""
        found = {}
        for name, view in self.views.items():
            parts, starts = [], np.cumsum([0, *batch.slots_per_member])
            for start, slots in zip(starts, batch.slots_per_member):
                parts.append(start + view.columns(slots))
            found[name] = np.concatenate(parts), tuple(len(p) for p in parts)
        return found

    def split(self, batch: Batch) -> dict[str, Batch]:
        """Each policy's part of ``batch``; the last batch's parts are kept, since the audit trail writes the
        parts of the batch just trained on."""
        if self._split is None or self._split[0] is not batch:
            self._split = batch, {name: self.views[name].batch(batch, columns, per_member)
                                  for name, (columns, per_member) in self.columns(batch).items()}
        return self._split[1]

    def train(self, batch: Batch) -> TrainStats:
        """One PPO update of every policy that trains, each on its part of ``batch``; a frozen policy's part is
        checked (every sample its own version's) and counted. A policy with no valid sample in its part (every
        one of its agents gone for the whole phase) skips the phase: no update, its version moves on with the
        clock (``Trainer.train``). The phase clock moves to the next version."""
        start = time.perf_counter()
        parts = self.split(batch)
        stats: dict[str, TrainStats] = {}
        for name, part in parts.items():
            if name in self.training:
                stats[name] = self.trainers[name].train(part)
            else:
                stats[name] = self._check_frozen(name, part)
        lags = list(stats.values())
        samples = sum(s.samples for s in lags)
        for name, s in stats.items():
            self.samples[name] = self.samples.get(name, 0) + s.samples
        trained_version = self.version
        self.version += 1
        self.iteration += 1
        trained = [stats[name] for name in self.training if not stats[name].skipped]  # the updates taken
        weights = np.array([max(s.samples, 1) for s in trained], np.float64)
        update = ppo.UpdateStats(**{
            f.name: (sum(getattr(s.update, f.name) for s in trained) if f.type in ("int", int) else
                     float(np.average([getattr(s.update, f.name) for s in trained], weights=weights)) if trained
                     else 0.0)
            for f in dataclasses.fields(ppo.UpdateStats)})
        traced = [s for s in trained if s.vtrace_truncated is not None]  # ppo.vtrace: every update taken
        return TrainStats(
            version=trained_version, samples=samples, off_policy_samples=sum(s.off_policy_samples for s in lags),
            policy_lag_mean=sum(s.policy_lag_mean * s.samples for s in lags) / samples if samples else 0.0,
            policy_lag_max=max(s.policy_lag_max for s in lags), train_s=time.perf_counter() - start,
            lr=stats[self.training[0]].lr, update=update,  # every policy's: one schedule (``Trainer.run_steps``)
            entropy_by_entry={f"{name}/{entry}": value for name in self.training
                              for entry, value in stats[name].entropy_by_entry.items()},
            policies=stats,
            lag_counts=tuple(functools.reduce(add_counts, (np.asarray(s.lag_counts, np.int64) for s in lags)).tolist()),
            vtrace_truncated=float(np.average([s.vtrace_truncated for s in traced],
                                              weights=[max(s.samples, 1) for s in traced])) if traced else None,
        )

    def _check_frozen(self, name: str, batch: Batch) -> TrainStats:
        """A frozen policy's part of a phase: every valid sample must be its own version's; nothing trains. Its
        steps count as a trainer counts them (``batch.size``: its slots' steps, an agent's absence included)."""
        version = self.trainers[name].version
        stamps = batch.versions[batch.valid]
        if np.any(stamps != version):
            wrong = sorted(set(stamps[stamps != version].tolist()))
            raise OffPolicyError(f"policy {name} (frozen at version {version}): {int(np.sum(stamps != version))} "
                                 f"of {batch.size} samples were produced by versions {wrong}")
        nothing = ppo.UpdateStats(0.0, 0.0, 0.0, 0.0, 0.0, 0)
        return TrainStats(version=version, samples=batch.size, off_policy_samples=0, policy_lag_mean=0.0,
                          policy_lag_max=0, train_s=0.0, lr=0.0, update=nothing)

    def skip(self) -> None:
        """A phase closed with no data: every policy that trains moves to the next version, unchanged."""
        self.version += 1
        for name in self.training:
            self.trainers[name].skip()

    def train_empty(self) -> TrainStats:
        raise RuntimeError("a run with several policies has one learner: no phase is trained empty")

    # -- checkpoints ------------------------------------------------------------------

    def state_dict(self) -> dict:
        # the step counts and lags derive from each policy's samples and its trainer's own state
        return {"policies": {name: trainer.state_dict() for name, trainer in self.trainers.items()},
                "version": self.version, "iteration": self.iteration, "samples": dict(self.samples)}

    def load_state_dict(self, state: dict) -> None:
        if "policies" not in state or set(state["policies"]) != set(self.trainers):
            raise ConfigError(f"--resume: the checkpoint holds the policies {sorted(state.get('policies', {}))}, "
                              f"the run's config {sorted(self.trainers)}")
        for name, trainer in self.trainers.items():
            trainer.load_state_dict(state["policies"][name])
        self.version, self.iteration, self.samples = state["version"], state["iteration"], dict(state["samples"])


class TeamBackend:
    """One snapshot backend per policy behind one inference call: a request's slots go to their policies'
    batchers (each its own fixed layout, so a slot's numbers never depend on what else shares a pass), and
    the answers come back as the request's [k] rows, each sample stamped with its own policy's version."""

    def __init__(self, team: Team, config: Config, expected: Callable[[], int], audit: TeamAudit | None) -> None:
        self.team = team
        writers = {} if audit is None else audit.writers
        self.backends = {name: SnapshotBackend(trainer, config, expected, writers.get(name))
                         for name, trainer in team.trainers.items()}
        self.state_size = team.state_size
        self._columns: dict[int, dict[str, np.ndarray]] = {}  # member -> each policy's rows of its requests
        self._slot_action = team.spec.action

    def check_join(self, member: int, num_envs: int) -> None:
        agents = self.team.spec.agents
        if num_envs % agents:
            raise Refused(INVALID_ARGUMENT, f"actor {member}: {num_envs} slots are not whole envs of {agents} agents")

    def join(self, member: int, num_envs: int) -> None:
        self._columns[member] = {name: view.columns(num_envs) for name, view in self.team.views.items()}
        for name, backend in self.backends.items():
            backend.join(member, len(self._columns[member][name]))

    def leave(self, member: int) -> None:
        self._columns.pop(member, None)
        for backend in self.backends.values():
            backend.leave(member)

    async def infer(self, member: int, obs: np.ndarray, keys: np.ndarray, counters: np.ndarray,
                    state: np.ndarray) -> InferenceResult:
        columns = self._columns[member]
        views = self.team.views
        calls = []
        for name, rows in columns.items():
            own = views[name].obs(obs[rows])
            check_action_mask(own, views[name].observation)
            calls.append(self.backends[name].infer(member, own, keys[rows], counters[rows],
                                                   state[rows][:, :views[name].state_size]))
        results = await asyncio.gather(*calls)  # the policies' batchers flush side by side
        k = len(obs)
        spec = self._slot_action
        actions = np.zeros((k, *spec.element_shape), spec.action_dtype)
        logprobs, values = np.zeros(k, np.float32), np.zeros(k, np.float32)
        versions = np.zeros(k, np.int64)
        after = np.zeros_like(state)
        for (name, rows), result in zip(columns.items(), results):
            views[name].put_actions(actions, rows, result.actions)
            logprobs[rows], values[rows], versions[rows] = result.logprobs, result.values, result.version
            after[rows, :result.state.shape[1]] = result.state
        return InferenceResult(actions, logprobs, values, self.team.version, after, versions=versions)

    def train(self, update):
        return update()

    def publish(self) -> None:
        """The policies that train serve their new versions; a frozen one keeps its snapshot."""
        for name in self.team.training:
            self.backends[name].publish()

    def stats(self) -> InferenceStats:
        parts = [backend.stats() for backend in self.backends.values()]
        return InferenceStats(**{f.name: sum(getattr(s, f.name) for s in parts)
                                 for f in dataclasses.fields(InferenceStats)})

    def close(self) -> None:
        for backend in self.backends.values():
            backend.close()


class TeamAudit:
    """The audit trail of several policies: ``audit/policies/NAME/``, each in the one-policy format (its own
    batches, with its own observations and actions, and its own versions), beside the run's config."""

    def __init__(self, directory: Path, config: Config, team: Team, fresh: bool = True) -> None:
        self.team = team
        self.root = AuditWriter(directory, config, fresh=fresh)
        self.writers = {name: AuditWriter(policy_audit_dir(directory, name), policy_config(config, name),
                                          fresh=fresh)
                        for name in team.trainers}

    def batch(self, iteration: int, trained_by: int, strategy: Strategy, batch: Batch) -> None:
        for name, part in self.team.split(batch).items():
            by = trained_by if name in self.team.training else self.team.trainers[name].version
            self.writers[name].batch(iteration, by, strategy, part)


PARTS = Parts(trainer=Team, backend=TeamBackend, audit=TeamAudit)


def parts(given: Parts) -> Parts:
    """The learner's parts for a run of several policies: the team's; a ``ConfigError`` for parts put in from
    outside (the benchmarks' designs serve one policy)."""
    if given != DEFAULT_PARTS:
        raise ConfigError("a run with several policies (policies) runs the learner's own parts, not the "
                          "benchmarks'")
    return PARTS


def policy_audit_dir(directory: Path, name: str) -> Path:
    """Where policy ``name``'s audit trail lies in a run's ``audit/``."""
    return directory / "policies" / name


def policy_config(config: Config, name: str) -> Config:
    """The config that describes policy ``name`` alone: the run's with the policy's network (its audit trail's,
    and what ``lockstep eval`` and the audit rebuild the policy from)."""
    return dataclasses.replace(config, model=config.model_of(name), policies={})


def summary(team: Team) -> dict[str, Any]:
    """summary.json's ``policies``: each policy's agents, whether it trains, its version and its samples."""
    return {name: {"agents": [agent for agent, p in zip(team.spec.agent_names, team.spec.policy_of) if p == name],
                   "train": name in team.training, "version": team.version_of(name),
                   "samples": team.samples.get(name, 0)}
            for name in team.trainers}
