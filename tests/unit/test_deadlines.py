"""One timer at an actor's next deadline (actors/deadlines.py): what it arms, when it re-arms,
and what its coverage check reports, including after a clock stepped back."""

from __future__ import annotations

from actors.deadlines import DeadlineTimer, lowered
from actors.effects import SetTimer


def test_nothing_wanted_sets_no_timer():
    timer = DeadlineTimer()
    assert timer.arm(100) == [] and timer.armed_ns is None


def test_the_earliest_deadline_wanted_is_armed_and_a_later_one_changes_nothing():
    timer = DeadlineTimer()
    timer.want(900)
    timer.want(500)
    timer.want(700)
    assert timer.arm(100) == [SetTimer("tick", 500)]
    timer.want(800)
    assert timer.arm(200) == [], "already set before it"
    timer.want(300)
    assert timer.arm(250) == [SetTimer("tick", 300)], "an earlier deadline moves the timer"


def test_a_deadline_already_due_arms_the_timer_now():
    timer = DeadlineTimer()
    timer.want(50)
    assert timer.arm(100) == [SetTimer("tick", 100)]


def test_after_it_fires_only_deadlines_still_ahead_are_wanted_again():
    timer = DeadlineTimer()
    timer.want(500)
    timer.arm(100)
    timer.fired()
    timer.want_all([400, 500, 650, 900], 500)
    assert timer.arm(500) == [SetTimer("tick", 650)]


def test_uncovered_names_a_deadline_ahead_that_the_timer_would_miss():
    timer = DeadlineTimer()
    timer.want(700)
    timer.arm(100)
    assert timer.uncovered([700, 800]) is None
    assert timer.uncovered([800, 600]) == 600
    assert timer.uncovered([90]) is None, "already due when the timer was armed: not a deadline ahead"
    timer.fired()
    assert timer.uncovered([800]) == 800, "no timer at all, and a deadline ahead"


def test_a_clock_stepped_back_does_not_make_a_deadline_that_fell_due_look_missed():
    """At 1,000 the timer fired and the due work ran; the clock then stepped back to 600. The
    deadline at 800 fell due at 1,000; it is ahead on the clock again, but not missed."""
    timer = DeadlineTimer()
    timer.want(1_000)
    timer.arm(0)
    timer.fired()
    timer.want_all([800, 2_000], 1_000)
    timer.arm(1_000)
    timer.arm(600)  # a step after the clock went back
    assert timer.uncovered([800, 2_000]) is None
    assert timer.uncovered([1_500]) == 1_500, "a deadline past every time seen is still checked"


def test_a_floor_is_lowered_only_by_a_deadline_ahead_of_now_and_before_it():
    assert lowered(None, 500, 100) == 500
    assert lowered(700, 500, 100) == 500
    assert lowered(400, 500, 100) == 400, "a later deadline leaves the floor"
    assert lowered(700, 90, 100) == 700, "a deadline already due is not one ahead"
    assert lowered(700, None, 100) == 700
