"""The rollout store: what each actor's env slots did during one phase.

An ``Unroll`` holds T steps of one member's k slots, written in place as
inference results and outcomes arrive. ``assemble`` lays the unrolls of a closed
phase side by side, in member order (never arrival order), into a ``Batch``
of [T, N] arrays, N being the total number of slots. A ``PhaseStore`` keeps
complete unrolls until their phase closes and queues the batches for the trainer.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from lockstep.envs.spaces import ACTIVE_LEAF

if TYPE_CHECKING:
    from lockstep.sync import ClosedPhase

RECENT_PHASES = 20  # closed phases whose collect times a phase's stall verdict is judged against (``StallRule``)


class Unroll:
    """T steps of one member's k env slots, collected in one phase."""

    def __init__(self, member: int, num_envs: int, steps: int, obs_shape: tuple[int, ...],
                 obs_dtype: np.dtype, act_shape: tuple[int, ...], act_dtype: np.dtype,
                 initial_state: np.ndarray | None = None) -> None:
        self.member = member
        T, k = steps, num_envs
        # [k, S] the policy state the slots' first step was acted with; none given: a feedforward policy's [k, 0]
        empty = np.zeros((k, 0), np.float32)
        self.initial_state = empty if initial_state is None else np.array(initial_state, np.float32)
        self.obs = np.zeros((T, k, *obs_shape), dtype=obs_dtype)
        self.actions = np.zeros((T, k, *act_shape), dtype=act_dtype)
        self.logprobs = np.zeros((T, k), dtype=np.float32)
        self.values = np.zeros((T, k), dtype=np.float32)
        self.rewards = np.zeros((T, k), dtype=np.float32)
        self.terminated = np.zeros((T, k), dtype=bool)
        self.truncated = np.zeros((T, k), dtype=bool)
        self.versions = np.full((T, k), -1, dtype=np.int64)
        # (t, env indices, observations, states): each truncated episode's last observation, and the policy state
        # after step t that its value is bootstrapped from
        self.final_obs: list[tuple[int, np.ndarray, np.ndarray, np.ndarray | None]] = []
        self.bootstrap_obs: np.ndarray | None = None  # [k, *obs], the observation after step T-1
        self.bootstrap_state: np.ndarray | None = None  # [k, S], the policy state after step T-1
        self.steps_acted = 0
        self.steps_completed = 0

    @property
    def num_steps(self) -> int:
        return self.obs.shape[0]

    def record_action(self, t: int, obs: np.ndarray, action: np.ndarray, logprob: np.ndarray,
                      value: np.ndarray, version: int | np.ndarray) -> None:
        """Step t's inference: ``version`` the one that acted, or [k] each slot's (several policies)."""
        self.obs[t] = obs
        self.actions[t] = action
        self.logprobs[t] = logprob
        self.values[t] = value
        self.versions[t] = version
        self.steps_acted = t + 1

    def record_outcome(self, t: int, reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
                       final_index: np.ndarray, final_obs: np.ndarray, state: np.ndarray | None = None) -> None:
        """Step t's outcome; ``state`` [k, S] the slots' policy state after step t, as inference left it (none
        given: the batch holds no states after steps, and the trainer recomputes those it bootstraps from)."""
        self.rewards[t] = reward
        self.terminated[t] = terminated
        self.truncated[t] = truncated
        if len(final_index):
            index = np.array(final_index, dtype=np.int64)
            after = None if state is None else np.array(state[index], np.float32)
            self.final_obs.append((t, index, np.array(final_obs), after))
        self.steps_completed = t + 1

    def finish(self, bootstrap_obs: np.ndarray, state: np.ndarray | None = None) -> None:
        """The observation after the last step (T steps, or fewer when the phase cut stragglers short), and
        ``state`` [k, S] the policy state after it, as inference left it (``record_outcome``)."""
        self.bootstrap_obs = np.array(bootstrap_obs)
        self.bootstrap_state = None if state is None else np.array(state, np.float32)

    @property
    def states_recorded(self) -> bool:
        """Whether the states after its last step and before each truncation were recorded."""
        return self.bootstrap_state is not None and all(after is not None for *_, after in self.final_obs)

    @property
    def complete(self) -> bool:
        return 0 < self.steps_acted == self.steps_completed and self.bootstrap_obs is not None


@dataclass
class Batch:
    """One phase's transitions, [T, N] with N slots in member order."""

    version: int  # the version the phase was collected for
    members: tuple[int, ...]
    slots_per_member: tuple[int, ...]
    obs: np.ndarray  # [T, N, *obs]
    actions: np.ndarray  # [T, N, *act]
    logprobs: np.ndarray  # [T, N] behaviour log-probs
    values: np.ndarray  # [T, N] behaviour values
    rewards: np.ndarray  # [T, N]
    terminated: np.ndarray  # [T, N]
    truncated: np.ndarray  # [T, N]
    versions: np.ndarray  # [T, N] version that produced each action
    bootstrap_obs: np.ndarray  # [N, *obs] the observation after each slot's last step
    lengths: np.ndarray  # [N] steps of each slot: T, or fewer for an unroll cut short
    final_t: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [M] step of each truncation
    final_n: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # [M] slot of each truncation
    final_obs: np.ndarray | None = None  # [M, *obs] last observation of each truncated episode
    initial_state: np.ndarray | None = None  # [N, S] policy state at each slot's first step; none given: [N, 0]
    # The policy states after the steps whose values are bootstrapped, as inference computed them (``after``):
    # [N, S] after each slot's last step, [M, S] after each truncation's step; None: not recorded.
    bootstrap_state: np.ndarray | None = None
    final_state: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.initial_state is None:  # a feedforward policy's state holds no floats
            self.initial_state = np.zeros((self.obs.shape[1], 0), np.float32)

    @property
    def starts(self) -> np.ndarray:
        """[T, N] True where a step begins a new episode within the unroll (its state was reset to zeros):
        the step after one that terminated or truncated. Step 0's reset is already in ``initial_state``."""
        starts = np.zeros_like(self.terminated)
        starts[1:] = self.terminated[:-1] | self.truncated[:-1]
        return starts

    def after(self) -> np.ndarray | None:
        """[T, N, S] the recorded policy state after each step a value is bootstrapped from (each slot's last
        step, each truncation's), zeros elsewhere; None where the batch does not hold them all."""
        if self.bootstrap_state is None or self.final_state is None:
            return None
        after = np.zeros((self.num_steps, self.num_slots, self.initial_state.shape[1]), np.float32)
        after[self.lengths - 1, np.arange(self.num_slots)] = self.bootstrap_state
        after[self.final_t, self.final_n] = self.final_state  # a truncation at a slot's last step: the same state
        return after

    @property
    def num_steps(self) -> int:
        return self.obs.shape[0]

    @property
    def num_slots(self) -> int:
        return self.obs.shape[1]

    @property
    def valid(self) -> np.ndarray:
        """[T, N] True where a slot has a step to train on: False past the end of an unroll cut short, and
        where the slot's agent had left its episode (a multi-agent env's ``agent_active`` leaf is 0)."""
        within = np.arange(self.num_steps)[:, None] < self.lengths[None, :]
        if self.obs.dtype.names and ACTIVE_LEAF in self.obs.dtype.names:
            within &= self.obs[ACTIVE_LEAF].reshape(self.num_steps, self.num_slots, -1)[..., 0] != 0
        return within

    @property
    def inactive(self) -> int:
        """Steps within the slots' lengths whose agent had left (never trained on)."""
        return self.size - int(self.valid.sum())

    @property
    def size(self) -> int:
        """Transitions in the batch."""
        return int(self.lengths.sum())


class IncompleteUnrollError(RuntimeError):
    pass


def assemble(version: int, unrolls: list[Unroll]) -> Batch:
    """Lay complete unrolls side by side in member order."""
    if not unrolls:
        raise ValueError("cannot assemble a batch from no unrolls")
    unrolls = sorted(unrolls, key=lambda u: u.member)
    for u in unrolls:
        if not u.complete:
            raise IncompleteUnrollError(
                f"unroll of member {u.member} has {u.steps_completed} of {u.steps_acted} steps completed"
            )

    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(u, name) for u in unrolls], axis=1)

    offsets = np.cumsum([0] + [u.obs.shape[1] for u in unrolls])
    finals = [(t, idx + off, obs, after) for u, off in zip(unrolls, offsets) for t, idx, obs, after in u.final_obs]
    bootstrap_state = final_state = None
    if all(u.states_recorded for u in unrolls):
        bootstrap_state = np.concatenate([u.bootstrap_state for u in unrolls], axis=0)
        final_state = np.concatenate([np.zeros((0, unrolls[0].initial_state.shape[1]), np.float32),
                                      *(after for *_, after in finals)], axis=0)
    obs_shape = unrolls[0].obs.shape[2:]
    return Batch(
        version=version,
        members=tuple(u.member for u in unrolls),
        slots_per_member=tuple(u.obs.shape[1] for u in unrolls),
        obs=cat("obs"), actions=cat("actions"), logprobs=cat("logprobs"), values=cat("values"),
        rewards=cat("rewards"), terminated=cat("terminated"), truncated=cat("truncated"),
        versions=cat("versions"),
        bootstrap_obs=np.concatenate([u.bootstrap_obs for u in unrolls], axis=0),
        lengths=np.concatenate([np.full(u.obs.shape[1], u.steps_acted, np.int64) for u in unrolls]),
        final_t=(np.concatenate([np.full(len(idx), t, np.int64) for t, idx, _, _ in finals]) if finals
                 else np.zeros(0, np.int64)),
        final_n=np.concatenate([idx for _, idx, _, _ in finals]) if finals else np.zeros(0, np.int64),
        final_obs=(np.concatenate([obs for _, _, obs, _ in finals], axis=0) if finals
                   else np.zeros((0, *obs_shape), dtype=unrolls[0].obs.dtype)),
        initial_state=np.concatenate([u.initial_state for u in unrolls], axis=0),
        bootstrap_state=bootstrap_state, final_state=final_state,
    )


@dataclass
class TrainingPhase:
    """A closed phase on its way to the trainer."""

    phase: int  # the phase index, which is also the version that must train it
    batch: Batch | None  # None: every member left before completing an unroll
    collect_s: float  # seconds from the previous close to this one
    # the collect times of the phases closed before it (the last RECENT_PHASES, oldest first): the history its
    # stall verdict is judged against (``session.StallRule``), the one the watchdog judged it by while it collected
    recent_s: tuple[float, ...] = ()


class PhaseStore:
    """Complete unrolls, kept by phase until the phase closes, then queued for the trainer, oldest first.

    Filled on the event loop, drained by the trainer thread. The queue is bounded by
    construction: the gate lets at most ``max_lag + 1`` phases close ahead of training
    (the reference strategies bound nothing). It times the phases with ``clock`` (seconds).
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._completed: dict[int, dict[int, Unroll]] = {}  # phase -> member -> complete unroll
        self._closed: queue.Queue[TrainingPhase | None] = queue.Queue()
        self._clock = clock
        self.last_close = clock()
        # the collect times of the last RECENT_PHASES closed phases, oldest first; replaced whole at each close
        # (which may run on the trainer thread), so that the watchdog always reads a consistent one
        self.recent: tuple[float, ...] = ()

    def add(self, phase: int, unroll: Unroll) -> None:
        self._completed.setdefault(phase, {})[unroll.member] = unroll

    def close(self, closed: Iterable[ClosedPhase]) -> None:
        """Assemble each closed phase's unrolls, in member order, and queue the batch for training."""
        now = self._clock()
        for phase in closed:
            unrolls = self._completed.pop(phase.phase, {})
            batch = assemble(phase.phase, [unrolls[m] for m in phase.members]) if phase.members else None
            collect_s = now - self.last_close
            self._closed.put(TrainingPhase(phase.phase, batch, collect_s, self.recent))
            self.recent = (*self.recent, collect_s)[-RECENT_PHASES:]
            self.last_close = now

    def restart_timer(self) -> None:
        """Collection starts now (the first phase): ``collect_s`` of the first close counts from here."""
        self.last_close = self._clock()

    def collecting_s(self) -> float:
        """Seconds since the last phase closed: how long the oldest open phase has collected."""
        return self._clock() - self.last_close

    def next(self) -> TrainingPhase | None:
        """The oldest closed phase, waiting for one; None once ``stop()`` was called."""
        return self._closed.get()

    def stop(self) -> None:
        self._closed.put(None)

    def discard(self) -> int:
        """Forget everything not yet trained (the run is over); return the transitions discarded."""
        dropped = sum(u.steps_acted * u.obs.shape[1] for unrolls in self._completed.values()
                      for u in unrolls.values())
        self._completed.clear()
        while True:
            try:
                item = self._closed.get_nowait()
            except queue.Empty:
                return dropped
            if item is not None and item.batch is not None:
                dropped += item.batch.size
