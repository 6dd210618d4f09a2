"""StallDetector: pure, on a fake clock."""

from __future__ import annotations

import pytest

from stream.errors import ConfigError
from stream.ops.stalls import StallDetector

A, B = ("in", 0), ("in", 1)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def detector(timeout_s: float = 100.0) -> tuple[StallDetector, FakeClock]:
    clock = FakeClock()
    return StallDetector(timeout_s, clock), clock


def check(d: StallDetector, waiting: dict[tuple[str, int], bool]) -> list[tuple[str, int]]:
    """One check as the worker does it: only the idle partitions are looked at."""
    idle = set(d.idle())
    return d.judge({tp: w for tp, w in waiting.items() if tp in idle})


def test_a_partition_with_records_waiting_and_no_progress_is_reported_after_the_timeout_not_before() -> None:
    d, clock = detector(100.0)
    d.assign([A, B])
    assert d.check_every_s == 25.0
    reported_at = None
    for _ in range(12):  # checks every 25 s for 300 s
        clock.now += 25.0
        if check(d, {A: True, B: False}) and reported_at is None:
            reported_at = clock.now - 1000.0
    assert d.stalled() == [A]
    # Waiting records were first seen at the first check after it went idle (25 s); 100 s of that.
    assert reported_at == 125.0


def test_a_stalled_partition_is_warned_about_again_each_timeout_and_recovers_on_progress() -> None:
    d, clock = detector(100.0)
    d.assign([A])
    warnings = []
    for _ in range(16):  # 400 s
        clock.now += 25.0
        warnings += [clock.now - 1000.0 for _ in check(d, {A: True})]
    assert warnings == [125.0, 225.0, 325.0]
    d.progressed(A)
    assert d.stalled() == [] and d.take_recovered() == [A] and d.take_recovered() == []
    assert d.idle() == [], "it just made progress"


def test_records_arriving_at_a_long_idle_partition_do_not_make_it_stalled_at_once() -> None:
    d, clock = detector(100.0)
    d.assign([A])
    for _ in range(40):  # 1000 s idle with nothing to do
        clock.now += 25.0
        assert check(d, {A: False}) == []
    clock.now += 25.0
    assert check(d, {A: True}) == [] and d.stalled() == []  # a record arrived: not stuck yet
    clock.now += 25.0
    d.progressed(A)  # and the worker handled it
    for _ in range(8):
        clock.now += 25.0
        assert check(d, {A: False}) == []
    assert d.stalled() == []


def test_records_waiting_must_be_seen_at_every_check_for_the_whole_timeout() -> None:
    d, clock = detector(100.0)
    d.assign([A])
    pattern = [True, True, True, False] * 5  # never four checks in a row
    for waiting in pattern:
        clock.now += 25.0
        assert check(d, {A: waiting}) == []
    assert d.stalled() == []


def test_a_stalled_partition_that_is_revoked_or_caught_up_is_no_longer_stalled() -> None:
    d, clock = detector(10.0)
    d.assign([A, B])
    for _ in range(8):
        clock.now += 2.5
        check(d, {A: True, B: True})
    assert d.stalled() == [A, B]
    d.forget([A])
    clock.now += 2.5
    check(d, {B: False})  # its records are gone (retention, a truncated topic)
    assert d.stalled() == [] and d.take_recovered() == [B]
    assert d.judge({A: True}) == [], "a forgotten partition is not judged"


def test_checks_are_due_every_quarter_of_the_timeout() -> None:
    d, clock = detector(8.0)
    assert not d.due()
    clock.now += 2.0
    assert d.due() and not d.due()
    clock.now += 1.9
    assert not d.due()
    clock.now += 0.1
    assert d.due()


def test_a_non_positive_timeout_is_refused() -> None:
    with pytest.raises(ConfigError, match="stall timeout"):
        StallDetector(0.0)
