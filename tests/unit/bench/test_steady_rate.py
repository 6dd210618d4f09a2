"""The drain's steady-state rate: the slope between 20 % and 95 % of the records, the edges left out."""

from __future__ import annotations

import pytest

from stream.bench.report import Drain, steady_rate_of


def test_a_slow_start_and_a_slow_end_do_not_count() -> None:
    # 1 s of start-up with nothing consumed, 1,000 records/s for 10 s, then 3 s for the last commit
    progress = [(t / 10, 0.0) for t in range(10)]
    progress += [(1 + t / 10, 100.0 * t) for t in range(101)]
    progress += [(11 + t / 10, 10_000.0) for t in range(1, 31)]
    assert steady_rate_of(progress, 10_000) == pytest.approx(1_000.0)
    drain = Drain("x", 10_000, 14.0, progress=progress)
    assert drain.rate == pytest.approx(714.3, abs=0.1) and drain.steady_rate == pytest.approx(1_000.0)


def test_a_rate_that_changes_midway_is_averaged_over_the_middle() -> None:
    # 500/s up to 5,000 records, then 2,000/s: 20 %..95 % is 2,000 -> 9,500
    progress = [(t / 10, 50.0 * t) for t in range(101)]  # 0..5,000 in 10 s
    progress += [(10 + t / 10, 5_000.0 + 200.0 * t) for t in range(1, 26)]  # to 10,000 in 2.5 s
    seconds = (5_000 - 2_000) / 500 + (9_500 - 5_000) / 2_000
    assert steady_rate_of(progress, 10_000) == pytest.approx(7_500 / seconds)


def test_too_few_samples_in_the_middle_say_nothing() -> None:
    assert steady_rate_of([(0.0, 0.0), (0.2, 10_000.0)], 10_000) is None
    assert steady_rate_of([], 10) is None
    assert Drain("x", 10, 1.0).steady_rate is None
