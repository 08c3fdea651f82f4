"""``close_empty`` (several learners): a started gate whose members are all gone closes each phase empty
once its version is published, so the learner trains every version with the other ranks; without the
option the phase stays open for joiners (one learner: nobody else waits)."""

from __future__ import annotations

import pytest

from lockstep.sync import Admission, AdmissionGate, ClosedPhase


@pytest.mark.parametrize("max_lag", [0, 1])
def test_a_gate_whose_members_all_left_closes_each_published_phase_empty(releases, max_lag):
    gate = AdmissionGate(steps_per_phase=2, max_lag=max_lag, close_empty=True)
    gate.join("a")
    gate.join("b")
    releases.admit(gate, "a")
    releases.admit(gate, "b")
    assert gate.leave("a") == (1, ())  # b still collects in phase 0
    assert gate.leave("b") == (1, (ClosedPhase(0, ()),))  # the last member gone: phase 0 closes empty
    assert gate.oldest_open == 1
    assert gate.publish(1) == (ClosedPhase(1, ()),)  # no member: phase 1 closes as soon as version 1 is out
    assert gate.publish(2) == (ClosedPhase(2, ()),)
    gate.join("c")  # a joiner collects in the open phase (3); strict: with version 3, once published
    first = gate.request("c", releases.for_("c")).admission
    assert gate.publish(3) == ()  # c collects in phase 3: it does not close without c
    assert (first, releases.take()) == ((Admission(2, 0, 3), []) if max_lag else (None, [("c", Admission(3, 0, 3))]))


def test_a_phase_closes_empty_only_once_its_version_is_published(releases):
    gate = AdmissionGate(steps_per_phase=1, close_empty=True)
    gate.join("a")
    releases.admit(gate, "a")
    assert releases.finish(gate, "a").closed == (ClosedPhase(0, ("a",)),)  # held for version 1
    assert gate.leave("a") == (0, ())  # phase 1 waits for version 1, which phase 0's update makes
    assert gate.publish(1) == (ClosedPhase(1, ()),)


def test_without_close_empty_the_phase_stays_open_for_joiners(releases):
    gate = AdmissionGate(steps_per_phase=2)
    gate.join("a")
    releases.admit(gate, "a")
    assert gate.leave("a") == (1, ())
    assert gate.oldest_open == 0
    gate.join("b")
    assert releases.admit(gate, "b") == Admission(0, 0, 0)


def test_a_gate_that_never_started_closes_nothing(releases):
    gate = AdmissionGate(steps_per_phase=2, min_members=2, close_empty=True)
    gate.join("a")
    assert gate.leave("a") == (0, ())
    assert gate.oldest_open == 0 and not gate.started
