from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream.errors import StreamError
from stream.kafka.offsets import OffsetTracker

TP = ("in", 0)


def test_nothing_committable_until_acked() -> None:
    t = OffsetTracker()
    t.assign([TP])
    span = t.dispatch(TP, 0, 9, 10)
    assert t.committable() == {}
    for _ in range(9):
        span.ack()
    assert t.committable() == {}
    span.ack()
    assert t.committable() == {TP: 10}
    assert t.committable() == {}  # handed out once


def test_later_span_waits_for_earlier_one() -> None:
    t = OffsetTracker()
    t.assign([TP])
    first = t.dispatch(TP, 0, 4, 5)
    second = t.dispatch(TP, 5, 9, 5)
    second.ack(5)
    assert t.committable() == {}, "an unacknowledged earlier record must hold back later ones"
    first.ack(5)
    assert t.committable() == {TP: 10}


def test_gaps_in_offsets_commit_after_last_record() -> None:
    t = OffsetTracker()
    t.assign([TP])
    # Offsets 0, 2, 3 (1 is a transaction marker or compacted away), then 10..11.
    a = t.dispatch(TP, 0, 3, 3)
    b = t.dispatch(TP, 10, 11, 2)
    a.ack(3)
    assert t.committable() == {TP: 4}
    b.ack(2)
    assert t.committable() == {TP: 12}


def test_partitions_are_independent() -> None:
    t = OffsetTracker()
    t.assign([("in", 0), ("in", 1)])
    a = t.dispatch(("in", 0), 0, 0, 1)
    t.dispatch(("in", 1), 0, 0, 1)
    a.ack()
    assert t.committable() == {("in", 0): 1}
    assert t.in_flight() == 1 and t.in_flight(("in", 1)) == 1


def test_revoke_forgets_and_late_acks_are_harmless() -> None:
    t = OffsetTracker()
    t.assign([TP])
    span = t.dispatch(TP, 0, 4, 5)
    t.forget([TP])
    span.ack(5)  # a delivery report that arrives after the revoke
    assert t.committable() == {}
    assert not t.is_assigned(TP)
    t.assign([TP])  # the partition comes back: fresh state, old span not counted
    assert t.in_flight(TP) == 0
    with pytest.raises(StreamError):
        t.dispatch(("other", 0), 0, 0, 1)


def test_restore_after_failed_commit() -> None:
    t = OffsetTracker()
    t.assign([TP])
    t.dispatch(TP, 0, 0, 1).ack()
    positions = t.committable()
    t.restore(positions)
    assert t.committable() == {TP: 1}


def test_restore_does_not_regress_a_newer_position() -> None:
    t = OffsetTracker()
    t.assign([TP])
    t.dispatch(TP, 0, 0, 1).ack()
    old = t.committable()
    t.dispatch(TP, 1, 1, 1).ack()
    assert t.committable() == {TP: 2}
    t.restore(old)  # the older async commit failed after a newer one was handed out
    assert t.committable() == {}


def test_sync_commit_takes_positions_a_pending_async_commit_holds() -> None:
    """Shutdown must not trust an asynchronous commit still in flight: librdkafka answers one sent during a
    cooperative rebalance only after the generation moved on, with ILLEGAL_GENERATION (a chaos run lost
    its last commits that way). Confirmed positions are not committed twice."""
    t = OffsetTracker()
    other = ("in", 1)
    t.assign([TP, other])
    t.dispatch(TP, 0, 4, 5).ack(5)
    t.dispatch(other, 0, 1, 2).ack(2)
    assert t.committable() == {TP: 5, other: 2}  # handed to an async commit, no answer yet
    assert t.committable() == {}
    t.confirm({other: 2})  # only the second partition's answer came back
    assert t.committable(unconfirmed=True) == {TP: 5}
    assert t.committable([other], unconfirmed=True) == {}
    t.dispatch(TP, 5, 5, 1).ack()
    assert t.committable([TP], unconfirmed=True) == {TP: 6}
    t.confirm({TP: 6})
    t.confirm({TP: 5})  # a late answer for an older commit does not move the confirmed position back
    assert t.committable(unconfirmed=True) == {}


@pytest.mark.parametrize("first,last,count", [(5, 4, 1), (0, 3, 0), (0, 3, 5)])
def test_rejects_bad_spans(first: int, last: int, count: int) -> None:
    t = OffsetTracker()
    t.assign([TP])
    with pytest.raises(StreamError):
        t.dispatch(TP, first, last, count)


def test_rejects_non_increasing_offsets_and_over_ack() -> None:
    t = OffsetTracker()
    t.assign([TP])
    span = t.dispatch(TP, 0, 4, 5)
    with pytest.raises(StreamError):
        t.dispatch(TP, 4, 6, 3)
    span.ack(5)
    with pytest.raises(StreamError):
        span.ack()


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 20), min_size=1, max_size=30), seed=st.integers(0, 2**32 - 1))
def test_property_watermark_is_contiguous_acked_prefix(sizes: list[int], seed: int) -> None:
    """Acks in random order: the committed position is always exactly 1 + the last offset of the longest
    fully acknowledged prefix, and it never goes backwards."""
    rng = random.Random(seed)
    t = OffsetTracker()
    t.assign([TP])
    spans, offset = [], 0
    for size in sizes:
        spans.append(t.dispatch(TP, offset, offset + size - 1, size))
        offset += size
    acks = [i for i, size in enumerate(sizes) for _ in range(size)]
    rng.shuffle(acks)
    remaining = list(sizes)
    position = 0
    for i in acks:
        spans[i].ack()
        remaining[i] -= 1
        expected = 0
        for j, size in enumerate(sizes):
            if remaining[j]:
                break
            expected += size
        got = t.committable().get(TP, position)
        assert got >= position
        position = got
        assert position == expected
    assert position == offset


def test_admit_keeps_each_offset_once_and_never_skips_ahead() -> None:
    t = OffsetTracker()
    t.assign([("t", 0)])
    keep = t.admit("t", np.array([0, 0, 0, 0, 7]), np.array([5, 6, 5, 7, 1]))
    assert keep is not None and keep.tolist() == [True, True, False, True, True]  # partition 7 is not assigned
    assert t.admit("t", np.array([0, 0]), np.array([8, 9])) is None
    keep = t.admit("t", np.array([0, 0, 0]), np.array([4, 12, 10]))
    assert keep is not None and keep.tolist() == [False, True, False]


def test_taken_to_holds_once_every_assigned_partition_is_taken_to_its_end() -> None:
    t = OffsetTracker()
    t.assign([("t", 0), ("t", 1)])
    ends = {0: 10, 1: 5, 2: 7}  # partition 2 is another replica's: never holds this back
    assert t.taken_to("t", ends) is False  # nothing taken yet
    t.admit("t", np.array([0, 1]), np.array([9, 3]))
    assert t.taken_to("t", ends) is False  # partition 1 stopped at 4, short of its end (5)
    t.admit("t", np.array([1]), np.array([4]))
    assert t.taken_to("t", ends) is True
    assert t.taken_to("t", {0: 11}) is False
