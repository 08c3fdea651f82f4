"""Counter-based noise: values in (0, 1), reproducible per (slot, counter), independent of batching."""

from __future__ import annotations

import numpy as np
import pytest

from lockstep.algo.noise import slot_keys, uniform


def _grid(num_slots: int = 500, steps: int = 200, width: int = 2, seed: int = 3) -> np.ndarray:
    """uniform() for every slot at every step, as one flat array of values."""
    keys = np.repeat(slot_keys(seed, 0, num_slots), steps)
    counters = np.tile(np.arange(steps, dtype=np.uint64), num_slots)
    return uniform(keys, counters, width)


def test_uniform_shape_and_dtype():
    out = uniform(slot_keys(0, 0, 5), np.arange(5, dtype=np.uint64), 3)
    assert out.shape == (5, 3)
    assert out.dtype == np.float64


def test_uniform_values_lie_in_the_open_unit_interval():
    values = _grid()
    assert values.min() > 0.0
    assert values.max() < 1.0
    # the log transforms in Gumbel-max and Box-Muller stay finite
    assert np.isfinite(np.log(values)).all() and np.isfinite(np.log(-np.log(values))).all()


def test_uniform_is_in_open_interval_for_extreme_keys_and_counters():
    extremes = np.array([0, 1, 2**63, 2**64 - 1], dtype=np.uint64)
    keys, counters = np.meshgrid(extremes, extremes)
    values = uniform(keys.ravel(), counters.ravel(), 8)
    assert values.min() > 0.0 and values.max() < 1.0


def test_uniform_is_deterministic_for_the_same_keys_and_counters():
    keys = slot_keys(11, 2, 8)
    counters = np.arange(8, dtype=np.uint64) * 5
    first = uniform(keys, counters, 4)
    second = uniform(keys.copy(), counters.copy(), 4)
    np.testing.assert_array_equal(first, second)


def test_uniform_differs_between_counters_of_the_same_slot():
    keys = np.repeat(slot_keys(1, 0, 1), 100)
    values = uniform(keys, np.arange(100, dtype=np.uint64), 2)
    assert len(np.unique(values[:, 0])) == 100
    assert len(np.unique(values[:, 1])) == 100


def test_uniform_differs_between_slots_at_the_same_counter():
    values = uniform(slot_keys(1, 0, 100), np.full(100, 42, np.uint64), 2)
    assert len(np.unique(values[:, 0])) == 100


def test_uniform_columns_of_one_row_differ():
    values = uniform(slot_keys(1, 0, 50), np.zeros(50, np.uint64), 6)
    assert all(len(np.unique(row)) == 6 for row in values)


def test_a_slot_does_not_depend_on_the_other_slots_in_the_call():
    keys = slot_keys(5, 1, 16)
    counters = (np.arange(16, dtype=np.uint64) * 37) % 7
    together = uniform(keys, counters, 3)
    # permuted rows
    perm = np.random.default_rng(0).permutation(16)
    np.testing.assert_array_equal(uniform(keys[perm], counters[perm], 3), together[perm])
    # each slot alone
    for i in range(16):
        np.testing.assert_array_equal(uniform(keys[i:i + 1], counters[i:i + 1], 3), together[i:i + 1])
    # a subset mixed with slots of another actor
    other = slot_keys(5, 2, 4)
    mixed_keys = np.concatenate([other[:2], keys[3:9], other[2:]])
    mixed_counters = np.concatenate([np.full(2, 99, np.uint64), counters[3:9], np.full(2, 99, np.uint64)])
    np.testing.assert_array_equal(uniform(mixed_keys, mixed_counters, 3)[2:8], together[3:9])


def test_uniform_accepts_signed_integer_inputs_like_unsigned():
    keys = slot_keys(0, 0, 4)
    np.testing.assert_array_equal(uniform(keys, np.arange(4, dtype=np.int64), 2),
                                  uniform(keys, np.arange(4, dtype=np.uint64), 2))


def test_slot_keys_are_deterministic_and_distinct():
    np.testing.assert_array_equal(slot_keys(1, 0, 64), slot_keys(1, 0, 64))
    assert slot_keys(1, 0, 64).dtype == np.uint64
    everything = np.concatenate([slot_keys(s, a, 64) for s in (0, 1, 2) for a in (0, 1, 2)])
    assert len(np.unique(everything)) == everything.size


def test_slot_keys_prefix_is_stable_when_num_envs_grows():
    np.testing.assert_array_equal(slot_keys(4, 3, 8)[:5], slot_keys(4, 3, 5))


def test_slot_keys_accept_negative_and_huge_seeds():
    assert not np.array_equal(slot_keys(-1, 0, 4), slot_keys(1, 0, 4))
    np.testing.assert_array_equal(slot_keys(-1, 0, 4), slot_keys(2**64 - 1, 0, 4))


@pytest.mark.parametrize("column", [0, 1])
def test_uniform_is_roughly_uniform(column):
    values = np.sort(_grid()[:, column])  # 100_000 values
    n = values.size
    # mean 1/2 and variance 1/12; the standard error of the mean is ~0.0009
    assert abs(values.mean() - 0.5) < 0.005
    assert abs(values.var() - 1 / 12) < 0.003
    # Kolmogorov-Smirnov distance to U(0, 1); the 1e-6 critical value for n=1e5 is ~0.0061
    ecdf_hi = np.arange(1, n + 1) / n
    ecdf_lo = np.arange(0, n) / n
    ks = max((ecdf_hi - values).max(), (values - ecdf_lo).max())
    assert ks < 0.0065
    # every tenth of the interval gets about a tenth of the values
    counts = np.histogram(values, bins=10, range=(0, 1))[0]
    assert np.all(np.abs(counts / n - 0.1) < 0.005)


def test_consecutive_counters_and_columns_are_uncorrelated():
    steps = 400
    keys = np.repeat(slot_keys(9, 0, 200), steps)
    counters = np.tile(np.arange(steps, dtype=np.uint64), 200)
    values = uniform(keys, counters, 2).reshape(200, steps, 2)
    lag1 = np.corrcoef(values[:, :-1, 0].ravel(), values[:, 1:, 0].ravel())[0, 1]
    cross = np.corrcoef(values[..., 0].ravel(), values[..., 1].ravel())[0, 1]
    neighbours = np.corrcoef(values[:-1, :, 0].ravel(), values[1:, :, 0].ravel())[0, 1]
    # n = 80_000 pairs: the standard error of a correlation is ~0.0035
    assert abs(lag1) < 0.02 and abs(cross) < 0.02 and abs(neighbours) < 0.02


# --- the ends of the interval, reached by inverting the mixer ------------------------------------
_MASK = 2**64 - 1
_GOLDEN_INT = 0x9E3779B97F4A7C15


def _unxorshift(y: int, shift: int) -> int:
    x = y
    for _ in range(64 // shift + 1):
        x = y ^ (x >> shift)
    return x & _MASK


def _unmix(y: int) -> int:
    """Inverse of the SplitMix64 finalizer (xorshift 30, *M1, xorshift 27, *M2, xorshift 31)."""
    y = _unxorshift(y, 31)
    y = (y * pow(0x94D049BB133111EB, -1, 2**64)) & _MASK
    y = _unxorshift(y, 27)
    y = (y * pow(0xBF58476D1CE4E5B9, -1, 2**64)) & _MASK
    return _unxorshift(y, 30)


def _key_whose_first_draw_at_counter_zero_has_bits(bits: int) -> np.ndarray:
    """uniform(key, 0, 1) = f(mix(mix(key ^ mix(0)) + GOLDEN)) and mix(0) = 0, so undo each step."""
    return np.array([_unmix((_unmix(bits) - _GOLDEN_INT) & _MASK)], np.uint64)


def test_inverse_mixer_used_below_is_correct():
    """Guards the helpers: _unmix inverts the mixer, and the built keys reach the two ends of the range."""
    from lockstep.algo.noise import _mix

    for bits in (0, 1, 2**63, _MASK, 0x0123456789ABCDEF):
        assert int(_mix(np.array([_unmix(bits)], np.uint64))[0]) == bits
    low = uniform(_key_whose_first_draw_at_counter_zero_has_bits(0), np.zeros(1, np.uint64), 1)[0, 0]
    high = uniform(_key_whose_first_draw_at_counter_zero_has_bits(_MASK), np.zeros(1, np.uint64), 1)[0, 0]
    assert low < 1e-15 and high > 1 - 1e-15


def test_uniform_smallest_possible_value_is_above_zero():
    key = _key_whose_first_draw_at_counter_zero_has_bits(0)
    value = uniform(key, np.zeros(1, np.uint64), 1)[0, 0]
    assert 0.0 < value < 1e-15


def test_uniform_largest_possible_value_is_below_one():
    key = _key_whose_first_draw_at_counter_zero_has_bits(_MASK)
    value = uniform(key, np.zeros(1, np.uint64), 1)[0, 0]
    assert value < 1.0


def test_the_small_batch_path_gives_the_vectorized_bits():
    """Few numbers are computed on Python integers (numpy's per-call cost dominates there): every bit
    must match the uint64 path, including keys and counters near 2**64 where products wrap."""
    from lockstep.algo import noise

    extreme = np.array([0, 1, 2**63, 2**64 - 1], np.uint64)
    keys = np.concatenate([slot_keys(7, 3, 4), extreme])
    counters = np.concatenate([np.arange(4, dtype=np.uint64) * 977, extreme[::-1]])
    for rows in (1, 2, 8):
        for width in (1, 2, 4):
            k, c = keys[:rows], counters[:rows]
            assert rows * width <= noise._SMALL  # uniform() takes the small path for these
            small = uniform(k, c, width)
            with np.errstate(over="ignore"):
                x = noise._mix(k ^ noise._mix(c * noise._GOLDEN))
                x = noise._mix(x[:, None] + np.arange(1, width + 1, dtype=np.uint64) * noise._GOLDEN)
            vectorized = ((x >> np.uint64(12)).astype(np.float64) + 0.5) * (1.0 / (1 << 52))
            assert small.dtype == np.float64 and small.shape == (rows, width)
            np.testing.assert_array_equal(small, vectorized)
