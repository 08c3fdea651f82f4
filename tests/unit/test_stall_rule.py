"""``StallRule``: a phase is a stall when it collects far longer than the run's own recent phases (and longer
than sync.stall_s); the watchdog's warning and the ``stalls`` count judge it alike. Phases are timed by a
clock the test advances: no test here waits."""

from __future__ import annotations

from lockstep import config as config_lib
from lockstep.learner.rollout import RECENT_PHASES, PhaseStore
from lockstep.learner.session import STALL_FACTOR, StallRule, StallWatch
from lockstep.sync import ClosedPhase

RULE = StallRule(floor_s=10.0, factor=3.0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_defaults_are_the_rule_of_the_help():
    assert StallRule.of(config_lib.Config().sync) == RULE
    assert (STALL_FACTOR, RECENT_PHASES) == (3.0, 20)  # as sync.stall_s's help and docs/reliability.md say
    help_text = config_lib.setting_of("sync.stall_s").help
    assert "3 x the median collect time of the last 20 phases" in help_text


def test_before_any_phase_closed_the_limit_is_stall_s():
    assert RULE.limit_s(()) == 10.0
    assert not RULE.stalled(10.0, ()) and RULE.stalled(10.5, ())
    assert RULE.explain(()) == "10 s (sync.stall_s; no phase has closed yet)"


def test_fast_phases_keep_the_floor_and_slow_ones_raise_the_limit_to_their_pace():
    assert RULE.limit_s([0.5] * 20) == 10.0  # 3 x 0.5 s is less than sync.stall_s
    assert RULE.limit_s([12.0] * 20) == 36.0  # a steady 12 s: 3 x its median
    assert not RULE.stalled(30.0, [12.0] * 20) and RULE.stalled(40.0, [12.0] * 20)
    assert RULE.explain([12.0] * 20) == ("36 s (3 x the median collect time 12 s of the last 20 phases; "
                                         "sync.stall_s = 10 is less)")
    assert RULE.explain([0.5, 0.5]) == ("10 s (sync.stall_s; 3 x the median collect time 0.5 s of the last 2 phases "
                                        "is less)")


def test_a_few_stalls_in_the_history_do_not_raise_the_limit_for_the_next_phase():
    history = [2.0] * 15 + [100.0] * 5  # five phases held up by a hung actor among twenty
    assert RULE.limit_s(history) == 10.0
    assert RULE.stalled(50.0, history)


def _run(durations: list[float], tick_s: float = 1.0) -> tuple[list[int], list[int]]:
    """Phases of the given collect times, timed by a PhaseStore on the test's clock and looked at by the
    watchdog's StallWatch every ``tick_s``; the phases it warned of, and those the trainer counts as stalls."""
    clock = Clock()
    store = PhaseStore(clock)
    watch = StallWatch(RULE, store)
    warned, counted = [], []
    for phase, duration in enumerate(durations):
        start = clock.now
        while clock.now + tick_s <= start + duration:  # the last look comes as the phase closes
            clock.now += tick_s
            if watch.overdue(phase) is not None:
                warned.append(phase)
        clock.now = start + duration
        store.close([ClosedPhase(phase, ())])
        item = store.next()
        assert item.phase == phase and item.collect_s == duration and len(item.recent_s) == min(phase, RECENT_PHASES)
        if RULE.stalled(item.collect_s, item.recent_s):  # as the learner counts ``stalls``
            counted.append(phase)
    return warned, counted


def test_a_steady_slow_run_warns_of_its_first_phase_only_and_a_phase_far_slower_than_its_history_is_a_stall():
    # an env at ~50 steps/s: every phase takes 11 to 14 s, longer than sync.stall_s (10 s) each time
    steady = [11.0, 13.0, 12.0, 14.0] * 25
    warned, counted = _run(steady)
    assert warned == counted == [0]  # the first phase, with no history to judge it by
    warned, counted = _run([*steady, 60.0, 12.0, 12.5])  # then an actor held one phase up for a minute
    assert warned == counted == [0, 100]


def test_the_warning_names_the_phase_and_the_limit_once():
    clock = Clock()
    store = PhaseStore(clock)
    for phase in range(5):
        clock.now += 12.0
        store.close([ClosedPhase(phase, ())])
    watch = StallWatch(RULE, store)
    clock.now += 36.0
    assert watch.overdue(5) is None  # at the limit: no stall yet
    clock.now += 1.0
    assert watch.overdue(5) == ("phase 5 has collected for more than 36 s (3 x the median collect time 12 s of the "
                                "last 5 phases; sync.stall_s = 10 is less)")
    clock.now += 100.0
    assert watch.overdue(5) is None  # once per phase
