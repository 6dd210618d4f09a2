"""The worker's stall check (`stream.pipeline.stall_check`) against a fake consumer: which idle partitions have records
waiting."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from stream.kafka.offsets import OffsetTracker
from stream.kafka.records import Records
from stream.ops.metrics import StreamMetrics
from stream.ops.stalls import StallDetector
from stream.ops.summary import WorkerSummary
from stream.pipeline.batching import MicroBatcher
from stream.pipeline.committer import CommitLedger
from stream.pipeline.pausing import InputPause
from stream.pipeline.stall_check import StallCheck
from tests.unit.ops.test_stalls import FakeClock

A, B = ("in", 0), ("in", 1)


class OffsetsConsumer:
    """Answers end offsets, application positions and committed offsets from dicts (absent: not known)."""

    def __init__(self, ends: dict[int, int], positions: dict[int, int], committed: dict[int, int] | None = None,
                 committed_error: bool = False) -> None:
        self.ends, self.positions, self.committed_offsets = ends, positions, committed or {}
        self.committed_error = committed_error
        self.fetched: dict[int, int] = {}  # end offsets from the last fetch responses
        self.committed_asked: list[int] = []

    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        assert all(tp.offset == -1 for tp in partitions), "latest offsets are asked with timestamp -1"
        return [TopicPartition(tp.topic, tp.partition, self.ends.get(tp.partition, -1)) for tp in partitions]

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool) -> tuple[int, int]:
        assert cached, "no round trip per partition"
        return -1001, self.fetched.get(tp.partition, -1001)

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.positions.get(tp.partition, -1001)) for tp in partitions]

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        self.committed_asked += [tp.partition for tp in partitions]
        if self.committed_error:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        return [TopicPartition(tp.topic, tp.partition, self.committed_offsets.get(tp.partition, -1001))
                for tp in partitions]


@dataclass
class Parts:
    """What the check reads besides the consumer: the committed positions, the tracker, the open batch."""

    ledger: CommitLedger
    tracker: OffsetTracker
    batcher: MicroBatcher[Records]
    config: dict[str, Any]


@pytest.fixture
def parts() -> Parts:
    tracker, clock = OffsetTracker(), FakeClock()
    ledger = CommitLedger(tracker, StallDetector(8.0, clock), WorkerSummary(), StreamMetrics())
    batcher: MicroBatcher[Records] = MicroBatcher(100, 20.0, clock, size=len)
    return Parts(ledger, tracker, batcher, {"auto.offset.reset": "earliest"})


def stall_check(parts: Parts, consumer: Any) -> StallCheck:
    metrics = StreamMetrics()
    return StallCheck(consumer, StallDetector(8.0, FakeClock()), parts.ledger, parts.tracker, parts.batcher,
                      InputPause(metrics), metrics, parts.config)


def waiting(parts: Parts, consumer: Any, tps: list[tuple[str, int]]) -> dict[tuple[str, int], bool]:
    parts.tracker.assign(tps)
    return stall_check(parts, consumer).records_waiting(tps)


def test_records_waiting_beyond_what_was_taken_or_committed(parts: Parts) -> None:
    consumer = OffsetsConsumer(ends={0: 50, 1: 50, 2: 50}, positions={0: 50, 1: 40})
    parts.ledger.start_at(("in", 2), 50)  # committed all, nothing taken since (position unknown)
    assert waiting(parts, consumer, [("in", 0), ("in", 1), ("in", 2)]) == {
        ("in", 0): False, ("in", 1): True, ("in", 2): False}
    assert consumer.committed_asked == [], "positions known locally: no committed offsets asked"


def test_a_transaction_marker_after_the_last_record_is_not_taken_for_a_waiting_record(parts: Parts) -> None:
    # Transactional input: the last data record is offset 48, its commit marker 49; the end offset is 50. The
    # worker committed 49 (last record + 1); the consumer's position is past the marker.
    parts.ledger.start_at(A, 49)
    assert waiting(parts, OffsetsConsumer(ends={0: 50}, positions={0: 50}), [A]) == {A: False}


def test_records_taken_and_not_committed_are_waiting_even_at_the_end_offset(parts: Parts) -> None:
    consumer = OffsetsConsumer(ends={0: 50, 1: 50}, positions={0: 50, 1: 50})
    check = stall_check(parts, consumer)
    parts.tracker.assign([A, B])
    parts.tracker.dispatch(A, 40, 49, 10)  # dispatched, never acknowledged (a stuck processor)
    parts.batcher.add([Records.build([b"x"], [None], [1], [49])])  # taken, never dispatched
    assert check.records_waiting([A, B]) == {A: True, B: True}
    parts.tracker.confirm({A: 50})
    parts.batcher.take()
    assert check.records_waiting([A, B]) == {A: False, B: False}


def test_a_partition_never_taken_from_is_judged_by_the_groups_committed_offset(parts: Parts) -> None:
    consumer = OffsetsConsumer(ends={0: 50, 1: 50, 2: 0}, positions={}, committed={0: 50, 1: 20})
    assert waiting(parts, consumer, [A, B, ("in", 2)]) == {A: False, B: True, ("in", 2): False}
    assert consumer.committed_asked == [0, 1, 2]


def test_committed_offsets_held_by_an_open_transaction_count_as_records_waiting(parts: Parts) -> None:
    consumer = OffsetsConsumer(ends={0: 50, 1: 0}, positions={}, committed_error=True)
    assert waiting(parts, consumer, [A, B]) == {A: True, B: False}


def test_with_auto_offset_reset_latest_an_uncommitted_partition_is_not_judged(parts: Parts) -> None:
    parts.config["auto.offset.reset"] = "latest"
    assert waiting(parts, OffsetsConsumer(ends={0: 50}, positions={}), [A]) == {}


def test_end_offsets_that_cannot_be_read_leave_the_partitions_unjudged(parts: Parts) -> None:
    consumer = OffsetsConsumer(ends={1: 50}, positions={1: 10})
    assert waiting(parts, consumer, [A, B]) == {B: True}


def test_the_end_offset_of_the_last_fetch_counts_when_listoffsets_answers_less(parts: Parts) -> None:
    # Tansu answers ListOffsets(latest) wrongly (1 for a 1,449-record partition); its fetches carry the truth.
    consumer = OffsetsConsumer(ends={0: 1, 1: 1}, positions={0: 700, 1: 1449})
    consumer.fetched = {0: 1449, 1: 1449}
    assert waiting(parts, consumer, [A, B]) == {A: True, B: False}


def test_a_partition_read_up_to_a_transaction_left_open_is_waiting_and_the_warning_says_why(
        parts: Parts, caplog: pytest.LogCaptureFixture) -> None:
    # An upstream producer began a transaction at offset 30 and never ended it: ListOffsets (read_committed) answers
    # the last stable offset, 30; the fetches carry the high watermark, 80. The worker took and committed all to 30.
    consumer = OffsetsConsumer(ends={0: 30, 1: 50}, positions={0: 30, 1: 20})
    consumer.fetched = {0: 80, 1: 50}
    parts.ledger.start_at(A, 30)
    check = stall_check(parts, consumer)
    parts.tracker.assign([A, B])
    assert check.records_waiting([A, B]) == {A: True, B: True}
    assert check.held == {A: (30, 80)}, "partition 1 is behind, not held"
    note = check._held_note([A, B])
    assert note.startswith("; in[0] at 30 (50 records past it): a transaction its producer has neither committed")
    assert "in[1]" not in note and check._held_note([B]) == ""
    consumer.ends[0] = 80  # the transaction ended: nothing held
    assert check.records_waiting([A]) == {A: True} and check.held == {}


def test_tansus_wrong_listoffsets_answer_is_not_taken_for_a_transaction_left_open(parts: Parts) -> None:
    consumer = OffsetsConsumer(ends={0: 1}, positions={0: 700})
    consumer.fetched = {0: 1449}
    check = stall_check(parts, consumer)
    parts.tracker.assign([A])
    assert check.records_waiting([A]) == {A: True} and check.held == {}
