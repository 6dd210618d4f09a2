from __future__ import annotations

from stream.kafka.deadline import Deadline


class Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def test_a_deadline_counts_down_on_its_clock_and_never_goes_below_its_floor() -> None:
    clock = Clock()
    deadline = Deadline(2.0, clock)
    assert deadline.left() == 2.0 and not deadline.passed()
    clock.now += 1.5
    assert deadline.left() == 0.5
    clock.now += 0.5
    assert deadline.passed() and deadline.left() == 0.0 and deadline.left(0.01) == 0.01
    assert not Deadline(float("inf"), clock).passed()
