"""Single-threaded scenarios for the admission gate: small scripts with exact expectations.

Strict mode (``max_lag=0``), pipelined mode (``max_lag >= 1``) and ``max_lag=None``;
the release callbacks come from the ``releases`` fixture (``conftest.py``).
"""

from __future__ import annotations

import pytest

from lockstep.sync import Admission, AdmissionGate, ClosedPhase, GateError, RequestResult

# ---------------------------------------------------------------------------------
# Single-threaded scenarios
# ---------------------------------------------------------------------------------


def test_late_joiner_is_held_until_the_next_publish_then_admitted_as_step_0(releases):
    gate = AdmissionGate(steps_per_phase=2)
    gate.join("a")
    assert releases.admit(gate, "a") == Admission(0, 0, 0)

    gate.join("b")  # phase 0 is under way
    assert gate.request("b", releases.for_("b")) == RequestResult(None)
    assert releases.admit(gate, "a") == Admission(0, 1, 0)
    assert gate.waiting_for() == ["a"]
    result = gate.request("a", releases.for_("a"))
    assert result == RequestResult(None, completed=0, closed=(ClosedPhase(0, ("a",)),))
    assert result.closed[0].version == 0
    assert releases.take() == []  # b waits for the publish, not for the close

    gate.join("c")  # between close and publish: phase 1 has not started, c joins it
    assert gate.request("c", releases.for_("c")) == RequestResult(None)
    assert releases.take() == []
    assert gate.published == 0

    gate.publish(1)
    assert gate.published == 1
    assert releases.take() == [("a", Admission(1, 0, 1)), ("b", Admission(1, 0, 1)), ("c", Admission(1, 0, 1))]
    for m in "abc":
        assert releases.admit(gate, m) == Admission(1, 1, 1)
    assert gate.held_count() == 0


def test_late_joiner_that_does_not_request_before_the_publish_starts_the_new_phase_at_step_0(releases):
    gate = AdmissionGate(steps_per_phase=1)
    gate.join("a")
    releases.admit(gate, "a")
    gate.join("b")
    assert releases.finish(gate, "a").closed == (ClosedPhase(0, ("a",)),)
    gate.publish(1)
    assert releases.take() == [("a", Admission(1, 0, 1))]
    assert releases.admit(gate, "b") == Admission(1, 0, 1)
    assert releases.finish(gate, "b").closed == ()  # a (released as step 0) has not reported yet
    assert gate.waiting_for() == ["a"]


def test_joiner_enters_a_started_phase_at_once_while_nobody_has_stepped_in_it(releases):
    gate = AdmissionGate(steps_per_phase=2, min_members=2)
    gate.join(1)
    gate.join(2)
    assert gate.started
    gate.join(3)  # phase 0 started but no step admitted yet: 3 joins it
    assert gate.waiting_for() == [1, 2, 3]
    assert releases.admit(gate, 3) == Admission(0, 0, 0)
    gate.join(4)  # now phase 0 is under way: 4 waits for phase 1
    assert gate.request(4, releases.for_(4)) == RequestResult(None)
    assert gate.waiting_for() == [1, 2, 3]
    for m in (1, 2):
        releases.finish(gate, m)
    assert releases.finish(gate, 3).closed == (ClosedPhase(0, (1, 2, 3)),)
    gate.publish(1)
    assert releases.take() == [(m, Admission(1, 0, 1)) for m in (1, 2, 3, 4)]


def test_nothing_is_admitted_before_min_members_join_and_the_first_phase_is_0(releases):
    gate = AdmissionGate(steps_per_phase=3, min_members=3)
    gate.join(1)
    assert gate.request(1, releases.for_(1)) == RequestResult(None)
    gate.join(2)
    assert gate.request(2, releases.for_(2)) == RequestResult(None)
    assert not gate.started and gate.published == 0 and gate.held_count() == 2 and releases.take() == []

    assert gate.leave(2) == (0, ())  # leaving before the start discards the held request and does not count
    gate.join(4)
    assert not gate.started and gate.held_count() == 1 and releases.take() == []
    with pytest.raises(GateError):
        gate.publish(1)  # no phase has closed

    gate.join(3)
    assert gate.started and gate.published == 0
    assert releases.take() == [(1, Admission(0, 0, 0))]  # the early member's held request, as step 0
    assert releases.admit(gate, 3) == Admission(0, 0, 0)
    assert releases.admit(gate, 4) == Admission(0, 0, 0)
    assert releases.admit(gate, 1) == Admission(0, 1, 0)
    assert gate.waiting_for() == [1, 3, 4]
    assert releases.take() == []


def test_phase_whose_members_all_left_admits_a_new_joiner_at_once_with_the_same_version(releases):
    gate = AdmissionGate(steps_per_phase=3, min_members=2)
    gate.join("a")
    gate.join("b")
    releases.admit(gate, "a")
    releases.admit(gate, "a")
    releases.admit(gate, "b")
    assert gate.leave("a") == (2, ())
    # The last collecting member leaves; nobody waits beyond the phase: it stays open.
    assert gate.leave("b") == (1, ())
    assert gate.waiting_for() == [] and gate.published == 0
    with pytest.raises(GateError):
        gate.publish(1)

    gate.join("c")  # the emptied phase takes a new member at once, with the same version
    assert gate.waiting_for() == ["c"]
    assert gate.request("c", releases.for_("c")) == RequestResult(Admission(0, 0, 0))
    assert releases.admit(gate, "c") == Admission(0, 1, 0)
    assert releases.admit(gate, "c") == Admission(0, 2, 0)
    result = gate.request("c", releases.for_("c"))
    assert result == RequestResult(None, completed=0, closed=(ClosedPhase(0, ("c",)),))
    gate.publish(1)
    assert releases.take() == [("c", Admission(1, 0, 1))]


def test_phase_whose_collecting_members_all_left_closes_empty_when_a_joiner_waits_beyond_it(releases):
    gate = AdmissionGate(steps_per_phase=3, min_members=2)
    gate.join("a")
    gate.join("b")
    releases.admit(gate, "a")
    releases.admit(gate, "a")
    releases.admit(gate, "b")
    gate.join("c")  # late joiner: phase 0 is under way, c's first phase is 1
    assert gate.request("c", releases.for_("c")) == RequestResult(None)

    assert gate.leave("a") == (2, ())
    assert releases.take() == []
    # The last collecting member leaves while c waits beyond the phase: it closes with no unrolls.
    dropped, closed = gate.leave("b")
    assert (dropped, closed) == (1, (ClosedPhase(0, ()),))
    assert closed[0].version == 0
    assert releases.take() == []  # c is not let into the emptied phase ...
    assert gate.published == 0 and gate.held_count() == 1
    gate.publish(1)  # ... the trainer publishes the next version unchanged, which releases c
    assert releases.take() == [("c", Admission(1, 0, 1))]

    # c carries on alone, then leaves mid-unroll; nobody waits beyond phase 1: it stays open.
    assert releases.admit(gate, "c") == Admission(1, 1, 1)
    assert gate.leave("c") == (2, ())
    gate.join("d")
    assert gate.waiting_for() == ["d"]
    assert gate.request("d", releases.for_("d")) == RequestResult(Admission(1, 0, 1))
    assert releases.admit(gate, "d") == Admission(1, 1, 1)
    assert releases.admit(gate, "d") == Admission(1, 2, 1)
    result = gate.request("d", releases.for_("d"))
    assert result == RequestResult(None, completed=1, closed=(ClosedPhase(1, ("d",)),))
    gate.publish(2)
    assert releases.take() == [("d", Admission(2, 0, 2))]


def test_empty_close_happens_when_the_waiter_requests_after_the_others_left(releases):
    # The late joiner has joined (so it waits beyond phase 0) but not requested yet.
    gate = AdmissionGate(steps_per_phase=2, min_members=1)
    gate.join("a")
    releases.admit(gate, "a")
    gate.join("b")
    assert gate.leave("a") == (1, (ClosedPhase(0, ()),))
    assert gate.request("b", releases.for_("b")) == RequestResult(None)
    gate.publish(1)
    assert releases.take() == [("b", Admission(1, 0, 1))]
    # A late joiner that leaves again before the others does not make the phase close.
    gate.join("c")  # phase 1 is under way (b stepped): c's first phase is 2
    assert gate.leave("c") == (0, ())
    assert gate.leave("b") == (1, ())  # nobody waits beyond phase 1 any more: it stays open
    gate.join("d")
    assert releases.admit(gate, "d") == Admission(1, 0, 1)


def test_phase_emptied_before_anyone_acted_takes_the_next_joiner_at_once(releases):
    gate = AdmissionGate(steps_per_phase=2, min_members=2)
    gate.join(1)
    gate.join(2)
    assert gate.leave(1) == (0, ())
    assert gate.leave(2) == (0, ())
    gate.join(3)  # the empty phase 0 takes it at once
    assert gate.request(3, releases.for_(3)) == RequestResult(Admission(0, 0, 0))
    gate.join(4)  # phase 0 is under way again: 4 waits for phase 1
    assert gate.request(4, releases.for_(4)) == RequestResult(None)
    assert releases.finish(gate, 3).closed == (ClosedPhase(0, (3,)),)
    assert releases.take() == []
    gate.publish(1)
    assert releases.take() == [(3, Admission(1, 0, 1)), (4, Admission(1, 0, 1))]


def test_phase_closes_when_the_last_collecting_member_leaves(releases):
    gate = AdmissionGate(steps_per_phase=2, min_members=3)
    for m in (1, 2, 3):
        gate.join(m)
    assert releases.finish(gate, 1).closed == ()
    assert releases.finish(gate, 2).closed == ()
    releases.admit(gate, 3)
    dropped, closed = gate.leave(3)
    assert (dropped, closed) == (1, (ClosedPhase(0, (1, 2)),))
    assert gate.waiting_for() == [1, 2]  # the members of phase 1, which waits for the publish
    assert releases.take() == []
    gate.publish(1)
    assert releases.take() == [(1, Admission(1, 0, 1)), (2, Admission(1, 0, 1))]


def test_member_leaving_a_closed_phase_keeps_its_unroll_and_drops_nothing(releases):
    gate = AdmissionGate(steps_per_phase=2, min_members=2)
    gate.join(1)
    gate.join(2)
    releases.finish(gate, 1)
    assert releases.finish(gate, 2).closed == (ClosedPhase(0, (1, 2)),)
    assert gate.leave(1) == (0, ())  # its held request is discarded ...
    gate.publish(1)
    assert releases.take() == [(2, Admission(1, 0, 1))]  # ... and never released
    assert gate.held_count() == 0


def test_full_member_leaving_an_open_phase_keeps_its_unroll_in_the_phase(releases):
    gate = AdmissionGate(steps_per_phase=3, min_members=2)
    gate.join(1)
    gate.join(2)
    releases.admit(gate, 2)
    assert releases.finish(gate, 1).closed == ()  # 1's unroll is complete, 2 still collecting
    assert gate.leave(1) == (0, ())  # nothing dropped, its held request discarded
    assert gate.held_count() == 0 and gate.waiting_for() == [2]
    releases.admit(gate, 2)
    releases.admit(gate, 2)
    assert releases.finish(gate, 2).closed == (ClosedPhase(0, (1, 2)),)  # 1's complete unroll is trained
    gate.publish(1)
    assert releases.take() == [(2, Admission(1, 0, 1))]  # the discarded request is never released
    assert gate.waiting_for() == [2]  # and 1 is not in phase 1


def test_full_member_leaving_when_the_others_have_left_closes_the_phase_with_it(releases):
    gate = AdmissionGate(steps_per_phase=2, min_members=2)
    gate.join(1)
    gate.join(2)
    releases.finish(gate, 1)
    releases.admit(gate, 2)
    assert gate.leave(1) == (0, ())
    assert gate.leave(2) == (1, (ClosedPhase(0, (1,)),))
    gate.join(3)  # the closed phase takes nobody; 3 waits for the publish
    assert gate.request(3, releases.for_(3)) == RequestResult(None)
    gate.publish(1)
    assert releases.take() == [(3, Admission(1, 0, 1))]


def test_full_member_that_leaves_and_rejoins_the_same_phase_waits_for_the_next(releases):
    gate = AdmissionGate(steps_per_phase=2, min_members=2)
    gate.join(1)
    gate.join(2)
    releases.finish(gate, 1)
    releases.admit(gate, 2)
    gate.leave(1)
    gate.join(1)
    assert gate.request(1, releases.for_(1)) == RequestResult(None)  # held: its unroll of phase 0 is complete
    assert gate.waiting_for() == [2]
    assert releases.finish(gate, 2).closed == (ClosedPhase(0, (1, 2)),)
    assert releases.take() == []
    gate.publish(1)
    assert releases.take() == [(1, Admission(1, 0, 1)), (2, Admission(1, 0, 1))]


def test_collecting_member_that_leaves_and_rejoins_a_phase_under_way_waits_for_the_next_phase(releases):
    gate = AdmissionGate(steps_per_phase=2, min_members=2)
    gate.join(1)
    gate.join(2)
    releases.admit(gate, 2)  # phase 0 is under way
    releases.admit(gate, 1)
    assert gate.leave(1) == (1, ())
    gate.join(1)
    assert gate.request(1, releases.for_(1)) == RequestResult(None)
    assert gate.waiting_for() == [2]
    assert releases.finish(gate, 2).closed == (ClosedPhase(0, (2,)),)  # the dropped unroll is not in it
    gate.publish(1)
    assert releases.take() == [(1, Admission(1, 0, 1)), (2, Admission(1, 0, 1))]


def test_collecting_member_that_leaves_and_rejoins_before_anyone_else_stepped_restarts_the_phase(releases):
    # Only the steps of current members put a phase under way: the dropped unroll does not.
    gate = AdmissionGate(steps_per_phase=2, min_members=2)
    gate.join(1)
    gate.join(2)
    releases.admit(gate, 1)
    assert gate.leave(1) == (1, ())
    gate.join(1)
    assert releases.admit(gate, 1) == Admission(0, 0, 0)  # a fresh unroll of phase 0, from step 0
    assert releases.admit(gate, 1) == Admission(0, 1, 0)
    assert releases.finish(gate, 1).closed == ()
    assert releases.finish(gate, 2).closed == (ClosedPhase(0, (1, 2)),)


# ---------------------------------------------------------------------------------
# Pipelined scenarios (max_lag >= 1, and None)
# ---------------------------------------------------------------------------------


def test_pipelined_member_runs_ahead_by_max_lag_then_waits_for_the_publish(releases):
    gate = AdmissionGate(steps_per_phase=2, min_members=1, max_lag=1)
    gate.join("a")
    assert releases.admit(gate, "a") == Admission(0, 0, 0)
    assert releases.admit(gate, "a") == Admission(0, 1, 0)
    # The completing request closes phase 0 and is admitted at once to phase 1 (lag 1).
    assert gate.request("a", releases.for_("a")) == RequestResult(
        Admission(0, 0, 1), completed=0, closed=(ClosedPhase(0, ("a",)),))
    assert releases.admit(gate, "a") == Admission(0, 1, 1)
    # Phase 2 would need version >= 1: held.
    assert gate.request("a", releases.for_("a")) == RequestResult(None, completed=1, closed=(ClosedPhase(1, ("a",)),))
    assert releases.take() == []
    gate.publish(1)
    assert releases.take() == [("a", Admission(1, 0, 2))]
    gate.publish(2)  # phase 1 is closed: allowed; nothing held
    assert releases.take() == [] and gate.published == 2
    assert releases.admit(gate, "a") == Admission(2, 1, 2)  # the version may change within an unroll
    assert gate.request("a", releases.for_("a")) == RequestResult(
        Admission(2, 0, 3), completed=2, closed=(ClosedPhase(2, ("a",)),))
    with pytest.raises(GateError):
        gate.publish(4)  # versions are published one by one
    gate.publish(3)  # phase 2 is closed
    with pytest.raises(GateError):
        gate.publish(4)  # phase 3 is collecting
    assert releases.take() == []


def test_pipelined_phases_close_in_order_and_a_leave_can_close_several(releases):
    gate = AdmissionGate(steps_per_phase=1, min_members=2, max_lag=2)
    gate.join("a")
    gate.join("b")
    assert releases.admit(gate, "a") == Admission(0, 0, 0)
    assert gate.request("a", releases.for_("a")) == RequestResult(Admission(0, 0, 1), completed=0)
    assert gate.request("a", releases.for_("a")) == RequestResult(Admission(0, 0, 2), completed=1)
    assert gate.request("a", releases.for_("a")) == RequestResult(None, completed=2)  # phase 3 needs version 1
    assert gate.waiting_for() == ["b"]
    with pytest.raises(GateError):
        gate.publish(1)  # phase 0 is still collecting
    assert releases.admit(gate, "b") == Admission(0, 0, 0)
    # b completes phase 0: only phase 0 closes; b now collects in phase 1, which holds a's unroll.
    result = gate.request("b", releases.for_("b"))
    assert result == RequestResult(Admission(0, 0, 1), completed=0, closed=(ClosedPhase(0, ("a", "b")),))
    assert gate.waiting_for() == ["b"]
    # b leaves mid phase 1: phases 1 and 2 (a's unrolls only) close together, oldest first.
    assert gate.leave("b") == (1, (ClosedPhase(1, ("a",)), ClosedPhase(2, ("a",))))
    gate.publish(1)
    assert releases.take() == [("a", Admission(1, 0, 3))]
    gate.publish(2)
    gate.publish(3)
    with pytest.raises(GateError):
        gate.publish(4)  # phase 3 is collecting
    assert gate.published == 3


def test_pipelined_late_joiner_starts_without_a_publish_and_an_emptied_phase_closes_empty(releases):
    gate = AdmissionGate(steps_per_phase=2, min_members=1, max_lag=1)
    gate.join("a")
    releases.admit(gate, "a")
    gate.join("b")  # phase 0 under way: b's first phase is 1, admissible with version 0
    assert releases.admit(gate, "b") == Admission(0, 0, 1)
    assert gate.waiting_for() == ["a"]
    # a leaves mid phase 0 while b collects beyond it: phase 0 closes empty.
    assert gate.leave("a") == (1, (ClosedPhase(0, ()),))
    assert gate.waiting_for() == ["b"]
    assert releases.admit(gate, "b") == Admission(0, 1, 1)
    assert gate.request("b", releases.for_("b")) == RequestResult(None, completed=1, closed=(ClosedPhase(1, ("b",)),))
    gate.publish(1)  # phase 0 trained as a no-op
    assert releases.take() == [("b", Admission(1, 0, 2))]
    gate.publish(2)
    assert releases.admit(gate, "b") == Admission(2, 1, 2)


def test_pipelined_lag_bound_holds_a_fast_member_while_a_slow_one_collects(releases):
    gate = AdmissionGate(steps_per_phase=1, min_members=2, max_lag=1)
    gate.join("fast")
    gate.join("slow")
    assert releases.admit(gate, "fast") == Admission(0, 0, 0)
    assert gate.request("fast", releases.for_("fast")) == RequestResult(Admission(0, 0, 1), completed=0)
    assert gate.request("fast", releases.for_("fast")) == RequestResult(None, completed=1)
    assert gate.held_count() == 1
    assert releases.admit(gate, "slow") == Admission(0, 0, 0)
    assert gate.request("slow", releases.for_("slow")) == RequestResult(
        Admission(0, 0, 1), completed=0, closed=(ClosedPhase(0, ("fast", "slow")),))
    assert releases.take() == []  # closing phase 0 is not enough: phase 2 needs version 1
    gate.publish(1)
    assert releases.take() == [("fast", Admission(1, 0, 2))]
    assert gate.request("slow", releases.for_("slow")) == RequestResult(
        Admission(1, 0, 2), completed=1, closed=(ClosedPhase(1, ("fast", "slow")),))


def test_unbounded_lag_never_holds_but_phases_still_close_in_order_and_publish_follows_them(releases):
    gate = AdmissionGate(steps_per_phase=2, min_members=1, max_lag=None)
    gate.join("a")
    for u in range(5):  # a runs five phases ahead with version 0
        if u == 0:
            assert releases.admit(gate, "a") == Admission(0, 0, 0)
        else:
            assert gate.request("a", releases.for_("a")) == RequestResult(
                Admission(0, 0, u), completed=u - 1, closed=(ClosedPhase(u - 1, ("a",)),))
        assert releases.admit(gate, "a") == Admission(0, 1, u)
    assert gate.held_count() == 0 and gate.waiting_for() == ["a"]
    for v in range(1, 5):
        gate.publish(v)
    with pytest.raises(GateError):
        gate.publish(5)  # phase 4 is collecting
    assert releases.take() == []
    assert gate.request("a", releases.for_("a")) == RequestResult(
        Admission(4, 0, 5), completed=4, closed=(ClosedPhase(4, ("a",)),))


def test_max_lag_and_steps_per_phase_are_validated():
    with pytest.raises(ValueError):
        AdmissionGate(steps_per_phase=0)
    with pytest.raises(ValueError):
        AdmissionGate(steps_per_phase=2, max_lag=-1)
    assert AdmissionGate(steps_per_phase=2).max_lag == 0  # strict is the default
    assert AdmissionGate(steps_per_phase=2, max_lag=None).max_lag is None


# Complete unrolls left behind by a member that has left, in a phase beyond every current
# member's phase (pipelined only: in strict mode nobody completes phase u+1 while u is open).


def test_joiner_is_not_put_into_a_phase_that_already_holds_a_complete_unroll(releases):
    gate = AdmissionGate(steps_per_phase=2, min_members=1, max_lag=1)
    gate.join("A")
    releases.admit(gate, "A")  # phase 0 under way
    gate.join("B")  # first phase 1
    assert releases.admit(gate, "B") == Admission(0, 0, 1)
    assert releases.admit(gate, "B") == Admission(0, 1, 1)
    assert gate.request("B", releases.for_("B")) == RequestResult(None, completed=1)  # phase 1 is under way
    assert gate.leave("B") == (0, ())  # B keeps its complete unroll of phase 1
    gate.join("C")
    # Phase 1 holds a complete unroll: C must start in phase 2 (as it does when B stays), which
    # version 0 may not collect. The gate puts C into phase 1 and admits it at once.
    assert gate.request("C", releases.for_("C")) == RequestResult(None)


def test_member_that_rejoins_does_not_collect_a_phase_it_already_completed(releases):
    gate = AdmissionGate(steps_per_phase=1, min_members=1, max_lag=1)
    gate.join("A")
    releases.admit(gate, "A")
    gate.join("B")
    assert releases.admit(gate, "B") == Admission(0, 0, 1)
    assert gate.request("B", releases.for_("B")) == RequestResult(None, completed=1)
    gate.leave("B")
    gate.join("B")
    # The gate admits B to phase 1 again: B would be admitted 2T times in phase 1 and complete it
    # twice (the learner keeps one unroll per member and phase: the first is silently overwritten).
    assert gate.request("B", releases.for_("B")) == RequestResult(None)


def test_complete_unroll_of_a_member_that_left_is_not_stranded_when_the_phase_before_empties(releases):
    gate = AdmissionGate(steps_per_phase=1, min_members=1, max_lag=1)
    gate.join("A")
    releases.admit(gate, "A")
    gate.join("B")
    assert releases.admit(gate, "B") == Admission(0, 0, 1)
    assert gate.request("B", releases.for_("B")) == RequestResult(None, completed=1)
    assert gate.leave("B") == (0, ())
    # Nobody collects in phase 0 any more and B's complete unroll waits beyond it: phase 0 should
    # close empty and phase 1 with B's unroll. The gate closes nothing (phase 1 has no collector
    # and a complete unroll, yet stays open until some new member completes phase 0).
    assert gate.leave("A") == (1, (ClosedPhase(0, ()), ClosedPhase(1, ("B",))))


# ---------------------------------------------------------------------------------
# 6: protocol errors
# ---------------------------------------------------------------------------------


def test_request_before_join_raises():
    gate = AdmissionGate(steps_per_phase=2)
    with pytest.raises(GateError):
        gate.request(1, lambda a: None)
    gate.join(1)
    gate.leave(1)
    with pytest.raises(GateError):
        gate.request(1, lambda a: None)  # after leaving, too


def test_double_join_raises_and_leaving_a_non_member_raises():
    gate = AdmissionGate(steps_per_phase=2)
    gate.join(1)
    with pytest.raises(GateError):
        gate.join(1)
    with pytest.raises(GateError):
        gate.leave(2)
    assert gate.waiting_for() == [1]


@pytest.mark.parametrize("max_lag", [0, 1])
def test_second_held_request_for_one_member_raises_and_keeps_the_first(max_lag, releases):
    gate = AdmissionGate(steps_per_phase=1, max_lag=max_lag)
    gate.join(1)
    assert releases.admit(gate, 1) == Admission(0, 0, 0)
    for u in range(1, max_lag + 1):  # pipelined: runs ahead until the lag bound holds it
        assert gate.request(1, releases.for_(1)).admission == Admission(0, 0, u)
    assert gate.request(1, releases.for_("first")).admission is None  # held by the lag bound
    with pytest.raises(GateError):
        gate.request(1, releases.for_("second"))
    # Also for a request held while waiting for the first phase.
    gate2 = AdmissionGate(steps_per_phase=1, min_members=2, max_lag=max_lag)
    gate2.join(1)
    assert gate2.request(1, releases.for_("early")).admission is None
    with pytest.raises(GateError):
        gate2.request(1, releases.for_("early-2"))
    gate.publish(1)
    gate2.join(2)
    assert releases.take() == [("early", Admission(0, 0, 0)), ("first", Admission(1, 0, max_lag + 1))]


def test_publish_without_a_closed_phase_raises(releases):
    gate = AdmissionGate(steps_per_phase=2, min_members=2)
    with pytest.raises(GateError):
        gate.publish(1)  # no phase at all
    gate.join(1)
    with pytest.raises(GateError):
        gate.publish(1)  # still no phase
    gate.join(2)
    releases.admit(gate, 1)
    with pytest.raises(GateError):
        gate.publish(1)  # phase 0 is collecting
    assert gate.published == 0 and gate.started and gate.waiting_for() == [1, 2]


def test_publish_of_a_non_consecutive_version_raises(releases):
    gate = AdmissionGate(steps_per_phase=1)
    gate.join(1)
    releases.admit(gate, 1)
    assert releases.finish(gate, 1).closed == (ClosedPhase(0, (1,)),)
    for bad in (0, 2, -1, 5):
        with pytest.raises(GateError):
            gate.publish(bad)
    assert releases.take() == [] and gate.held_count() == 1 and gate.published == 0
    gate.publish(1)
    assert releases.take() == [(1, Admission(1, 0, 1))]
    with pytest.raises(GateError):
        gate.publish(2)  # phase 1 has not closed
    with pytest.raises(GateError):
        gate.publish(1)  # not twice
    assert gate.published == 1


def test_pipelined_publish_follows_closes_one_version_at_a_time(releases):
    gate = AdmissionGate(steps_per_phase=1, max_lag=2)
    gate.join(1)
    releases.admit(gate, 1)
    gate.request(1, releases.for_(1))
    gate.request(1, releases.for_(1))  # phases 0 and 1 closed, phase 2 collecting
    with pytest.raises(GateError):
        gate.publish(2)  # skips 1
    gate.publish(1)
    gate.publish(2)
    with pytest.raises(GateError):
        gate.publish(3)  # phase 2 is collecting
    assert gate.published == 2 and releases.take() == []


