"""Exhaustive model checking of the admission gate (lockstep_verify).

Every interleaving of joins, requests, inferences, leaves, rejoins, training and
publishing of a few actors around the real AdmissionGate, checked for the safety,
lag, deadlock, liveness and progress properties listed in lockstep_verify's
docstring. Then gates with planted bugs, to show that the checker catches them with
a trace.

Sizes are chosen to keep this file under ~30 s on one core (lockstep_verify's
docstring lists them with their state counts and times).
"""

from __future__ import annotations

import pytest
from lockstep_verify import Report, check, main, replay

from lockstep.sync.gate import AdmissionGate, ClosedPhase


def assert_clean(report: Report, min_states: int) -> None:
    assert report.complete, report.format()
    assert not report.violations, report.format()
    assert report.states >= min_states, report.format()
    assert report.transitions > report.states, report.format()
    assert report.finished_states > 0, report.format()  # the runs do finish


def props(report: Report) -> set[str]:
    return {v.prop for v in report.violations}


# ---------------------------------------------------------------------------------
# The real gate
# ---------------------------------------------------------------------------------


def test_strict_two_actors_with_leaves_and_rejoins():
    r = check(actors=2, steps=2, versions=3, max_lag=0, disconnects=True, reconnects=1)
    assert_clean(r, min_states=2000)
    assert r.abandoned_states > 0


def test_strict_two_actors_min_members_two():
    assert_clean(check(actors=2, steps=2, versions=3, max_lag=0, min_members=2), min_states=1000)


def test_strict_two_actors_two_rejoins_symmetry():
    assert_clean(check(actors=2, steps=2, versions=3, max_lag=0, reconnects=2, symmetry=True), min_states=2500)


def test_symmetry_reduction_agrees_with_the_full_search():
    full = check(actors=2, steps=2, versions=3, max_lag=0)
    reduced = check(actors=2, steps=2, versions=3, max_lag=0, symmetry=True)
    assert full.ok and reduced.ok
    assert full.states / 2 <= reduced.states < full.states


@pytest.mark.parametrize("max_lag, exact_stamps, min_states", [(1, True, 5000), (2, False, 3000)])
def test_pipelined_two_actors_with_leaves_no_rejoin(max_lag, exact_stamps, min_states):
    r = check(actors=2, steps=2, versions=3, max_lag=max_lag, reconnects=0, exact_stamps=exact_stamps,
              symmetry=True)
    assert_clean(r, min_states)


@pytest.mark.parametrize("max_lag", [1, 2])
def test_pipelined_two_actors_without_leaves(max_lag):
    r = check(actors=2, steps=2, versions=3, max_lag=max_lag, disconnects=False, exact_stamps=False,
              symmetry=True)
    assert_clean(r, min_states=500)


@pytest.mark.parametrize("max_lag, exact_stamps", [(1, True), (2, False)])
def test_pipelined_two_actors_with_leaves_and_rejoins(max_lag, exact_stamps):
    r = check(actors=2, steps=2, versions=3, max_lag=max_lag, reconnects=1, exact_stamps=exact_stamps,
              symmetry=True)
    assert_clean(r, min_states=20000)


# The shortest trace of the rejoin bug this checker found in an earlier gate.py: A1 joins
# while phase 0 is under way (so into phase 1), completes phase 1 ahead of A0 (pipelined),
# leaves, rejoins -- and was put back into phase 1, to collect it a second time.
REJOIN_TRACE = (("join", 0), ("request", 0), ("join", 1), ("request", 1), ("infer", 1), ("request", 1),
                ("infer", 1), ("request", 1), ("leave", 1), ("join", 1), ("request", 1))


def test_the_rejoin_trace_is_clean_now():
    steps = replay(REJOIN_TRACE, max_lag=1)
    assert all(not bad for _, bad in steps), steps
    # the rejoined A1 collects phase 2, not phase 1 again: held until version 1 is published
    assert steps[-1][0] == "A1.request -> held", steps[-1][0]


def test_three_actors_strict_with_leaves_and_rejoins():
    r = check(actors=3, steps=2, versions=3, max_lag=0, reconnects=1, exact_stamps=False, symmetry=True)
    assert_clean(r, min_states=10000)


def test_three_actors_pipelined_with_leaves():
    r = check(actors=3, steps=2, versions=2, max_lag=1, reconnects=0, exact_stamps=False, symmetry=True)
    assert_clean(r, min_states=4000)


@pytest.mark.parametrize("max_lag", [0, 1])
def test_straggler_cutoff_with_weighted_members(max_lag):
    # A0 has two env slots: its complete unroll alone reaches the 0.6 cut-off, so A1 gets cut short
    r = check(actors=2, steps=2, versions=3, max_lag=max_lag, cutoff=0.6, weights=(2, 1),
              reconnects=1 if max_lag == 0 else 0, exact_stamps=max_lag == 0)
    assert_clean(r, min_states=3000)


def test_straggler_cutoff_with_a_minimum_unroll_three_actors():
    r = check(actors=3, steps=3, versions=2, max_lag=0, cutoff=0.5, min_unroll=0.5, reconnects=0,
              exact_stamps=False, symmetry=True)
    assert_clean(r, min_states=2000)


def test_symmetry_never_merges_actors_of_different_weights():
    plain = check(max_lag=0, cutoff=0.6, weights=(2, 1))
    reduced = check(max_lag=0, cutoff=0.6, weights=(2, 1), symmetry=True)
    assert plain.ok and reduced.ok and plain.states == reduced.states


def test_start_version():
    r = check(max_lag=1, start_version=7, reconnects=0, symmetry=True)
    assert_clean(r, min_states=5000)


# ---------------------------------------------------------------------------------
# Planted bugs are caught
# ---------------------------------------------------------------------------------


class IgnoresMaxLag(AdmissionGate):
    def _admissible(self, phase):
        return True


class ClosesEarly(AdmissionGate):
    """Closes the oldest phase as soon as one unroll of it is complete, while others still collect."""

    def _close_ready(self):
        u = self._next_close
        if u in self._phases:
            phase = self._phases.pop(u)
            self._next_close = u + 1
            return (ClosedPhase(u, tuple(sorted(phase.complete))),) + super()._close_ready()
        return super()._close_ready()


class NeverClosesEmptyPhases(AdmissionGate):
    """Forgets the rule that an abandoned phase closes once a member waits beyond it."""

    def _close_ready(self):
        closed = []
        while True:
            u = self._next_close
            if any(s.first_phase <= u and s.phase <= u for s in self._members.values()):
                break
            phase = self._phases.pop(u, None)
            if phase is None:
                break
            closed.append(ClosedPhase(u, tuple(sorted(phase.complete))))
            self._next_close = u + 1
        return tuple(closed)


class KeepsHeldOnLeave(AdmissionGate):
    def leave(self, member):
        callback = self._held.get(member)
        out = super().leave(member)
        if callback is not None:
            self._held[member] = callback
        return out


class ReleasesTwice(AdmissionGate):
    """Releases a held request but forgets to drop it from the held set."""

    def _release_admissible(self):
        releases = []
        for member in sorted(self._held):
            admission = self._admit(self._members[member])
            if admission is not None:
                releases.append((self._held[member], admission))
        return releases


class ForgetsToPublish(AdmissionGate):
    """Publishing releases nobody."""

    def publish(self, version):
        with self._lock:
            self._published = version


class RejoinsCompletedPhases(AdmissionGate):
    """The earlier join rule: the newest phase among members only (the rejoin bug)."""

    def _joining_phase(self):
        newest = max([s.phase for s in self._members.values()] + [self._next_close])
        under_way = newest in self._phases or any(s.phase == newest and s.steps for s in self._members.values())
        return newest + 1 if under_way else newest


class CutsTooShort(AdmissionGate):
    """Cuts stragglers without regard to min_unroll."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.min_cut_steps = 1


def _assert_caught(report: Report, expected: set[str], words: str) -> None:
    assert report.violations, report.format()
    assert expected <= props(report), report.format()
    v = next(v for v in report.violations if v.prop in expected)
    assert v.trace and len(v.trace) == len(v.events), report.format()
    assert any(words in x.message for x in report.violations), report.format()


def test_catches_a_gate_that_ignores_max_lag_strict():
    r = check(max_lag=0, gate_factory=IgnoresMaxLag, stop_on_violation=True)
    _assert_caught(r, {"safety"}, "outside [1, 1]")
    # the shortest: A1 joins while phase 0 is under way, so it collects phase 1, and is admitted at once
    assert r.violations[0].events == (("join", 0), ("request", 0), ("join", 1), ("request", 1))


def test_catches_a_gate_that_ignores_max_lag_pipelined():
    r = check(max_lag=1, gate_factory=IgnoresMaxLag, stop_on_violation=True)
    _assert_caught(r, {"safety"}, "outside [1, 2]")


def test_catches_a_gate_that_closes_a_phase_too_early():
    r = check(max_lag=0, gate_factory=ClosesEarly)
    _assert_caught(r, {"safety"}, "still collects in it")  # an unfinished unroll is lost
    _assert_caught(r, {"safety"}, "which is already closed")  # a joined member is admitted into it


def test_catches_a_gate_that_never_closes_an_abandoned_phase():
    r = check(max_lag=0, gate_factory=NeverClosesEmptyPhases)
    _assert_caught(r, {"deadlock", "liveness", "progress"}, "every live actor is held")
    events = next(v for v in r.violations if v.prop == "deadlock").events
    # the actor that took the step leaves; the one that joined beyond its phase waits forever
    assert ("leave", 0) in events or ("leave", 1) in events
    replay(events, max_lag=0, gate_factory=NeverClosesEmptyPhases)  # the trace is a real run


def test_catches_a_gate_that_keeps_a_held_request_after_leave():
    r = check(max_lag=0, gate_factory=KeepsHeldOnLeave)
    _assert_caught(r, {"safety"}, "")
    assert any("raised" in v.message or "not held" in v.message for v in r.violations), r.format()


def test_catches_a_gate_that_releases_twice():
    r = check(max_lag=0, gate_factory=ReleasesTwice)
    _assert_caught(r, {"safety"}, "")
    assert any("already has a held request" in v.message or "already released" in v.message
               for v in r.violations), r.format()


def test_catches_a_gate_whose_publish_releases_nobody():
    r = check(max_lag=0, gate_factory=ForgetsToPublish, disconnects=False)
    _assert_caught(r, {"deadlock", "liveness", "progress"}, "")


def test_catches_the_rejoin_bug_with_its_shortest_trace():
    r = check(max_lag=1, gate_factory=RejoinsCompletedPhases, stop_on_violation=True)
    _assert_caught(r, {"safety"}, "admitted again into phase 1")
    assert r.violations[0].events == REJOIN_TRACE
    steps = replay(REJOIN_TRACE, max_lag=1, gate_factory=RejoinsCompletedPhases)
    assert all(not bad for _, bad in steps[:-1]) and steps[-1][1][0][1] == r.violations[0].message


def test_catches_a_gate_that_cuts_stragglers_below_min_unroll():
    r = check(max_lag=0, cutoff=0.5, min_unroll=1.0, gate_factory=CutsTooShort, stop_on_violation=True)
    _assert_caught(r, {"safety"}, "or a prefix of at least 2")


def test_command_line_prints_a_table(capsys):
    assert main(["--actors", "2", "--versions", "2", "--max-lag", "1", "--reconnects", "0"]) == 0
    out = capsys.readouterr().out
    assert "pipelined K=1, 2 actors, T=2, 2 versions" in out and out.rstrip().endswith("ok")


def test_replay_rejects_an_event_that_is_not_enabled():
    with pytest.raises(ValueError):
        replay([("request", 0)])
