"""Counter-based random numbers: the noise for slot s at step c depends only on (seed, s, c).

A slot's action therefore does not depend on which other requests share its
forward pass or in which order requests arrive: the same seed gives the same
actions however actors are scheduled. The generator is the SplitMix64 finalizer
applied to a key built from the seed, the slot and the counter, vectorized in numpy.
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def slot_keys(seed: int, actor_id: int, num_envs: int) -> np.ndarray:
    """One 64-bit key per env slot of an actor: [k] uint64."""
    base = _mix(np.array([seed & 0xFFFFFFFFFFFFFFFF], np.uint64))[0]
    actor = _mix(np.array([actor_id], np.uint64) + base)[0]
    return _mix(np.arange(num_envs, dtype=np.uint64) * _GOLDEN + actor)


_SMALL = 32  # at most this many numbers: Python integers beat numpy's per-call overhead
_MASK = (1 << 64) - 1


def uniform(keys: np.ndarray, counters: np.ndarray, width: int) -> np.ndarray:
    """Uniform numbers in (0, 1): [B, width] float64 for slot keys [B] at step counters [B]."""
    if len(keys) * width <= _SMALL:
        return _uniform_small(keys, counters, width)
    with np.errstate(over="ignore"):
        x = _mix(keys.astype(np.uint64) ^ _mix(counters.astype(np.uint64) * _GOLDEN))
        x = _mix(x[:, None] + np.arange(1, width + 1, dtype=np.uint64) * _GOLDEN)
    # 52 bits so that (m + 0.5) / 2**52 is exact in float64: never 0, never 1
    return ((x >> np.uint64(12)).astype(np.float64) + 0.5) * (1.0 / (1 << 52))


def _mix_int(x: int) -> int:
    """``_mix`` on one Python integer (arithmetic modulo 2**64, as numpy's uint64 wraps)."""
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _uniform_small(keys: np.ndarray, counters: np.ndarray, width: int) -> np.ndarray:
    """``uniform`` for a few numbers, computed on Python integers: the same bits (tested)."""
    golden = int(_GOLDEN)
    out = np.empty((len(keys), width), np.float64)
    for row, (key, counter) in enumerate(zip(keys.tolist(), counters.tolist())):
        x = _mix_int(key ^ _mix_int((counter * golden) & _MASK))
        for j in range(width):
            out[row, j] = ((_mix_int((x + (j + 1) * golden) & _MASK) >> 12) + 0.5) * (1.0 / (1 << 52))
    return out
