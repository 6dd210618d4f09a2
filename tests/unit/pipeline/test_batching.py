from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream.errors import ConfigError
from stream.pipeline.batching import MicroBatcher


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance_ms(self, ms: float) -> None:
        self.now += ms / 1000.0


def test_closes_at_max_batch_size() -> None:
    b: MicroBatcher[int] = MicroBatcher(3, 20, FakeClock())
    b.add([1, 2])
    assert not b.ready()
    b.add([3])
    assert b.ready()
    assert b.take() == [1, 2, 3]
    assert len(b) == 0 and not b.ready()


def test_time_counts_from_first_record_not_from_last() -> None:
    clock = FakeClock()
    b: MicroBatcher[int] = MicroBatcher(100, 20, clock)
    b.add([1])
    clock.advance_ms(15)
    b.add([2])  # a later record must not restart the clock
    assert not b.ready()
    assert b.time_left() == pytest.approx(0.005)
    clock.advance_ms(5)
    assert b.ready()
    assert b.take() == [1, 2]


def test_empty_batch_never_ready_and_has_no_deadline() -> None:
    clock = FakeClock()
    b: MicroBatcher[int] = MicroBatcher(10, 5, clock)
    clock.advance_ms(1000)
    assert not b.ready()
    assert b.deadline() is None and b.time_left() is None
    b.add([])
    assert b.deadline() is None


def test_new_batch_restarts_clock_after_take() -> None:
    clock = FakeClock()
    b: MicroBatcher[int] = MicroBatcher(10, 20, clock)
    b.add([1])
    clock.advance_ms(25)
    assert b.take() == [1]
    b.add([2])
    assert not b.ready()
    clock.advance_ms(20)
    assert b.ready()


def test_zero_wait_closes_immediately() -> None:
    b: MicroBatcher[int] = MicroBatcher(10, 0, FakeClock())
    b.add([1])
    assert b.ready()


def test_room_and_discard() -> None:
    clock = FakeClock()
    b: MicroBatcher[int] = MicroBatcher(5, 20, clock)
    b.add([1, 2, 3, 4])
    assert b.room == 1
    assert b.discard(lambda x: x % 2 == 0) == 2
    assert b.take() == [2, 4]
    b.add([1])
    assert b.discard(lambda x: False) == 1
    assert b.deadline() is None


@pytest.mark.parametrize("size,wait", [(0, 10), (-1, 10), (5, -1)])
def test_rejects_bad_parameters(size: int, wait: float) -> None:
    with pytest.raises(ConfigError):
        MicroBatcher(size, wait)


@settings(max_examples=300, deadline=None)
@given(
    max_size=st.integers(1, 20),
    max_wait=st.integers(0, 50),
    steps=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 8)), max_size=60),
)
def test_property_batches_respect_size_and_wait(max_size: int, max_wait: int,
                                                steps: list[tuple[int, int]]) -> None:
    """Driven like the worker: add, then take whenever ready. Every batch is non-empty, holds at most
    max_size items when added no faster than room allows, keeps order, and is taken no later than
    max_wait after its first item arrived."""
    clock = FakeClock()
    b: MicroBatcher[int] = MicroBatcher(max_size, max_wait, clock)
    seen: list[int] = []
    counter = 0
    first_at: float | None = None
    for advance, count in steps:
        clock.advance_ms(advance)
        # The worker takes at a deadline it computed, so check readiness at the deadline first: ready once the
        # first item waited max_wait (never later), and before that only when full.
        if first_at is not None:
            waited, bound = clock() - first_at, max_wait / 1000.0
            if waited >= bound + 1e-9:
                assert b.ready(), f"waited {waited * 1000:.1f} ms of {max_wait} and not ready"
            elif waited < bound - 1e-9 and len(b) < max_size:
                assert not b.ready(), f"ready after {waited * 1000:.1f} ms of {max_wait}, not full"
        if first_at is not None and b.ready():
            taken = b.take()
            assert 0 < len(taken) <= max_size
            seen.extend(taken)
            first_at = None
        items = list(range(counter, counter + min(count, b.room)))
        counter += len(items)
        if items and len(b) == 0:
            first_at = clock()
        b.add(items)
        if b.ready():
            deadline = b.deadline()
            assert deadline is not None
            assert len(b) >= max_size or clock() >= deadline
            seen.extend(b.take())
            first_at = None
        elif len(b):
            deadline = b.deadline()
            assert deadline is not None and first_at is not None
            assert deadline == pytest.approx(first_at + max_wait / 1000.0)
    seen.extend(b.take())
    assert seen == list(range(counter))


def test_a_weight_budget_closes_a_batch_before_its_count_and_discard_reweighs() -> None:
    b: MicroBatcher[int] = MicroBatcher(100, 1000, FakeClock(), weight=lambda x: x, max_weight=10)
    b.add([3, 4])
    assert not b.ready() and b.weight == 7
    b.add([2])
    assert not b.ready()
    b.add([1])
    assert b.ready() and b.weight == 10
    assert b.discard(lambda x: x != 4) == 1 and b.weight == 6 and not b.ready()
    assert b.take() == [3, 2, 1] and b.weight == 0
    with pytest.raises(ConfigError, match="max_weight"):
        MicroBatcher(10, 10, max_weight=5)


def test_a_byte_bound_closes_a_batch_before_its_count_says_its_room_and_discard_recounts() -> None:
    b: MicroBatcher[bytes] = MicroBatcher(100, 1000, FakeClock(), nbytes=len, max_bytes=10)
    assert b.byte_room == 10
    b.add([b"abc", b"defg"])
    assert not b.ready() and b.bytes == 7 and b.byte_room == 3
    b.add([b"hij"])
    assert b.ready() and b.byte_room == 0
    assert b.discard(lambda x: x != b"defg") == 1 and b.bytes == 6 and not b.ready()
    assert b.take() == [b"abc", b"hij"] and b.bytes == 0 and b.byte_room == 10
    assert MicroBatcher(10, 10).byte_room is None
    with pytest.raises(ConfigError, match="max_bytes"):
        MicroBatcher(10, 10, max_bytes=5)


def test_token_bounds_are_a_value_s_bytes_plus_two_at_most_the_cap() -> None:
    import numpy as np

    from stream.pipeline.batching import token_bounds

    assert token_bounds(np.array([-1, 0, 10, 300]), 256).tolist() == [2, 2, 12, 256]
