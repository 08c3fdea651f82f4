"""``assemble``: unrolls laid side by side in member order, with every per-slot field mapped to its batch slot.

Observations are one number each, ``100 * member + 10 * t + slot``, so every value in
the expected arrays below says where it came from.
"""

from __future__ import annotations

import numpy as np
import pytest

from lockstep.learner.rollout import IncompleteUnrollError, Unroll, assemble


def unroll(member: int, num_envs: int, steps: int = 3, acted: int | None = None, finals=(),
           terminated=(), finish: bool = True) -> Unroll:
    """An unroll of ``acted`` (default: all) steps; ``finals``: (t, env indices) truncated at step t;
    ``terminated``: (t, env index) pairs. Behaviour values are ``member + t / 10``, rewards ``t + slot / 10``."""
    u = Unroll(member, num_envs, steps, (1,), np.dtype(np.float32), (), np.dtype(np.int64))
    slots = np.arange(num_envs)
    finals = dict(finals)
    for t in range(steps if acted is None else acted):
        u.record_action(t, (100 * member + 10 * t + slots)[:, None], slots % 2, np.full(num_envs, -0.5),
                        np.full(num_envs, member + t / 10), version=7)
        idx = np.array(finals.get(t, []), np.int64)
        term = np.isin(slots, [j for s, j in terminated if s == t])
        u.record_outcome(t, t + slots / 10, term, np.isin(slots, idx), idx,
                         (-(100 * member + 10 * t + idx) - 1)[:, None])
    if finish:
        u.finish((100 * member + 90 + slots)[:, None])
    return u


def test_members_are_laid_out_in_id_order_whatever_the_input_order():
    batch = assemble(7, [unroll(2, 1), unroll(0, 2), unroll(1, 3)])
    assert batch.version == 7
    assert batch.members == (0, 1, 2)
    assert batch.slots_per_member == (2, 3, 1)
    assert batch.obs.shape == (3, 6, 1)
    np.testing.assert_array_equal(batch.obs[:, :, 0], [
        [0, 1, 100, 101, 102, 200],
        [10, 11, 110, 111, 112, 210],
        [20, 21, 120, 121, 122, 220],
    ])
    np.testing.assert_array_equal(batch.bootstrap_obs[:, 0], [90, 91, 190, 191, 192, 290])
    np.testing.assert_array_equal(batch.actions[0], [0, 1, 0, 1, 0, 0])
    np.testing.assert_allclose(batch.values[:, 0], [0.0, 0.1, 0.2])
    np.testing.assert_allclose(batch.values[1], [0.1, 0.1, 1.1, 1.1, 1.1, 2.1])
    np.testing.assert_allclose(batch.rewards[2], [2.0, 2.1, 2.0, 2.1, 2.2, 2.0])
    np.testing.assert_array_equal(batch.versions, np.full((3, 6), 7))


def test_same_unrolls_in_any_order_give_the_same_batch():
    a = assemble(0, [unroll(0, 2, finals=[(1, [1])]), unroll(3, 1), unroll(5, 2, finals=[(0, [0])])])
    b = assemble(0, [unroll(5, 2, finals=[(0, [0])]), unroll(0, 2, finals=[(1, [1])]), unroll(3, 1)])
    for name in ("obs", "actions", "values", "rewards", "bootstrap_obs", "lengths", "final_t", "final_n", "final_obs"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def test_terminations_and_truncations_land_in_their_batch_slots():
    batch = assemble(0, [unroll(1, 3, terminated=[(2, 1)], finals=[(0, [2])]), unroll(0, 2, terminated=[(1, 0)])])
    # member 0 owns slots 0-1, member 1 slots 2-4: member 1's env 1 is slot 3, its env 2 slot 4
    np.testing.assert_array_equal(batch.terminated, [
        [False, False, False, False, False],
        [True, False, False, False, False],
        [False, False, False, True, False],
    ])
    np.testing.assert_array_equal(batch.truncated, [
        [False, False, False, False, True],
        [False, False, False, False, False],
        [False, False, False, False, False],
    ])


def test_final_observations_of_truncated_episodes_map_to_their_step_and_batch_slot():
    batch = assemble(0, [
        unroll(1, 3, finals=[(1, [0, 2])]),  # slots 2..4 in the batch
        unroll(0, 2, finals=[(0, [1]), (2, [0, 1])]),  # slots 0..1
    ])
    # member 0 first (its truncations in step order), then member 1's, shifted by member 0's 2 slots
    np.testing.assert_array_equal(batch.final_t, [0, 2, 2, 1, 1])
    np.testing.assert_array_equal(batch.final_n, [1, 0, 1, 2, 4])
    np.testing.assert_array_equal(batch.final_obs[:, 0], [-2, -21, -22, -111, -113])
    assert batch.final_t.dtype == batch.final_n.dtype == np.int64
    # every final observation is reported exactly where the batch says a truncation happened
    assert batch.truncated[batch.final_t, batch.final_n].all()
    assert batch.truncated.sum() == len(batch.final_t)


def test_no_truncation_gives_empty_final_arrays_of_the_observation_shape():
    batch = assemble(0, [unroll(0, 2), unroll(1, 1)])
    assert batch.final_t.shape == batch.final_n.shape == (0,)
    assert batch.final_obs.shape == (0, 1)
    assert batch.final_obs.dtype == np.float32


def test_unroll_cut_short_has_its_own_length_and_its_padding_is_not_valid():
    """Member 1 acted 2 of T=4 steps when the phase cut-off closed the phase."""
    batch = assemble(0, [unroll(1, 1, steps=4, acted=2, finals=[(1, [0])]), unroll(0, 2, steps=4)])
    np.testing.assert_array_equal(batch.lengths, [4, 4, 2])
    np.testing.assert_array_equal(batch.valid, [
        [True, True, True],
        [True, True, True],
        [True, True, False],
        [True, True, False],
    ])
    assert batch.size == 10
    assert batch.num_steps == 4 and batch.num_slots == 3
    np.testing.assert_array_equal(batch.obs[:, 2, 0], [100, 110, 0, 0])  # zeros past the cut
    np.testing.assert_array_equal(batch.versions[:, 2], [7, 7, -1, -1])  # never stamped past the cut
    np.testing.assert_array_equal(batch.bootstrap_obs[:, 0], [90, 91, 190])  # after the slot's own last step
    np.testing.assert_array_equal(batch.final_t, [1])
    np.testing.assert_array_equal(batch.final_n, [2])
    np.testing.assert_array_equal(batch.final_obs[:, 0], [-111])


def test_unroll_missing_an_outcome_is_incomplete():
    u = unroll(3, 2, acted=2)
    u.record_action(2, np.zeros((2, 1)), np.zeros(2), np.zeros(2), np.zeros(2), 7)  # acted, no outcome yet
    with pytest.raises(IncompleteUnrollError, match="member 3 has 2 of 3 steps completed"):
        assemble(0, [unroll(0, 1), u])


def test_unroll_missing_its_bootstrap_observation_is_incomplete():
    with pytest.raises(IncompleteUnrollError, match="member 4"):
        assemble(0, [unroll(0, 1), unroll(4, 2, finish=False)])


def test_unroll_that_never_acted_is_incomplete():
    u = Unroll(2, 1, 3, (1,), np.dtype(np.float32), (), np.dtype(np.int64))
    u.finish(np.zeros((1, 1)))
    with pytest.raises(IncompleteUnrollError, match="member 2 has 0 of 0"):
        assemble(0, [u])


def test_no_unrolls_is_an_error():
    with pytest.raises(ValueError, match="no unrolls"):
        assemble(0, [])
