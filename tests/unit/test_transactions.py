"""Exactly-once rewinds against a fake consumer, and the epochs that decide which batches are dropped."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from stream.batching import MicroBatcher
from stream.errors import TransactionError
from stream.metrics import StreamMetrics
from stream.offsets import OffsetTracker
from stream.processing import Dispatched
from stream.records import Records
from stream.transactions import Transactions

TOPIC = "in"


class RewindConsumer:
    """committed() times out ``timeouts`` times, then answers offset 7 for every partition; seek() fails with
    ``seek_errors[partition]`` where given."""

    def __init__(self, timeouts: int, partitions: int = 1, seek_errors: dict[int, int] | None = None) -> None:
        self.timeouts = timeouts
        self.partitions = partitions
        self.seek_errors = seek_errors or {}
        self.seeks: list[tuple[str, int, int]] = []

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(TOPIC, p) for p in range(self.partitions)]

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        if self.timeouts:
            self.timeouts -= 1
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        return [TopicPartition(tp.topic, tp.partition, 7) for tp in partitions]

    def seek(self, tp: TopicPartition) -> None:
        if tp.partition in self.seek_errors:
            raise KafkaException(KafkaError(self.seek_errors[tp.partition]))
        self.seeks.append((tp.topic, tp.partition, tp.offset))


def aborted(partitions: int = 1) -> tuple[Transactions, MicroBatcher[Records], OffsetTracker]:
    """A transaction of epoch 0 was aborted; the open batch holds a record consumed in it."""
    txns = Transactions(StreamMetrics(), TOPIC, 60.0)
    batcher: MicroBatcher[Records] = MicroBatcher(10, 1000.0, lambda: 0.0, size=len)
    batcher.add([Records.build([b"x"], [None], [0], [3])])
    tracker = OffsetTracker()
    tracker.assign([(TOPIC, p) for p in range(partitions)])
    tracker.dispatch((TOPIC, 0), 0, 2, 3)
    txns.rewind_after = txns.epoch
    return txns, batcher, tracker


def test_without_an_abort_nothing_is_pending_or_stale() -> None:
    txns = Transactions(StreamMetrics(), TOPIC, 60.0)
    assert not txns.pending() and not txns.stale(0)


def test_a_rewind_drops_the_aborted_epoch_and_seeks_to_the_committed_offsets() -> None:
    txns, batcher, tracker = aborted()
    assert txns.pending() and txns.stale(0)
    consumer = RewindConsumer(timeouts=0)
    txns.rewind(consumer, batcher, tracker)  # type: ignore[arg-type]
    assert not txns.pending() and txns.epoch == 1 and not txns.stale(1) and txns.stale(0)
    assert consumer.seeks == [(TOPIC, 0, 7)] and len(batcher) == 0 and tracker.in_flight() == 0


def test_a_rewind_whose_committed_offsets_time_out_stays_pending_and_is_tried_again() -> None:
    """A coordinator that does not answer in time (seen when a replica was frozen mid-call) must not fail the
    worker; the rewind is retried by the next loop."""
    txns, batcher, tracker = aborted()
    consumer = RewindConsumer(timeouts=1)
    txns.rewind(consumer, batcher, tracker)  # type: ignore[arg-type]
    assert txns.pending() and consumer.seeks == [] and len(batcher) == 1
    txns.rewind(consumer, batcher, tracker)  # type: ignore[arg-type]
    assert not txns.pending() and consumer.seeks == [(TOPIC, 0, 7)]


def test_a_rewind_leaves_partitions_that_are_not_fetching_yet_to_start_at_their_committed_offset() -> None:
    """librdkafka refuses to seek a partition whose fetch has not started (its committed offset is still being
    read, e.g. held by a frozen replica's open transaction): _STATE. Nothing was taken from it, so there is
    nothing to rewind; the worker must not fail (seen in a freeze/thaw run: exit 1)."""
    txns, batcher, tracker = aborted(partitions=3)
    consumer = RewindConsumer(timeouts=0, partitions=3,
                              seek_errors={1: KafkaError._STATE, 2: KafkaError._PREV_IN_PROGRESS})
    txns.rewind(consumer, batcher, tracker)  # type: ignore[arg-type]
    assert not txns.pending() and consumer.seeks == [(TOPIC, 0, 7)]


def test_a_rewind_fails_the_worker_on_any_other_seek_error() -> None:
    txns, batcher, tracker = aborted()
    consumer = RewindConsumer(timeouts=0, seek_errors={0: KafkaError._UNKNOWN_PARTITION})
    with pytest.raises(KafkaException):
        txns.rewind(consumer, batcher, tracker)  # type: ignore[arg-type]


class ReplacingPublisher:
    """Its send_offsets was stuck and a fresh producer took over (`Publisher.commit_transaction`)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def commit_transaction(self, offsets: object, metadata: object, timeout_s: float) -> None:
        raise TransactionError("send offsets to transaction", KafkaError(
            KafkaError._TIMED_OUT, "stuck", txn_requires_abort=True), producer_replaced=True)

    def abort_transaction(self, timeout_s: float) -> None:
        self.calls.append("abort")


def test_a_batch_whose_producer_was_replaced_is_rewound_not_fatal_however_long_it_took() -> None:
    clock = iter([0.0, 90.0, 90.0])  # the stuck call outlived transaction.timeout.ms (60 s)
    metrics = StreamMetrics()
    txns = Transactions(metrics, TOPIC, 60.0, clock=lambda: next(clock))
    batch = Dispatched(Records.build([b"x"], [None], [0], [3]), np.zeros(1, np.int32), np.full(1, 3), {}, epoch=0)
    publisher = ReplacingPublisher()
    processor = SimpleNamespace(process=lambda b: None)
    txns.process(batch, processor, publisher)  # type: ignore[arg-type]
    assert txns.pending() and txns.stale(0)
    assert publisher.calls == ["begin"], "the fenced transaction is not aborted again"
    assert metrics.transactions_aborted._value.get() == 1


class TimingOutPublisher(ReplacingPublisher):
    """``operation`` times out (a retriable error, not one librdkafka marks abortable)."""

    def __init__(self, operation: str) -> None:
        super().__init__()
        self.operation = operation

    def commit_transaction(self, offsets: object, metadata: object, timeout_s: float) -> None:
        raise TransactionError(self.operation, KafkaError(KafkaError._TIMED_OUT, "timed out", retriable=True))


def test_offsets_that_time_out_abort_and_rewind_but_a_commit_that_times_out_stops_the_worker() -> None:
    batch = Dispatched(Records.build([b"x"], [None], [0], [3]), np.zeros(1, np.int32), np.full(1, 3), {}, epoch=0)
    processor = SimpleNamespace(process=lambda b: None)
    txns = Transactions(StreamMetrics(), TOPIC, 60.0, clock=lambda: 0.0)
    publisher = TimingOutPublisher("send offsets to transaction")
    txns.process(batch, processor, publisher)  # type: ignore[arg-type]
    assert txns.pending() and publisher.calls == ["begin", "abort"], "nothing committed yet: aborted, rewound"
    txns = Transactions(StreamMetrics(), TOPIC, 60.0, clock=lambda: 0.0)
    publisher = TimingOutPublisher("commit transaction")
    with pytest.raises(TransactionError):  # it may have committed: aborting could not undo that
        txns.process(batch, processor, publisher)  # type: ignore[arg-type]
    assert not txns.pending()
