"""The pace of a site's asks: milliseconds after a message, doubling to the cap, then idle."""

from __future__ import annotations

from fedstats.flower.study_pace import StudyPace
from fedstats.flower.supernode import PacedClock


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_asks_start_fast_after_a_message_double_to_the_cap_and_idle_after_the_window():
    clock = Clock()
    pace = StudyPace(0.005, cap=0.08, idle=1.0, window=30.0, clock=clock)
    assert pace.interval() == 1.0  # before any message: idle
    pace.active()
    waits = [pace.interval() for _ in range(7)]
    assert waits == [0.005, 0.01, 0.02, 0.04, 0.08, 0.08, 0.08]
    clock.now += 29.9
    assert pace.interval() == 0.08
    clock.now += 0.2
    assert pace.interval() == 1.0
    pace.active()
    assert pace.interval() == 0.005


def test_a_node_waiting_for_its_next_request_asks_at_most_one_over_the_cap_times_a_second():
    clock = Clock()
    pace = StudyPace(0.005, cap=0.08, window=30.0, clock=clock)
    pace.active()
    asks, waited = 0, 0.0
    while waited < 10.0:
        wait = pace.interval()
        clock.now += wait
        waited += wait
        asks += 1
    assert asks <= 10.0 / 0.08 + 5


def test_the_supernode_clock_waits_idle_polls_by_the_pace_and_reply_waits_fast(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr("fedstats.flower.supernode._time.sleep", slept.append)
    clock = Clock()
    paced = PacedClock(StudyPace(0.005, cap=0.08, idle=1.0, window=30.0, clock=clock))
    paced.sleep(3)  # Flower's "no message" wait, before any message: the idle pace
    paced.sleep(0.5)  # waiting for the ClientApp's reply: a message is being served
    paced.sleep(3)
    paced.sleep(3)
    assert slept == [1.0, 0.005, 0.005, 0.01]
    assert paced.monotonic is not None  # every other name is the time module's
