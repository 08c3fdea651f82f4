"""``StepDeadline``: the step deadline follows the actors' pace, between its floors and its ceiling."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lockstep import config as config_lib
from lockstep.learner.session import GAP_DECAY, WATCH_TICK_MIN_S, StepDeadline, watch_tick

RULE = StepDeadline(ceiling_s=300.0, first_step_s=20.0, floor_s=60.0, factor=10.0)


def test_the_defaults_are_the_rule_of_the_docs():
    assert StepDeadline.of(config_lib.Config().sync) == RULE
    assert RULE.least_s == 20.0


def test_the_watchdog_looks_often_enough_for_its_settings_and_never_spins_however_small_they_are():
    sync = config_lib.Config().sync
    assert watch_tick(sync) == 1.0  # the defaults: every second
    sync.stall_s = 0.2
    assert watch_tick(sync) == 0.1  # half the stall time
    for tiny in ("stall_s", "step_deadline_s", "first_step_deadline_s", "step_deadline_min_s"):
        small = config_lib.Config().sync
        setattr(small, tiny, 1e-9)
        assert watch_tick(small) == WATCH_TICK_MIN_S, tiny


def test_a_member_that_never_stepped_gets_the_first_step_deadline_unless_the_others_are_slow():
    assert RULE.seconds(None, None) == (20.0, "first step")
    assert RULE.seconds(None, 0.002) == (20.0, "first step")  # beside fast actors
    assert RULE.seconds(None, 5.0) == (50.0, "pace")  # beside actors whose steps take 5 s


def test_a_member_that_stepped_gets_the_floor_unless_its_own_or_the_others_pace_is_slower():
    assert RULE.seconds(0.001, 0.001) == (60.0, "floor")
    assert RULE.seconds(2.0, 0.001) == (60.0, "floor")  # a 2 s env step beside fast ones: far inside the floor
    assert RULE.seconds(8.0, 0.001) == (80.0, "pace")  # far slower than the others, but not than itself
    assert RULE.seconds(0.001, 9.0) == (90.0, "pace")  # a fast member of a slow run
    assert RULE.seconds(0.5, None) == (60.0, "floor")  # the only member


def test_the_ceiling_caps_every_rule_so_an_explicit_deadline_works_as_before():
    assert RULE.seconds(100.0, None) == (300.0, "ceiling")
    tight = StepDeadline(ceiling_s=2.0, first_step_s=20.0, floor_s=60.0, factor=10.0)
    for own, others in ((None, None), (None, 0.001), (0.001, 0.001), (50.0, 50.0)):
        assert tight.seconds(own, others) == (2.0, "ceiling")
    assert tight.least_s == 2.0


def test_the_explanation_names_the_rule_that_fired_and_its_numbers():
    assert RULE.explain(None, 0.004) == ("deadline 20 s: no step since its hello, sync.first_step_deadline_s = 20; "
                                         "its pace gives less: sync.step_deadline_factor 10 x the other actors' "
                                         "typical step gap 0.004 s = 0.04 s")
    assert RULE.explain(0.01, 0.004) == ("deadline 60 s: the floor sync.step_deadline_min_s = 60; its pace gives "
                                         "less: sync.step_deadline_factor 10 x its slowest recent step gap 0.01 s "
                                         "= 0.1 s")
    assert RULE.explain(8.0, 0.004) == ("deadline 80 s: its pace, sync.step_deadline_factor 10 x its slowest "
                                        "recent step gap 8 s")
    assert RULE.explain(None, 9.0) == ("deadline 90 s: its pace, sync.step_deadline_factor 10 x the other actors' "
                                       "typical step gap 9 s")
    assert RULE.explain(None, None) == ("deadline 20 s: no step since its hello, sync.first_step_deadline_s = 20; "
                                        "no step gap seen yet")
    tight = StepDeadline(ceiling_s=2.0, first_step_s=20.0, floor_s=60.0, factor=10.0)
    assert tight.explain(None, None) == ("deadline 2 s: the ceiling sync.step_deadline_s = 2, below deadline 20 s: "
                                         "no step since its hello, sync.first_step_deadline_s = 20; no step gap "
                                         "seen yet")


gaps = st.none() | st.floats(0.0, 1e4)


@settings(max_examples=300, deadline=None)
@given(own=gaps, others=gaps, slower=st.floats(0.0, 1e4),
       rule=st.builds(StepDeadline, st.floats(0.1, 1e3), st.floats(0.1, 1e3), st.floats(0.1, 1e3),
                      st.floats(1.0, 100.0)))
def test_the_invariants_of_the_rule(own, others, slower, rule):
    deadline, name = rule.seconds(own, others)
    floor = rule.first_step_s if own is None else rule.floor_s
    assert min(rule.ceiling_s, floor) <= deadline <= rule.ceiling_s  # never sooner than the floor, never later
    assert rule.least_s <= deadline
    assert (name == "ceiling") == (max(floor, rule.factor * max(own or 0, others or 0)) > rule.ceiling_s)
    # a slower pace, its own or the others', never shortens the deadline
    assert rule.seconds(None if own is None else own + slower, others)[0] >= deadline
    assert rule.seconds(own, (others or 0.0) + slower)[0] >= deadline
    assert rule.explain(own, others).startswith(f"deadline {deadline:.3g} s: ")


def test_a_slow_gap_is_remembered_for_about_seventy_steps():
    assert 0.49 < GAP_DECAY ** 70 < 0.51
