"""Inference: immutable policy snapshots and the dynamic batcher that serves every actor.

A ``PolicySnapshot`` holds everything that shapes the action distribution of one
policy version (network parameters and observation-normalization statistics).
Nothing mutates it after construction: the trainer builds version k+1 from its
own copy and the learner swaps one reference, so a forward pass can never see
parameters of two versions.

The ``Batcher`` lives on the server's event loop. Requests wait until the
batch holds every request that is expected soon, or ``max_batch`` observations,
or ``max_wait`` has passed; then forward passes of a fixed, slot-ordered shape
answer them all, so a slot's numbers never depend on what shared its pass.
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from lockstep.algo import noise
from lockstep.algo.normalize import ObsNormalizer, as_tensors, copy_moments
from lockstep.models import Policy
from lockstep.models.host import HostStep

_TINY = float(np.finfo(np.float32).tiny)
_BELOW_ONE = float(np.nextafter(np.float32(1), np.float32(0)))


def act(model: Policy, normalize: ObsNormalizer, obs: np.ndarray, uniform: np.ndarray, state: np.ndarray,
        device: torch.device) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The one sampling function: obs [B, *obs], uniform [B, w], state [B, S] (reset where episodes start)
    -> action [B, *act], log-prob [B], value [B], next state [B, S] (S = 0: a feedforward policy).

    Used by snapshots, the in-place backend, evaluation and the baseline alike, so every one samples
    the same action from the same parameters and noise. On a GPU the inputs travel in one copy from
    pinned memory and the outputs in one copy back (``_to_device``, ``_to_host``): the same numbers as
    a copy per array, with one wait for the device instead of one per output.
    """
    staged = device.type == "cuda"
    with torch.inference_mode():
        obs = np.asarray(obs)
        uniform, state = np.asarray(uniform, np.float32), np.asarray(state, np.float32)
        if staged:  # a Dict or Tuple observation's records travel as one array per leaf
            paths = obs.dtype.names
            *moved, u, h = _to_device((*([obs[p] for p in paths] if paths else [obs]), uniform, state), device,
                                      pin=True)
            x = dict(zip(paths, moved)) if paths else moved[0]
        else:
            x, u, h = (as_tensors(obs, device), torch.as_tensor(uniform, device=device),
                       torch.as_tensor(state, device=device))
        action, logprob, value, after = model.step(normalize(x), _noise(u), h)
        if staged:
            return _to_host((action, logprob, value, after), pin=True)
        return action.cpu().numpy(), logprob.cpu().numpy(), value.cpu().numpy(), after.cpu().numpy()


_ALIGN = 8  # every array starts at a multiple of the widest element size, so that its bytes view as its dtype


def _offsets(nbytes: list[int]) -> list[int]:
    """The start of each of arrays of ``nbytes`` bytes in one buffer, each aligned to ``_ALIGN``; and the end."""
    starts = [0]
    for n in nbytes:
        starts.append(starts[-1] + -(-n // _ALIGN) * _ALIGN)
    return starts


def _to_device(arrays: tuple[np.ndarray, ...], device: torch.device, pin: bool) -> list[torch.Tensor]:
    """``arrays`` on ``device``, in one copy: their bytes laid out in one (``pin``: page-locked) host buffer,
    copied without blocking (the caching host allocator keeps the buffer until the copy is done) and viewed
    there as the arrays' dtypes and shapes."""
    arrays = tuple(np.ascontiguousarray(a) for a in arrays)
    offsets = _offsets([a.nbytes for a in arrays])
    host = torch.empty(offsets[-1], dtype=torch.uint8, pin_memory=pin)
    flat = host.numpy()
    for a, start in zip(arrays, offsets):
        flat[start:start + a.nbytes] = a.reshape(-1).view(np.uint8)
    moved = host.to(device, non_blocking=True)
    return [moved[start:start + a.nbytes].view(torch.from_numpy(a[:0]).dtype).reshape(a.shape)
            for a, start in zip(arrays, offsets)]


def _to_host(tensors: tuple[torch.Tensor, ...], pin: bool) -> tuple[np.ndarray, ...]:
    """``tensors`` as host arrays, in one copy: their bytes packed into one device buffer, copied into one
    (``pin``: page-locked) host buffer, and split there after one wait for the copy."""
    tensors = tuple(t.contiguous() for t in tensors)
    nbytes = [t.numel() * t.element_size() for t in tensors]
    offsets = _offsets(nbytes)
    device = tensors[0].device
    packed = torch.zeros(offsets[-1], dtype=torch.uint8, device=device)
    for t, start, n in zip(tensors, offsets, nbytes):
        packed[start:start + n] = t.reshape(-1).view(torch.uint8)
    host = torch.empty(offsets[-1], dtype=torch.uint8, pin_memory=pin)
    host.copy_(packed, non_blocking=True)
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()  # the one wait: the results must have arrived
    flat = host.numpy()
    return tuple(flat[start:start + n].view(torch.empty(0, dtype=t.dtype).numpy().dtype).reshape(t.shape).copy()
                 for t, start, n in zip(tensors, offsets, nbytes))  # copies: the pinned buffer goes back to its cache


def _noise(uniform: torch.Tensor) -> torch.Tensor:
    # float32 rounds uniforms within 2**-25 of 1 up to 1.0, where Gumbel noise is infinite
    return uniform.clamp(_TINY, _BELOW_ONE)


class PolicySnapshot:
    """Version ``version`` of the policy, frozen."""

    def __init__(self, version: int, model: Policy, obs_mean: np.ndarray | dict | None,
                 obs_var: np.ndarray | dict | None, clip_obs: float, device: torch.device,
                 kernel: str = "auto") -> None:
        self.version = version
        self.device = device
        self.model = copy.deepcopy(model).to(device).eval().requires_grad_(False)
        self.normalize = ObsNormalizer(obs_mean, obs_var, clip_obs, device)
        self.obs_mean, self.obs_var = copy_moments(obs_mean), copy_moments(obs_var)
        # the built-in MLP's step in numpy where it computes what torch would (``models.host``); kernel "torch": never
        self.host = HostStep.of(self.model, self.normalize, device) if kernel == "auto" else None

    @property
    def state_size(self) -> int:
        """Recurrent state per env slot (0: a feedforward policy)."""
        return self.model.state_size

    @property
    def noise_width(self) -> int:
        """Uniform numbers a slot's action is sampled from (``algo.noise``)."""
        return self.model.noise_width

    def initial_state(self, slots: int) -> np.ndarray:
        """[slots, S] zeros: the state of slots whose episodes start."""
        return self.model.initial_state(slots)

    def step(self, obs: np.ndarray, uniform: np.ndarray, state: np.ndarray) -> Outputs:
        """obs [B, *obs], uniform [B, w], state [B, S] -> action [B, *act], log-prob [B] float32,
        value [B] float32, next state [B, S]."""
        if self.host is not None and self.host.takes(obs):
            return self.host.step(obs, uniform, state)
        return act(self.model, self.normalize, obs, uniform, state, self.device)


@dataclass
class InferenceResult:
    actions: np.ndarray
    logprobs: np.ndarray
    values: np.ndarray
    version: int
    state: np.ndarray  # [k, S] each slot's state after this step (S = 0: a feedforward policy)
    torn: bool = False  # the forward pass read parameters of two versions (in-place strategies only)
    versions: np.ndarray | None = None  # [k] each slot's version, where they differ (several policies: ``team``)


@dataclass
class _Pending:
    obs: np.ndarray  # [k, *obs]
    keys: np.ndarray  # [k] uint64
    counters: np.ndarray  # [k] uint64
    state: np.ndarray  # [k, S] the slots' state going in
    future: asyncio.Future
    member: int | None = None


class _Layout:
    """Fixed rows for every placed member: members in id order, each member's slots in env order.

    ``obs`` [R, *obs], ``uniform`` [R, w] and ``state`` [R, S] hold the input of every row, R being
    the placed slots (``state`` is empty, S = 0, for a feedforward policy).
    Rows nobody asked for in a flush keep what they last held (finite observations and noise in
    (0, 1)), so the pass over them is valid and its results for them are discarded.
    """

    def __init__(self, placed: dict[int, int], block_rows: int, obs: np.ndarray, width: int, state_size: int) -> None:
        self.rows = dict(sorted(placed.items()))  # member -> slots
        self.offsets: dict[int, int] = {}  # member -> its first row
        total = 0
        for member, rows in self.rows.items():
            self.offsets[member] = total
            total += rows
        self.total = total
        self.block_rows = block_rows
        self.width = width
        self.obs = _aligned_zeros((total, *obs.shape[1:]), obs.dtype)  # [R, *obs], the pass reads it in place
        self.uniform = np.full((total, width), 0.5)  # [R, w] float64, like noise.uniform (the pass converts it)
        self.state = np.zeros((total, state_size), np.float32)  # [R, S]

    def fits(self, p: _Pending, width: int) -> bool:
        """``p`` can use its member's rows: the member is placed with this many slots, same observation layout."""
        return (p.member in self.rows and len(p.obs) == self.rows[p.member] and width == self.width
                and p.obs.shape[1:] == self.obs.shape[1:] and p.obs.dtype == self.obs.dtype)

    def blocks(self, first: int, end: int) -> range:
        """Indices of the blocks that rows [first, end) touch."""
        return range(first // self.block_rows, (end - 1) // self.block_rows + 1)

    def block(self, b: int) -> tuple[int, int]:
        return b * self.block_rows, min(self.total, (b + 1) * self.block_rows)


Outputs = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # actions [n, *act], log-probs [n],
# values [n], next states [n, S]


def _rows(out: Outputs, a: int, z: int) -> Outputs:
    """Rows [a, z) of a forward pass's outputs."""
    actions, logprobs, values, after = out
    return actions[a:z], logprobs[a:z], values[a:z], after[a:z]


def _aligned_zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Zeros in memory from torch's allocator (64-byte aligned), so that each block's input starts at
    the same alignment in every run: a kernel could, in principle, round by alignment (not observed)."""
    try:
        return torch.zeros(shape, dtype=torch.from_numpy(np.zeros(0, dtype)).dtype).numpy()
    except TypeError:  # a dtype torch does not have
        return np.zeros(shape, dtype)


class Batcher:
    """Collect pending requests, run forward passes on the current snapshot, return each request its rows.

    Flush rules: a flush happens when the pending requests number ``expected()`` (every request
    expected soon), when they hold ``max_batch`` observations, or ``max_wait`` after the first.

    Fixed layout (reproducibility). Float results of a row can depend on the shape of the pass
    and on the row's position in it (kernel blocking, remainder rows), though not on the other
    rows' values. So every placed member (``place``: the snapshot backend places each connected
    actor when it joins) owns fixed rows of one buffer of all placed slots, members in id order,
    and the buffer is cut into fixed blocks of at most ``max_batch`` rows. A flush copies the
    pending requests' observations and noise into their rows and runs one pass per block that
    holds a pending row, always over the whole block. Invariant: a slot's action, log-prob and
    value depend only on its observation, its noise, the snapshot and the layout (the set of
    placed members and their slot counts), never on which requests share the flush, their
    order or their rows' contents. The layout changes only when members are placed or removed.

    A request of a member that is not placed, or that does not match its placement (a replaced
    connection's last request, another slot count), is served by a separate pass over the
    concatenation of such requests in arrival order; its numbers may depend on what shares it.
    """

    def __init__(self, snapshot: Callable[[], PolicySnapshot], max_batch: int, max_wait_s: float,
                 expected: Callable[[], int]) -> None:
        self._snapshot = snapshot
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self._expected = expected  # requests that may arrive soon: a batch with this many flushes at once
        self._pending: list[_Pending] = []
        self._pending_rows = 0
        self._timer: asyncio.TimerHandle | None = None
        self._placed: dict[int, int] = {}  # member -> slots
        self._layout: _Layout | None = None  # built at the first flush after the placements changed
        self.forward_passes = 0
        self.rows_inferred = 0  # rows answered (a fixed-layout pass may compute more)
        self.busy_s = 0.0

    def place(self, member: int, rows: int) -> None:
        """Give ``member`` ``rows`` fixed rows (an actor joined); the rows of members after it move."""
        if self._placed.get(member) != rows:
            self._placed[member] = rows
            self._layout = None

    def remove(self, member: int) -> None:
        """Free ``member``'s rows (an actor left)."""
        if self._placed.pop(member, None) is not None:
            self._layout = None

    async def infer(self, obs: np.ndarray, keys: np.ndarray, counters: np.ndarray, state: np.ndarray,
                    member: int | None = None) -> InferenceResult:
        """Actions for one request: obs [k, *obs], keys and counters [k], state [k, S] (the slots' state,
        reset where episodes start); ``member``: whose rows it uses."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append(_Pending(obs, keys, counters, state, future, member))
        self._pending_rows += len(obs)
        if self._pending_rows >= self.max_batch or len(self._pending) >= self._expected():
            self.flush()
        elif self._timer is None:
            self._timer = loop.call_later(self.max_wait_s, self.flush)
        return await future

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending = [p for p in self._pending if not p.future.cancelled()]
        self._pending, self._pending_rows = [], 0
        if not pending:
            return
        start = time.perf_counter()
        snapshot = self._snapshot()
        try:
            width = snapshot.model.noise_width
            placed, loose = self._assign(pending, width, snapshot.state_size)
            answers, passes = self._fixed_passes(snapshot, placed) if placed else ({}, 0)
            if loose:
                answers.update(self._loose_pass(snapshot, loose))
                passes += 1
        except Exception as err:  # a failed forward pass fails its requests, not the server
            for p in pending:
                p.future.set_exception(err)
            return
        finally:
            self.busy_s += time.perf_counter() - start
        self.forward_passes += passes
        self.rows_inferred += sum(len(p.obs) for p in pending)
        for p in pending:
            actions, logprobs, values, state = answers[id(p)]
            p.future.set_result(InferenceResult(actions, logprobs, values, snapshot.version, state))

    def _assign(self, pending: list[_Pending], width: int,
                state_size: int) -> tuple[list[tuple[_Pending, int]], list[_Pending]]:
        """Split ``pending`` into (request, first row) pairs on the fixed layout and the loose rest."""
        layout = self._layout
        placed: list[tuple[_Pending, int]] = []
        loose: list[_Pending] = []
        taken: set[int] = set()
        for p in pending:
            if p.member is None or p.member not in self._placed or p.member in taken:
                loose.append(p)
                continue
            if layout is None or layout.width != width or layout.state.shape[1] != state_size:
                layout = self._layout = _Layout(self._placed, max(1, self.max_batch), p.obs, width, state_size)
            if layout.fits(p, width):
                placed.append((p, layout.offsets[p.member]))
                taken.add(p.member)
            else:
                loose.append(p)
        return placed, loose

    def _fixed_passes(self, snapshot: PolicySnapshot, placed: list[tuple[_Pending, int]]
                      ) -> tuple[dict[int, Outputs], int]:
        """Fill the placed requests' rows, run each block they touch whole, cut out each request's rows."""
        layout = self._layout
        placed.sort(key=lambda e: e[1])  # layout order
        keys = np.concatenate([p.keys for p, _ in placed])
        counters = np.concatenate([p.counters for p, _ in placed])
        uniform = noise.uniform(keys, counters, layout.width)  # [n, w]
        if len(keys) == layout.total:
            # Every row was asked for (the usual strict flush): the requests in layout order are the
            # layout's input, row for row, written in one concatenation.
            obs = np.concatenate([p.obs for p, _ in placed], out=layout.obs)  # [R, *obs]
            state = np.concatenate([p.state for p, _ in placed], out=layout.state)  # [R, S]
            if layout.total <= layout.block_rows:  # one block: each request's rows are a slice of its outputs
                out = snapshot.step(obs, uniform, state)
                return {id(p): _rows(out, first, first + len(p.obs)) for p, first in placed}, 1
            used = range(len(layout.blocks(0, layout.total)))
        else:  # the others' rows keep what they held: valid input whose results nobody takes
            obs, uniform_rows, uniform, state = layout.obs, uniform, layout.uniform, layout.state
            used = set()
            i = 0
            for p, first in placed:
                k = len(p.obs)
                obs[first:first + k] = p.obs
                uniform[first:first + k] = uniform_rows[i:i + k]
                state[first:first + k] = p.state
                used.update(layout.blocks(first, first + k))
                i += k
        outputs: dict[int, tuple[int, Outputs]] = {}  # block -> (its first row, its outputs)
        for b in sorted(used):
            lo, hi = layout.block(b)
            outputs[b] = lo, snapshot.step(obs[lo:hi], uniform[lo:hi], state[lo:hi])  # always the whole block
        answers: dict[int, Outputs] = {}
        for p, first in placed:
            end = first + len(p.obs)
            cut = []  # the request's rows of each block it spans (one block unless the layout exceeds max_batch)
            for b in layout.blocks(first, end):
                lo, out = outputs[b]
                a, z = max(first, lo) - lo, end - lo
                cut.append(_rows(out, a, z))
            answers[id(p)] = cut[0] if len(cut) == 1 else tuple(np.concatenate(c) for c in zip(*cut))
        return answers, len(used)

    @staticmethod
    def _loose_pass(snapshot: PolicySnapshot, loose: list[_Pending]) -> dict[int, Outputs]:
        """One pass over the concatenated requests, in arrival order (shape-dependent numbers)."""
        obs = np.concatenate([p.obs for p in loose])  # also makes message bytes writable for torch
        keys = np.concatenate([p.keys for p in loose])
        counters = np.concatenate([p.counters for p in loose])
        state = np.concatenate([p.state for p in loose])
        out = snapshot.step(obs, noise.uniform(keys, counters, snapshot.model.noise_width), state)
        answers: dict[int, Outputs] = {}
        offset = 0
        for p in loose:
            n = len(p.obs)
            answers[id(p)] = _rows(out, offset, offset + n)
            offset += n
        return answers
