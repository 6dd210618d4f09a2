"""Exactly-once rewinds against a fake consumer, and the epochs that decide which batches are dropped."""

from __future__ import annotations

import struct
import threading
from types import SimpleNamespace

import numpy as np
import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from stream.errors import TransactionError
from stream.kafka.deadline import Deadline
from stream.kafka.delivery import SpanDelivery
from stream.kafka.offsets import OffsetTracker
from stream.kafka.records import Records
from stream.ops.metrics import StreamMetrics
from stream.pipeline.batching import MicroBatcher
from stream.pipeline.processing import Begun, Dispatched
from stream.pipeline.stage import ProcessingStages
from stream.pipeline.transactions import Transactions, group_membership, is_member

TOPIC = "in"


def cgmd(generation: int, member: str, group: str = "grp") -> bytes:
    """Consumer group metadata as confluent-kafka hands it out (librdkafka's serialised form; the layout of
    bytes read from a real consumer: "CGMDv2:", native int32 generation, group id, member id, a flag byte)."""
    return b"CGMDv2:" + struct.pack("=i", generation) + group.encode() + b"\0" + member.encode() + b"\0\x01"


def test_group_membership_reads_the_generation_and_member_of_librdkafkas_metadata() -> None:
    # As read from a consumer of a local Kafka: joined at generation 3, and before joining.
    joined = b"CGMDv2:\x03\x00\x00\x00grp-abc\x00rdkafka-7920b5d0-e646-48ac-af66-60427c827f88\x00\x01"
    unjoined = b"CGMDv2:\xff\xff\xff\xffgrp-abc\x00\x00\x01"
    assert group_membership(joined) == (3, "rdkafka-7920b5d0-e646-48ac-af66-60427c827f88")
    assert group_membership(unjoined) == (-1, "")
    assert is_member(joined) and not is_member(unjoined)
    assert not is_member(cgmd(5, "")) and not is_member(cgmd(-1, "m")), "both are needed"
    for unknown in (b"CGMDv3:\x01\x00\x00\x00g\x00m\x00", b"CGMDv2:\x01", b"CGMDv2:\x01\x00\x00\x00g", None, "x"):
        assert group_membership(unknown) is None
        assert is_member(unknown), "a layout it does not know is left to the broker"


class RewindConsumer:
    """committed() times out ``timeouts`` times, then answers offset 7 for every partition; seek() fails with
    ``seek_errors[partition]`` where given."""

    def __init__(self, timeouts: int, partitions: int = 1, seek_errors: dict[int, int] | None = None,
                 error: int = KafkaError._TIMED_OUT) -> None:
        self.timeouts = timeouts
        self.error = error
        self.partitions = partitions
        self.seek_errors = seek_errors or {}
        self.seeks: list[tuple[str, int, int]] = []

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(TOPIC, p) for p in range(self.partitions)]

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        if self.timeouts:
            self.timeouts -= 1
            raise KafkaException(KafkaError(self.error))
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


@pytest.mark.parametrize("error", [KafkaError._TIMED_OUT, KafkaError.NOT_COORDINATOR,
                                   KafkaError.COORDINATOR_LOAD_IN_PROGRESS])
def test_a_rewind_whose_committed_offsets_time_out_stays_pending_and_is_tried_again(error: int) -> None:
    """A coordinator that does not answer in time (seen when a replica was frozen mid-call) or has moved (seen in
    the long chaos run after a broker restart: NOT_COORDINATOR) must not fail the worker; the rewind is retried by
    the next loop."""
    txns, batcher, tracker = aborted()
    consumer = RewindConsumer(timeouts=1, error=error)
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

    def broken(self) -> KafkaError | None:
        return None


def test_a_batch_whose_producer_was_replaced_is_rewound_not_fatal_however_long_it_took() -> None:
    clock = iter([0.0, 90.0, 90.0])  # the stuck call outlived transaction.timeout.ms (60 s)
    metrics = StreamMetrics()
    txns = Transactions(metrics, TOPIC, 60.0, clock=lambda: next(clock))
    batch = Dispatched(Records.build([b"x"], [None], [0], [3]), np.zeros(1, np.int32), np.full(1, 3), {}, epoch=0)
    publisher = ReplacingPublisher()
    processor = SimpleNamespace(complete=lambda b: None)
    txns.process(staged(batch), processor, publisher)  # type: ignore[arg-type]
    txns.commit(publisher)  # type: ignore[arg-type]
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
    processor = SimpleNamespace(complete=lambda b: None)
    txns = Transactions(StreamMetrics(), TOPIC, 60.0, clock=lambda: 0.0)
    publisher = TimingOutPublisher("send offsets to transaction")
    txns.process(staged(batch), processor, publisher)  # type: ignore[arg-type]
    txns.commit(publisher)  # type: ignore[arg-type]
    assert txns.pending() and publisher.calls == ["begin", "abort"], "nothing committed yet: aborted, rewound"
    txns = Transactions(StreamMetrics(), TOPIC, 60.0, clock=lambda: 0.0)
    publisher = TimingOutPublisher("commit transaction")
    txns.process(staged(batch), processor, publisher)  # type: ignore[arg-type]
    with pytest.raises(TransactionError):  # it may have committed: aborting could not undo that
        txns.commit(publisher)  # type: ignore[arg-type]
    assert not txns.pending()


class TxnPublisher:
    """A transactional publisher that records its calls and the offsets each commit carried."""

    transactional = True

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.committed: list[list[tuple[str, int, int]]] = []

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def commit_transaction(self, offsets: list[TopicPartition], metadata: object, timeout_s: float) -> None:
        self.calls.append("commit")
        self.committed.append([(tp.topic, tp.partition, tp.offset) for tp in offsets])

    def abort_transaction(self, timeout_s: float) -> None:
        self.calls.append("abort")

    def broken(self) -> KafkaError | None:
        return None

    def span_done(self, delivery: SpanDelivery) -> None:
        pass

    def serve(self) -> None:
        pass

    def send_now(self, window_s: float = 0.0) -> None:
        pass


def staged(batch: Dispatched) -> Begun:
    """The batch as the stages hand it to Transactions.process (a fake processor's ``complete`` takes it)."""
    return Begun(batch, None, {}, [], None)  # type: ignore[arg-type]


def span_batch(tracker: OffsetTracker, publisher: TxnPublisher, spans: dict[int, tuple[int, int]],
               metadata: object = None) -> Dispatched:
    """A batch holding records ``first..last`` of each partition in ``spans``."""
    deliveries = {p: SpanDelivery(publisher, tracker.dispatch((TOPIC, p), first, last, last - first + 1))  # type: ignore[arg-type]
                  for p, (first, last) in spans.items()}
    n = sum(last - first + 1 for first, last in spans.values())
    return Dispatched(Records.build([b"x"] * n, [None] * n, [0] * n, range(n)), np.zeros(n, np.int32),
                      np.zeros(n, np.int64), deliveries, group_metadata=metadata)


def test_batches_that_join_a_transaction_commit_together_and_only_its_commit_acknowledges_them() -> None:
    metrics = StreamMetrics()
    txns = Transactions(metrics, TOPIC, 60.0, clock=lambda: 0.0, interval_s=0.1)
    tracker = OffsetTracker()
    tracker.assign([(TOPIC, 0), (TOPIC, 1)])
    publisher = TxnPublisher()
    processor = SimpleNamespace(complete=lambda b: None)
    for spans in ({0: (0, 4)}, {0: (5, 9), 1: (0, 2)}, {1: (3, 3)}):
        txns.process(staged(span_batch(tracker, publisher, spans, cgmd(1, "m"))), processor, publisher)  # type: ignore[arg-type]
    assert txns.is_open() and not txns.due() and publisher.calls == ["begin"]
    assert tracker.committable() == {}, "nothing acknowledged before the commit"
    txns.commit(publisher)  # type: ignore[arg-type]
    assert publisher.calls == ["begin", "commit"] and not txns.is_open()
    assert publisher.committed == [[(TOPIC, 0, 10), (TOPIC, 1, 4)]], "each partition's next offset, once"
    assert tracker.committable() == {(TOPIC, 0): 10, (TOPIC, 1): 4}
    assert metrics.transaction_batches._sum.get() == 3


def test_a_batch_of_a_new_generation_has_the_open_transaction_committed_under_its_own_first() -> None:
    txns = Transactions(StreamMetrics(), TOPIC, 60.0, clock=lambda: 0.0, interval_s=60.0)
    tracker = OffsetTracker()
    tracker.assign([(TOPIC, 0), (TOPIC, 1)])
    metadata: list[object] = []

    class Recording(TxnPublisher):
        def commit_transaction(self, offsets: list[TopicPartition], md: object, timeout_s: float) -> None:
            metadata.append(md)
            super().commit_transaction(offsets, md, timeout_s)

    publisher = Recording()
    processor = SimpleNamespace(complete=lambda b: None)
    txns.process(staged(span_batch(tracker, publisher, {1: (0, 4)}, cgmd(1, "m"))), processor, publisher)  # type: ignore[arg-type]
    txns.process(staged(span_batch(tracker, publisher, {0: (0, 2)}, cgmd(3, "m"))), processor, publisher)  # type: ignore[arg-type]
    assert publisher.calls == ["begin", "commit", "begin"], "partition 1 is not committed under generation 3"
    assert publisher.committed == [[(TOPIC, 1, 5)]] and metadata == [cgmd(1, "m")]
    txns.commit(publisher)  # type: ignore[arg-type]
    assert publisher.committed[1] == [(TOPIC, 0, 3)] and metadata[1] == cgmd(3, "m")


def test_a_batch_consumed_out_of_the_group_is_rewound_never_produced_or_committed() -> None:
    txns = Transactions(StreamMetrics(), TOPIC, 60.0, clock=lambda: 0.0, interval_s=60.0)
    tracker = OffsetTracker()
    tracker.assign([(TOPIC, 0)])
    publisher = TxnPublisher()
    processed: list[int] = []
    processor = SimpleNamespace(complete=lambda b: processed.append(len(b.batch.records)))
    txns.process(staged(span_batch(tracker, publisher, {0: (0, 1)}, cgmd(2, "m"))), processor, publisher)  # type: ignore[arg-type]
    # Evicted (a session timed out): librdkafka's metadata has no generation and no member until it rejoins.
    txns.process(staged(span_batch(tracker, publisher, {0: (2, 4)}, cgmd(-1, ""))), processor, publisher)  # type: ignore[arg-type]
    assert processed == [2], "the evicted batch never reached the model or the producer"
    assert publisher.calls == ["begin", "commit"] and publisher.committed == [[(TOPIC, 0, 2)]]
    assert txns.pending() and txns.stale(0) and not txns.is_open()
    assert tracker.committable() == {(TOPIC, 0): 2}


class BreakingPublisher(TxnPublisher):
    """Its commit fails with a fatal error of the idempotence state, as librdkafka's sequence desync does."""

    def __init__(self) -> None:
        super().__init__()
        self.broken_by: KafkaError | None = None

    def broken(self) -> KafkaError | None:
        return self.broken_by

    def replace_broken_producer(self, timeout_s: float) -> None:
        self.calls.append("replace")
        self.broken_by = None

    def commit_transaction(self, offsets: list[TopicPartition], metadata: object, timeout_s: float) -> None:
        if self.calls.count("begin") == 1:
            self.broken_by = KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "desync", fatal=True)
            raise TransactionError("send offsets to transaction", self.broken_by)
        super().commit_transaction(offsets, metadata, timeout_s)


def test_a_producer_broken_by_a_fatal_idempotence_error_is_replaced_and_its_transaction_rewound() -> None:
    txns = Transactions(StreamMetrics(), TOPIC, 60.0, clock=lambda: 0.0)
    tracker = OffsetTracker()
    tracker.assign([(TOPIC, 0)])
    publisher = BreakingPublisher()
    processor = SimpleNamespace(complete=lambda b: None)
    txns.process(staged(span_batch(tracker, publisher, {0: (0, 1)})), processor, publisher)  # type: ignore[arg-type]
    txns.commit(publisher)  # type: ignore[arg-type]
    assert publisher.calls == ["begin", "replace"] and txns.pending() and txns.stale(0)
    assert tracker.committable() == {}
    # Broken while idle (its error callback said so): replaced before the next transaction begins, no rewind.
    publisher.broken_by = KafkaError(KafkaError.UNKNOWN_PRODUCER_ID, "idle", fatal=True)
    txns.epoch = 1  # rewound, as the poll thread's rewind does
    tracker.forget([(TOPIC, 0)])
    tracker.assign([(TOPIC, 0)])
    txns.process(staged(span_batch(tracker, publisher, {0: (0, 1)})), processor, publisher)  # type: ignore[arg-type]
    assert publisher.calls == ["begin", "replace", "replace", "begin"] and txns.is_open()


def test_a_transaction_is_due_after_its_interval_and_interval_zero_is_one_batch_each() -> None:
    now = [0.0]
    txns = Transactions(StreamMetrics(), TOPIC, 60.0, clock=lambda: now[0], interval_s=0.1)
    tracker = OffsetTracker()
    tracker.assign([(TOPIC, 0)])
    publisher = TxnPublisher()
    processor = SimpleNamespace(complete=lambda b: None)
    assert not txns.due(), "nothing open: nothing due"
    txns.process(staged(span_batch(tracker, publisher, {0: (0, 1)})), processor, publisher)  # type: ignore[arg-type]
    now[0] = 0.099
    assert not txns.due()
    now[0] = 0.1
    assert txns.due()
    once = Transactions(StreamMetrics(), TOPIC, 60.0, clock=lambda: 0.0, interval_s=0.0)
    once.process(staged(span_batch(tracker, publisher, {0: (2, 3)})), processor, publisher)  # type: ignore[arg-type]
    assert once.due()


def test_a_batch_that_fails_aborts_the_whole_open_transaction_and_acknowledges_none_of_it() -> None:
    txns = Transactions(StreamMetrics(), TOPIC, 60.0, clock=lambda: 0.0)
    tracker = OffsetTracker()
    tracker.assign([(TOPIC, 0)])
    publisher = TxnPublisher()

    def process(begun: Begun) -> None:
        if len(begun.batch.records) == 3:
            raise RuntimeError("model failed")

    processor = SimpleNamespace(complete=process)
    txns.process(staged(span_batch(tracker, publisher, {0: (0, 1)})), processor, publisher)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError):
        txns.process(staged(span_batch(tracker, publisher, {0: (2, 4)})), processor, publisher)  # type: ignore[arg-type]
    assert publisher.calls == ["begin", "abort"] and not txns.is_open()
    assert tracker.committable() == {}
    txns.commit(publisher)  # type: ignore[arg-type]
    assert publisher.calls == ["begin", "abort"], "nothing left to commit"


def test_an_aborted_commit_marks_the_transactions_epoch_for_the_rewind() -> None:
    class Abortable(TxnPublisher):
        def commit_transaction(self, offsets: list[TopicPartition], metadata: object, timeout_s: float) -> None:
            raise TransactionError("commit transaction", KafkaError(
                KafkaError._TIMED_OUT, "abortable", txn_requires_abort=True))

    txns = Transactions(StreamMetrics(), TOPIC, 60.0, clock=lambda: 0.0)
    tracker = OffsetTracker()
    tracker.assign([(TOPIC, 0)])
    publisher = Abortable()
    processor = SimpleNamespace(complete=lambda b: None)
    for spans in ({0: (0, 1)}, {0: (2, 3)}):
        txns.process(staged(span_batch(tracker, publisher, spans)), processor, publisher)  # type: ignore[arg-type]
    txns.commit(publisher)  # type: ignore[arg-type]
    assert publisher.calls == ["begin", "abort"] and txns.pending() and txns.stale(0)
    assert tracker.committable() == {}


def eos_stage(txns: Transactions, publisher: TxnPublisher, processed: list[int], failures: list[BaseException],
              inflight: int) -> ProcessingStages:
    processor = SimpleNamespace(prepare=staged, submit=lambda b: b, engine=None,
                                complete=lambda b: processed.append(len(b.batch.records)))
    return ProcessingStages(processor, publisher, txns, max_inflight_batches=inflight,  # type: ignore[arg-type]
                            prepare_threads=2, torch_threads=1, overlap=True, exactly_once=True,
                            fail=failures.append, failed=lambda: bool(failures))


@pytest.mark.parametrize(("interval_s", "transactions"), [(60.0, 1), (0.0, 3)])
def test_the_stage_joins_queued_batches_into_one_transaction_up_to_the_interval(interval_s: float,
                                                                                 transactions: int) -> None:
    txns = Transactions(StreamMetrics(), TOPIC, 120.0, interval_s=interval_s)
    tracker = OffsetTracker()
    tracker.assign([(TOPIC, 0)])
    publisher, processed, failures = TxnPublisher(), [], []  # type: ignore[var-annotated]
    stage = eos_stage(txns, publisher, processed, failures, inflight=3)
    for first in (0, 2, 4):
        batch = span_batch(tracker, publisher, {0: (first, first + 1)})
        assert stage.offer(lambda b=batch: b, 0)  # type: ignore[misc]
    stage.start()
    stage.finish(Deadline(30.0))
    assert not failures and processed == [2, 2, 2]
    assert publisher.calls == ["begin", "commit"] * transactions
    assert publisher.committed[-1] == [(TOPIC, 0, 6)] and tracker.committable() == {(TOPIC, 0): 6}


def test_a_stage_with_nothing_queued_commits_its_transaction_at_once() -> None:
    """A lone batch is never held open waiting for another (a revoke or a shutdown waits for its records)."""
    txns = Transactions(StreamMetrics(), TOPIC, 120.0, interval_s=60.0)
    tracker = OffsetTracker()
    tracker.assign([(TOPIC, 0)])
    publisher, processed, failures = TxnPublisher(), [], []  # type: ignore[var-annotated]
    stage = eos_stage(txns, publisher, processed, failures, inflight=2)
    stage.start()
    try:
        batch = span_batch(tracker, publisher, {0: (0, 4)})
        assert stage.offer(lambda: batch, 0)
        deadline, acknowledged = Deadline(5.0), {}
        while not acknowledged and not deadline.passed():
            threading.Event().wait(0.005)
            acknowledged = tracker.committable()
        assert acknowledged == {(TOPIC, 0): 5} and publisher.calls == ["begin", "commit"]
    finally:
        stage.finish(Deadline(10.0))


def test_a_failed_worker_aborts_the_open_transaction_instead_of_committing_it() -> None:
    txns = Transactions(StreamMetrics(), TOPIC, 120.0, interval_s=60.0)
    tracker = OffsetTracker()
    tracker.assign([(TOPIC, 0)])
    publisher, processed, failures = TxnPublisher(), [], []  # type: ignore[var-annotated]
    stage = eos_stage(txns, publisher, processed, failures, inflight=3)
    for first in (0, 2):
        batch = span_batch(tracker, publisher, {0: (first, first + 1)})
        assert stage.offer(lambda b=batch: b, 0)  # type: ignore[misc]
    # The first batch opens the transaction; the poll thread fails before the second is taken.
    original = txns.process

    def process_then_fail(begun: Begun, processor: object, pub: object) -> None:
        original(begun, processor, pub)  # type: ignore[arg-type]
        failures.append(RuntimeError("poll thread failed"))

    txns.process = process_then_fail  # type: ignore[method-assign]
    stage.start()
    stage.finish(Deadline(30.0))
    assert publisher.calls == ["begin", "abort"] and tracker.committable() == {}


def test_a_transaction_that_fails_while_producing_is_aborted_and_rewound_not_fatal() -> None:
    """librdkafka refuses records once the open transaction has failed (e.g. the sequence gap an earlier abort's
    purged requests leave): the publisher says so as an abortable TransactionError, and the batches are rewound."""
    from stream.kafka.publish import _failed_transaction

    metrics = StreamMetrics()
    txns = Transactions(metrics, TOPIC, 60.0, clock=lambda: 0.0)
    tracker = OffsetTracker()
    tracker.assign([(TOPIC, 0)])
    publisher = TxnPublisher()

    def process(begun: Begun) -> None:
        if len(begun.batch.records) == 3:
            raise _failed_transaction()

    processor = SimpleNamespace(complete=process)
    txns.process(staged(span_batch(tracker, publisher, {0: (0, 1)})), processor, publisher)  # type: ignore[arg-type]
    txns.process(staged(span_batch(tracker, publisher, {0: (2, 4)})), processor, publisher)  # type: ignore[arg-type]
    assert publisher.calls == ["begin", "abort"] and not txns.is_open()
    assert txns.pending() and txns.stale(0) and metrics.transactions_aborted._value.get() == 1
    assert tracker.committable() == {}


def test_an_idle_finish_thread_never_commits_while_a_batch_is_still_behind_it() -> None:
    """The transaction waits for the batch being prepared behind it, even past its interval: a commit from an idle
    finish thread sent offsets while the brokers were down, where librdkafka's send_offsets_to_transaction can
    block past its timeout (confluentinc/librdkafka#5456)."""
    txns = Transactions(StreamMetrics(), TOPIC, 120.0, interval_s=0.01)
    tracker = OffsetTracker()
    tracker.assign([(TOPIC, 0)])
    publisher, processed, failures = TxnPublisher(), [], []  # type: ignore[var-annotated]
    stage = eos_stage(txns, publisher, processed, failures, inflight=3)
    second_prepared = threading.Event()

    def prepare(batch: Dispatched) -> Begun:
        if len(batch.records) == 3:
            assert second_prepared.wait(10.0)
        return staged(batch)

    stage._processor.prepare = prepare  # type: ignore[attr-defined]
    first, second = span_batch(tracker, publisher, {0: (0, 1)}), span_batch(tracker, publisher, {0: (2, 4)})
    assert stage.offer(lambda: first, 0) and stage.offer(lambda: second, 0)
    stage.start()
    try:
        deadline = Deadline(10.0)
        while processed != [2] and not deadline.passed():
            threading.Event().wait(0.005)
        threading.Event().wait(0.1)  # ten intervals: the transaction is due
        assert processed == [2] and publisher.calls == ["begin"], "committed while the next batch was behind"
        second_prepared.set()
    finally:
        stage.finish(Deadline(10.0))
    assert processed == [2, 3] and publisher.calls == ["begin", "commit"] and not failures
    assert tracker.committable() == {(TOPIC, 0): 5}
