"""Exactly-once: Kafka transactions spanning one or more micro-batches, and the rewind after an aborted one.

On the finish stage's thread (`process`, then `commit`):
1. begin a transaction if none is open; 2. wait for the batch's model outputs (decoded, prepared and submitted by
   the stages before), produce its predictions and dead letters in it; 3. while more batches are in the stages
   and the transaction is younger than the transaction interval (100 ms by default, like Kafka Streams' commit
   interval under exactly-once), the next batch joins it
   if it was consumed under the same group metadata (generation and member; a batch of a newer generation has
   the open transaction committed first, under its own); 4. otherwise add the input offsets of all its batches
   (``send_offsets_to_transaction`` with that group metadata) and commit; the spans are acknowledged at once,
   the commit having delivered them all. A finish thread with no batch behind the last one in the stages commits
   at once, so a transaction never waits for input and a revoke or a shutdown (which wait for in-flight
   records) is never held by one; with batches behind it, it waits for the next one as the single processing
   thread once did while it decoded and ran it. It never commits while it waits: a commit from an idle finish
   thread sent offsets while the brokers were down, where librdkafka's ``send_offsets_to_transaction`` can block
   past its timeout (confluentinc/librdkafka#5456; it failed the short broker-fault chaos test). A batch
   consumed while the consumer was out of its group (no generation or no member id: see `is_member`) is never
   produced or committed: its epoch is rewound.
An abortable error aborts the transaction and marks the epoch its batches were consumed in as rewound: the
stages drop every batch of that epoch (`stale`), and the poll thread (`rewind`) drops what it holds and
seeks every assigned partition back to its committed offset, starting the next epoch. A fatal error of the
producer's idempotence state (`publish.REPLACEABLE_FATAL`) has a fresh producer take over and is rewound the same
way; any other fatal error (fenced: a zombie) stops the worker. A transaction aborted after outliving
``transaction.timeout.ms`` stops it too: rewinding would replay the same batches into the same timeout forever.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from stream.errors import StreamError, TransactionError, coordinator_away
from stream.kafka.delivery import SpanDelivery
from stream.kafka.offsets import OffsetTracker, fmt_partitions
from stream.kafka.publish import Publisher
from stream.kafka.records import Records
from stream.ops.metrics import StreamMetrics
from stream.pipeline import faults
from stream.pipeline.batching import MicroBatcher
from stream.pipeline.processing import BatchProcessor, Begun

log = logging.getLogger(__name__)
_NOT_FETCHING = frozenset({KafkaError._STATE, KafkaError._PREV_IN_PROGRESS})  # what seek() says of such a partition
_REWIND_QUERY_TIMEOUT_S = 2.0  # longest wait for committed offsets before trying again
_CGMD_MAGIC = b"CGMDv2:"  # librdkafka's serialised consumer group metadata (rd_kafka_consumer_group_metadata_write)


def group_membership(metadata: object) -> tuple[int, str] | None:
    """The (generation, member id) in the consumer group metadata confluent-kafka hands out: librdkafka's
    serialised form, "CGMDv2:", the generation as a native int32, then the NUL-terminated group id and member id.
    None for anything else (a layout this code does not know)."""
    if not isinstance(metadata, bytes) or not metadata.startswith(_CGMD_MAGIC):
        return None
    at = len(_CGMD_MAGIC)
    if len(metadata) < at + 4:
        return None
    (generation,) = struct.unpack_from("=i", metadata, at)
    fields = metadata[at + 4:].split(b"\0", 2)
    if len(fields) < 3:
        return None
    return generation, fields[1].decode("utf-8", "replace")


def is_member(metadata: object) -> bool:
    """The metadata names a generation and a member. A consumer the group has evicted (a session timed out: a
    frozen process, a cut network, a paused broker) lacks the member id (librdkafka clears it at once, before the
    application is told the partitions are lost), and one whose join failed with ILLEGAL_GENERATION lacks the
    generation. Kafka accepts a transactional offset commit that names neither, whatever the group's state (the
    check is skipped for transactional commits, to serve old clients): its batches would be committed while
    another member processes the same records. Either one missing is refused here. A layout this code does not
    know passes (the broker's own checks are all there is)."""
    membership = group_membership(metadata)
    return membership is None or (membership[0] >= 0 and membership[1] != "")


@dataclass
class _OpenTransaction:
    started: float
    epoch: int  # every batch of a transaction is of one epoch: a rewind follows only an abort
    offsets: dict[int, int] = field(default_factory=dict)  # input partition -> next offset
    deliveries: list[SpanDelivery] = field(default_factory=list)
    group_metadata: Any = None  # that of every batch of it: one group generation, one member
    batches: int = 0


class Transactions:
    """The epoch batches are consumed in, and the batch transactions. Without exactly-once the epoch stays 0 and
    nothing is ever rewound."""

    def __init__(self, metrics: StreamMetrics, input_topic: str, timeout_s: float,
                 clock: Callable[[], float] = time.monotonic, interval_s: float = 0.1) -> None:
        self.timeout_s = timeout_s  # transaction.timeout.ms
        self.interval_s = interval_s  # queued batches join an open transaction this long (0: one batch each)
        self._open: _OpenTransaction | None = None  # the processor thread's, only
        self.committed = 0  # transactions committed
        self.epoch = 0  # bumped by each rewind
        self.rewind_after: int | None = None  # the epoch whose batches the processor abandoned
        self._rewind_warned: int | None = None  # the pending rewind whose slow offset read was logged
        self._metrics = metrics
        self._input_topic = input_topic
        self._clock = clock

    def pending(self) -> bool:
        """An aborted transaction's batches are abandoned: nothing of theirs will be acknowledged."""
        return self.rewind_after is not None and self.rewind_after >= self.epoch

    def stale(self, epoch: int) -> bool:
        """A batch consumed before a rewind: it will be consumed again."""
        return self.rewind_after is not None and epoch <= self.rewind_after

    # -- processor thread -----------------------------------------------------------------------------------
    def is_open(self) -> bool:
        """A transaction holds produced batches not committed yet."""
        return self._open is not None

    def due(self) -> bool:
        """The open transaction has lasted the transaction interval: commit it before another batch joins."""
        return self._open is not None and self._clock() - self._open.started >= self.interval_s

    def process(self, begun: Begun, processor: BatchProcessor, publisher: Publisher) -> None:
        """Produce the batch's outputs inside the open transaction, beginning one if none is open. Call `commit`
        when no batch follows at once or when `due`."""
        batch = begun.batch
        txn = self._open
        if txn is not None and batch.group_metadata != txn.group_metadata:
            # The group moved on since the open transaction's batches were consumed: they are committed under
            # their own generation (refused if it is over), never under this batch's, which the broker would
            # accept for partitions this member no longer holds.
            self.commit(publisher)
            txn = None
            if self.stale(batch.epoch):
                return  # that commit was aborted: this batch is rewound with it
        if not is_member(batch.group_metadata):
            log.warning("a batch was consumed while this consumer was out of its group (evicted or rejoining): "
                        "not committed; rewinding to the last committed offsets")
            self.rewind_after = batch.epoch
            return
        if txn is None:
            if publisher.broken() is not None:  # it broke after its last transaction ended: nothing to rewind
                publisher.replace_broken_producer(self.timeout_s)
            publisher.begin_transaction()
            txn = self._open = _OpenTransaction(self._clock(), batch.epoch, group_metadata=batch.group_metadata)
        try:
            processor.complete(begun)
            faults.reach("after-produce")
        except TransactionError as exc:
            if self._replaced_broken(publisher, txn.epoch):
                return
            if exc.fatal or not exc.requires_abort:
                self.abort(publisher)
                raise
            self._open = None
            self._abort_and_rewind(publisher, txn.epoch, exc)
            return
        except BaseException:
            if self._replaced_broken(publisher, txn.epoch):
                return
            self.abort(publisher)
            raise
        for partition, delivery in batch.deliveries.items():
            txn.offsets[partition] = delivery.span.last + 1  # batches of a partition come in offset order
            txn.deliveries.append(delivery)
        txn.batches += 1

    def commit(self, publisher: Publisher) -> None:
        """Add the open transaction's input offsets to it and commit it; on an abortable error abort it and mark
        its epoch for the rewind."""
        txn, self._open = self._open, None
        if txn is None:
            return
        timeout_s = self.timeout_s
        try:
            offsets = [TopicPartition(self._input_topic, p, offset) for p, offset in txn.offsets.items()]
            faults.reach("in-transaction")
            committing = self._clock()
            publisher.commit_transaction(offsets, txn.group_metadata, timeout_s)
            self._metrics.commit_seconds.labels("transaction").observe(self._clock() - committing)
        except TransactionError as exc:
            elapsed = self._clock() - txn.started
            if exc.producer_replaced:  # a stuck call: its producer fenced, its transaction aborted by that
                self._metrics.transactions_aborted.inc()
                self.rewind_after = txn.epoch
                return
            if self._replaced_broken(publisher, txn.epoch):
                return
            if elapsed >= timeout_s:
                raise StreamError(
                    f"a transaction took {elapsed:.1f}s, longer than transaction.timeout.ms "
                    f"({timeout_s:.0f}s), and was aborted ({exc}); raise KAFKA_PRODUCER_TRANSACTION_TIMEOUT_MS "
                    "or lower --max-batch-size") from exc
            # Adding the offsets can time out while the coordinator moves (a broker killed or paused, this
            # process frozen): nothing is committed yet, so the transaction is aborted and its batches rewound
            # like any abortable error. A commit that timed out is not aborted: it may have committed.
            timed_out_before_commit = exc.operation == "send offsets to transaction" and exc.retriable
            if exc.fatal or not (exc.requires_abort or timed_out_before_commit):
                raise
            self._abort_and_rewind(publisher, txn.epoch, exc)
            return
        except BaseException:
            with contextlib.suppress(TransactionError):
                publisher.abort_transaction(timeout_s)
            raise
        self.committed += 1
        self._metrics.transaction_batches.observe(txn.batches)
        elapsed = self._clock() - txn.started
        if elapsed > timeout_s / 2:
            log.warning("a transaction took %.1fs, over half of transaction.timeout.ms (%.0fs): "
                        "raise it or lower --max-batch-size", elapsed, timeout_s)
        for delivery in txn.deliveries:
            delivery.acknowledge_all()

    def _abort_and_rewind(self, publisher: Publisher, epoch: int, error: TransactionError) -> None:
        """An abortable error: abort the transaction and have the batches of ``epoch`` consumed again."""
        log.warning("transaction aborted, rewinding to the last committed offsets: %s", error)
        try:
            publisher.abort_transaction(self.timeout_s)
        except TransactionError:
            if not self._replaced_broken(publisher, epoch):
                raise
            return
        self._metrics.transactions_aborted.inc()
        self.rewind_after = epoch

    def _replaced_broken(self, publisher: Publisher, epoch: int) -> bool:
        """The producer is in a replaceable fatal state (`Publisher.broken`): a fresh one takes over, its init
        aborting the open transaction, whose epoch is rewound. False when the producer is not broken so."""
        if publisher.broken() is None:
            return False
        self._open = None
        publisher.replace_broken_producer(self.timeout_s)
        self._metrics.transactions_aborted.inc()
        self.rewind_after = epoch
        return True

    def abort(self, publisher: Publisher) -> None:
        """Abort the open transaction, if any, without a rewind: the worker is failing."""
        if self._open is not None:
            self._open = None
            with contextlib.suppress(TransactionError):
                publisher.abort_transaction(self.timeout_s)

    # -- poll thread ----------------------------------------------------------------------------------------
    def rewind(self, consumer: Consumer, batcher: MicroBatcher[Records], tracker: OffsetTracker) -> None:
        """Drop everything consumed since the last commit and seek every assigned partition back to its
        committed offset. Stays pending, to be tried again by the next loop, while those offsets cannot be read."""
        assert self.rewind_after is not None
        assignment = consumer.assignment()
        try:
            committed = consumer.committed(assignment, timeout=_REWIND_QUERY_TIMEOUT_S)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not coordinator_away(error):
                raise
            # The coordinator did not answer in time (a stalled process, a slow broker) or is moving (a broker
            # killed or restarted): what is consumed meanwhile belongs to the aborted epoch and is dropped by the
            # processor.
            if self._rewind_warned != self.rewind_after:
                self._rewind_warned = self.rewind_after
                log.warning("rewind: committed offsets not read yet (%s); trying again (the group coordinator is "
                            "moving, or an open transaction of the partitions' previous owner holds them until it "
                            "ends or times out)", error)
            return
        unread = [tp for tp in committed if tp.error is not None]
        if unread:
            log.warning("rewind: committed offsets of %s not read (%s); trying again",
                        fmt_partitions([(tp.topic, tp.partition) for tp in unread]), unread[0].error)
            return
        self.epoch = self.rewind_after + 1
        batcher.take()
        tps = [(tp.topic, tp.partition) for tp in assignment]
        tracker.forget(tps)
        tracker.assign(tps)
        idle = []
        for tp in committed:
            try:
                consumer.seek(TopicPartition(tp.topic, tp.partition,
                                             tp.offset if tp.offset >= 0 else OFFSET_BEGINNING))
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if not isinstance(error, KafkaError) or error.code() not in _NOT_FETCHING:
                    raise
                # Assigned, and not fetching yet: librdkafka is still reading its committed offset (an open
                # transaction of its previous owner can hold that read for a while), or it is being revoked.
                # Nothing was taken from it, and it will start at its committed offset: nothing to rewind.
                idle.append((tp.topic, tp.partition))
        log.info("rewound %s to the committed offsets (epoch %d)%s", fmt_partitions(tps), self.epoch,
                 f"; not fetching yet, left to start there: {fmt_partitions(idle)}" if idle else "")

