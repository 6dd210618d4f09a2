"""The producer side: produce predictions, turn delivery reports into offset acknowledgements.

Delivery callbacks run on the thread that serves the producer: the processor thread, which serves it right
after producing each batch (`send_now`), while it waits for the next batch (`serve`) and while the local queue
is full (`produce_many`); after it has stopped, `close`. One thread at a time (a lock), so span counters are
written by one thread. No thread of its own: librdkafka takes the GIL once per delivery report, and a thread
that only serves reports took it thousands of times per batch from the processor (measured: 2 M-event Kafka
drains 251-262 k -> 269-288 k events/s, three interleaved pairs). A failed delivery is recorded, never
acknowledged: the span it belongs to can never complete, so no offset at or after it is committed; the worker
raises the recorded error.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from stream.config import WorkerSettings
from stream.errors import PublishError, StreamError, TransactionError
from stream.kafka import native
from stream.kafka.client_logs import ConnectionWatch, client_logger
from stream.kafka.deadline import Deadline
from stream.kafka.delivery import SpanDelivery
from stream.kafka.guarded import GuardedCalls
from stream.kafka.native import NativeProducer

log = logging.getLogger(__name__)
SEND_OFFSETS_TIMEOUT_S = 20.0  # longest a transaction's send_offsets_to_transaction is given ...
SEND_OFFSETS_GRACE_S = 5.0  # ... and how long past that it may block before its producer is taken as stuck
ABORT_SLICE_S = 1.0  # an abort waits this long at a time, delivery reports served in between
MAX_STUCK_PRODUCERS = 3  # stuck producers whose calls never returned, before the worker gives up
# Fatal errors of the idempotence state (a sequence number the broker and librdkafka disagree on, after a request
# that may or may not have been written timed out): fatal to that producer, not to the transactional id. A fresh
# producer takes over, as from a stuck one. Fencing (a newer instance owns the id) and authorization stay fatal.
# INVALID_TXN_STATE too: the coordinator refused the abort after adding offsets had failed with
# CONCURRENT_TRANSACTIONS, both right after its node was thawed from a 20 s SIGSTOP (tests.chaos.cluster_command);
# the transaction was never committed, and a fresh producer's init aborts it.
REPLACEABLE_FATAL = frozenset({
    KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, KafkaError.DUPLICATE_SEQUENCE_NUMBER, KafkaError.UNKNOWN_PRODUCER_ID,
    KafkaError.INVALID_PRODUCER_ID_MAPPING, KafkaError._INCONSISTENT, KafkaError._GAPLESS_GUARANTEE,
    KafkaError.INVALID_TXN_STATE})
MAX_REPLACEMENTS = 3  # broken producers replaced within REPLACEMENT_WINDOW_S before the worker gives up
REPLACEMENT_WINDOW_S = 600.0
Headers = list[tuple[str, str | bytes | None]]
# Provenance headers: the input record a dead-letter record (always) or a prediction (--provenance-headers, or
# a prediction schema without the input_* fields) answers.
HEADER_TOPIC = "stream.input.topic"
HEADER_PARTITION = "stream.input.partition"
HEADER_OFFSET = "stream.input.offset"
# A dead-letter record's headers: where it failed and why (and its copy to a caller's reply address carries them).
DLQ_STAGE = "stream.dlq.stage"
DLQ_ERROR_CLASS = "stream.dlq.error.class"
DLQ_ERROR_REASON = "stream.dlq.error.reason"
DLQ_ERROR_MESSAGE = "stream.dlq.error.message"
DLQ_MODEL = "stream.dlq.model"
DLQ_VALUE_BYTES = "stream.dlq.value.bytes"


def native_topic(settings: WorkerSettings, carries_source: bool) -> str | None:
    """The output topic, when its predictions can go through the C producer (stream.kafka.native); logs the choice.
    ``carries_source``: the prediction schema has the input_* fields (else provenance goes in headers)."""
    if not settings.native_producer:
        why_not: str | None = "--no-native-producer"
    elif settings.provenance_headers or not carries_source:
        why_not = "provenance headers"
    else:
        why_not = native.unavailable()
    if why_not is not None:
        log.info("predictions published through confluent-kafka (native producer off: %s)", why_not)
        return None
    if settings.exactly_once:
        log.info("predictions enqueued in C on the transactional producer (stream.kafka._nativeproduce.produce_into)")
    else:
        log.info("predictions published through the native producer (stream.kafka._nativeproduce)")
    return settings.output_topic


def _failed_transaction() -> TransactionError:
    """librdkafka refuses records once the open transaction has failed (an abortable error reported by its
    broker thread: e.g. the sequence gap left by requests an abort purged, which needs the epoch bump an abort
    makes): abort it and rewind."""
    return TransactionError("produce", KafkaError(
        KafkaError._STATE, "the open transaction has failed and must be aborted", txn_requires_abort=True))


class Publisher:
    """Wraps the confluent-kafka Producer; callers serve its delivery reports (see the module's docstring).

    With ``native_topic``, records for that topic given to ``produce_joined`` go through C (stream.kafka.native): at
    least once, a second client that counts their delivery reports per span (one slot per span, completed slots
    settled here under the same lock as the confluent callbacks); in a transaction, the confluent-kafka
    producer's own handle, one librdkafka call per batch and no delivery callback (the commit acknowledges
    them). Dead letters and records with headers take the confluent-kafka producer's ``produce``."""

    def __init__(self, config: dict[str, Any], *, on_span_done: Callable[[SpanDelivery], None],
                 native_topic: str | None = None, connection: ConnectionWatch | None = None) -> None:
        self.transactional = "transactional.id" in config
        self._connection = connection
        self._config = {**config, "error_cb": self._on_client_error, "logger": client_logger("producer")}
        self._producer = Producer(self._config)
        self._in_transaction = False
        self._guard = GuardedCalls()
        self._abandoned: list[tuple[Producer, threading.Thread]] = []  # stuck producers, their calls still blocked
        self._broken: KafkaError | None = None  # a replaceable fatal error of the transactional producer
        self._replaced_at: list[float] = []  # when broken producers were replaced (monotonic)
        self._on_span_done = on_span_done
        self._failures: list[PublishError] = []
        self._lock = threading.Lock()
        self._serving = threading.Lock()  # delivery callbacks: one thread at a time
        self._closing = False
        self._native: NativeProducer | None = None
        self._native_open = False
        self._native_spans: dict[int, tuple[SpanDelivery, int]] = {}  # slot -> (its span's delivery, records)
        self._free_slots: list[int] = []
        # Exactly-once: the output topic whose records are enqueued in C on the transactional producer's handle.
        self._native_txn_topic = native_topic if self.transactional and native.unavailable() is None else None
        if native_topic is not None and not self.transactional:
            # Its librdkafka lines would go to stderr (a C client has no Python logger): only critical ones; the
            # other producer and the consumer, on the same brokers, report the rest through the worker's log.
            self._native = NativeProducer({"log_level": "2", **config}, native_topic)
            self._native_open = True
            self._free_slots = list(range(self._native.slots - 1, -1, -1))

    @property
    def native_topic(self) -> str | None:
        """The topic whose records ``produce_joined`` sends through the C client, if any."""
        return self._native.topic if self._native is not None else None

    def _note_broken(self, err: KafkaError) -> bool:
        """Remember a replaceable fatal error of the transactional producer (the first one): the processor
        replaces the producer at its next transactional step. False for any other error."""
        if not (self.transactional and err.fatal() and err.code() in REPLACEABLE_FATAL):
            return False
        if self._broken is None:
            self._broken = err
        return True

    def _on_client_error(self, err: KafkaError) -> None:
        if self._note_broken(err):
            log.error("transactional producer: %s (a fresh producer takes over)", err)
        elif err.fatal():
            self.record_failure(PublishError("producer", err), None)
        elif self._connection is None or not self._connection.error("producer", err):
            log.warning("producer: %s", err)

    def record_failure(self, error: PublishError, msg: Message | None) -> None:
        with self._lock:
            self._failures.append(error)
        if msg is not None:
            log.error("delivery to %s[%s] failed: %s", msg.topic(), msg.partition(), error)

    def span_done(self, delivery: SpanDelivery) -> None:
        self._on_span_done(delivery)

    def failure(self) -> PublishError | None:
        with self._lock:
            return self._failures[0] if self._failures else None

    # -- the processor thread ---------------------------------------------------------------------
    def produce_many(self, topic: str, values: Sequence[bytes | None], keys: Sequence[bytes | None],
                     headers: Sequence[Headers | None], callbacks: Sequence[SpanDelivery],
                     partitions: Sequence[int] | None = None) -> None:
        """Queue records for delivery (to ``partitions``, else where the partitioner puts them); when librdkafka's
        local queue is full, serves delivery reports (which free its space) until the record fits: that wait is
        the backpressure."""
        produce = self._producer.produce
        targets = partitions if partitions is not None else [-1] * len(values)
        for value, key, hdrs, callback, partition in zip(values, keys, headers, callbacks, targets, strict=True):
            while True:
                try:
                    # Positional: (topic, value, key, partition, callback, on_delivery, timestamp, headers);
                    # -1 lets the partitioner pick, 0 stamps the current time. Keyword parsing cost ~0.23 µs of
                    # the ~0.84 µs a call with three headers and a callback takes (measured against an
                    # unconnected producer).
                    produce(topic, value, key, partition, callback, None, 0, hdrs)
                    break
                except KafkaException as exc:
                    if self.transactional and exc.args and exc.args[0].code() == KafkaError._STATE:
                        raise _failed_transaction() from exc
                    if self.transactional and exc.args and exc.args[0].code() == KafkaError._FATAL:
                        self._serve(0.0)  # its error callback says which fatal error (`broken`)
                    raise
                except BufferError:
                    if self._closing:
                        raise PublishError("produce", "publisher closed while the local queue was full") from None
                    self._serve(0.001)

    def produce_joined(self, topic: str, values: bytes, ends: np.ndarray, keys: list[bytes | None],
                       row_partitions: np.ndarray, deliveries: Mapping[int, SpanDelivery],
                       headers: dict[int, list[tuple[str, bytes]]] | None = None) -> None:
        """Queue one record per row, ``values[ends[i-1]:ends[i]]``, for the span of its input partition, in row
        order; ``headers``: {row: its headers} of the rows that carry any (a trace context). Through the C client
        when ``topic`` is its topic, else split into values for ``produce_many`` (on the same client as the C
        call under exactly-once, so the order holds)."""
        if topic == self._native_txn_topic and not headers:
            self._produce_into(topic, values, ends, keys)
            return
        native = self._native
        if native is None or topic != native.topic:
            starts = np.concatenate(([0], ends[:-1])).tolist()
            split = [values[a:b] for a, b in zip(starts, ends.tolist(), strict=True)]
            given = headers or {}
            self.produce_many(topic, split, keys, [given.get(i) for i in range(len(split))],  # type: ignore[misc]
                              [deliveries[p] for p in row_partitions.tolist()])
            return
        if self._closing:
            raise PublishError("produce", "publisher closed")
        slots = np.empty(len(row_partitions), dtype=np.int32)
        with self._serving:  # slots are freed by whoever serves reports
            for p in np.unique(row_partitions).tolist():
                rows = row_partitions == p
                if not self._free_slots:
                    raise StreamError("native producer: no free delivery slot (too many spans in flight)")
                slot = self._free_slots.pop()
                self._native_spans[slot] = (deliveries[p], int(np.count_nonzero(rows)))
                slots[rows] = slot
        try:
            enqueued = native.produce(values, ends, keys, slots, headers or None)
        except RuntimeError as exc:  # closed meanwhile
            raise PublishError("produce", str(exc)) from exc
        if enqueued < len(slots):
            raise PublishError("produce", "publisher closed while the local queue was full")

    def _produce_into(self, topic: str, values: bytes, ends: np.ndarray, keys: list[bytes | None]) -> None:
        """Exactly-once: enqueue the records on the transactional producer's handle, in C; a full local queue is
        waited out by serving the producer (the backpressure), anything else librdkafka refuses fails the batch
        (and so its transaction)."""
        view, ends = memoryview(values), np.ascontiguousarray(ends, dtype=np.int64)
        at, n = 0, len(keys)
        while at < n:
            base = int(ends[at - 1]) if at else 0
            enqueued, code = native.produce_into(self._producer, topic, view[base:], ends[at:] - base,
                                                 keys[at:] if at else keys)
            at += enqueued
            if code == 0:
                break
            if code == KafkaError._STATE:
                raise _failed_transaction()
            if code == KafkaError._FATAL:
                self._serve(0.0)  # its error callback says which fatal error (`broken`)
            if code != KafkaError._QUEUE_FULL:
                raise PublishError("produce", KafkaError(code))
            if self._closing:
                raise PublishError("produce", "publisher closed while the local queue was full")
            self._serve(0.001)

    def _settle(self, done: np.ndarray) -> None:
        """Acknowledge the spans whose native records are all delivered; record native failures. Caller holds
        ``_serving``."""
        native = self._native
        assert native is not None
        for slot in done.tolist():
            delivery, count = self._native_spans.pop(slot)
            self._free_slots.append(slot)
            delivery.acknowledge(count)
        failed, total, fatal = native.failures()
        for _, code, text in failed:
            self.record_failure(PublishError("deliver prediction", KafkaError(code, text)), None)
            log.error("delivery to %s failed: %s", native.topic, text)
        if total > len(failed):
            log.error("%d more deliveries to %s failed", total - len(failed), native.topic)
        if fatal is not None:
            self.record_failure(PublishError("producer", KafkaError(KafkaError._FATAL, fatal, fatal=True)), None)

    def send_now(self, window_s: float = 0.0) -> None:
        """A burst of records is queued: serve the delivery reports that arrived, and have librdkafka send the
        burst without waiting out ``linger.ms`` (which still batches records produced one by one). flush()
        marks the producer as flushing while it runs and wakes the broker threads; a broker thread that wakes
        after it returned waits out the linger, so an idle caller gives it ``window_s`` (flush returns sooner
        once everything is delivered)."""
        if self.transactional:  # commit_transaction() flushes
            self._serve(0.0)
            return
        with self._serving:
            if self._native_open:
                assert self._native is not None
                # Dead letters and reply copies, if any: given the window too (a caller waits for a reply).
                self._producer.flush(window_s if len(self._producer) else 0.0)
                self._settle(self._native.flush(window_s))
            else:
                self._producer.flush(window_s)

    def serve(self) -> None:
        """Serve the delivery reports that arrived (the processor calls it while it waits for work)."""
        self._serve(0.0)

    def _serve(self, timeout_s: float) -> None:
        """Serve delivery reports and client errors. A transactional producer's fatal error also comes back from
        its poll, as a bare KafkaException: raised as the PublishError it is, librdkafka's error kept (so that an
        authorization error is named as the ACL to grant, whichever thread meets it first)."""
        with self._serving:
            try:
                if self._native_open:
                    assert self._native is not None
                    self._producer.poll(0.0)
                    self._settle(self._native.poll(timeout_s))
                else:
                    self._producer.poll(timeout_s)
            except KafkaException as exc:
                raise PublishError("producer", exc.args[0] if exc.args else exc) from exc

    # -- transactions (processor thread only) ---------------------------------------------------------
    def init_transactions(self, timeout_s: float) -> None:
        self._txn_call("init transactions", lambda left: self._producer.init_transactions(left), Deadline(timeout_s))

    def begin_transaction(self) -> None:
        self._txn_call("begin transaction", lambda _left: self._producer.begin_transaction(), Deadline(float("inf")))
        self._in_transaction = True

    def commit_transaction(self, offsets: list[TopicPartition], group_metadata: Any, timeout_s: float) -> None:
        """Add the input offsets to the open transaction and commit it (retriable errors are retried), all within
        ``timeout_s``. Adding the offsets runs on a guard thread: librdkafka's send_offsets_to_transaction can
        block past its timeout while the group coordinator moves (confluentinc/librdkafka#5456, #5511; seen
        here after a broker paused past its session). When it has not returned ``SEND_OFFSETS_GRACE_S`` after its
        timeout, a fresh producer with the same transactional id takes over (its init fences the stuck one and
        aborts its transaction) and the batch is aborted like any other: rewound and consumed again."""
        deadline = Deadline(timeout_s)
        producer = self._producer
        bound = min(deadline.left(), SEND_OFFSETS_TIMEOUT_S)

        def send_offsets() -> None:
            self._txn_call("send offsets to transaction",
                           lambda left: producer.send_offsets_to_transaction(offsets, group_metadata, left),
                           Deadline(bound))

        if not self._guard.run(send_offsets, bound + SEND_OFFSETS_GRACE_S):
            self._replace_stuck_producer(deadline)
            raise TransactionError("send offsets to transaction", KafkaError(
                KafkaError._TIMED_OUT, f"did not return {bound + SEND_OFFSETS_GRACE_S:.0f}s after it was called; "
                "a fresh transactional producer took over", txn_requires_abort=True), producer_replaced=True)
        self._txn_call("commit transaction", lambda left: self._producer.commit_transaction(left), deadline)
        self._in_transaction = False

    def abort_transaction(self, timeout_s: float) -> None:
        """Abort the open transaction within ``timeout_s``. librdkafka's abort waits until the delivery reports of
        the transaction's records are served ("the event queue must be polled ... prior to calling abort"), so
        it is called in slices with the reports served between them."""
        if not self._in_transaction:
            return  # a replaced producer: its successor has no transaction open
        deadline = Deadline(timeout_s)
        while True:
            self._serve(0.0)
            try:
                self._producer.abort_transaction(min(deadline.left(0.001), ABORT_SLICE_S))
                break
            except KafkaException as exc:
                error = TransactionError("abort transaction", exc.args[0])
                self._note_broken(exc.args[0])
                if error.fatal or error.code != KafkaError._TIMED_OUT or deadline.passed():
                    raise error from exc
        self._in_transaction = False

    def broken(self) -> KafkaError | None:
        """The replaceable fatal error the transactional producer is in (`REPLACEABLE_FATAL`), if any."""
        return self._broken

    def replace_broken_producer(self, timeout_s: float) -> None:
        """A fresh producer with the same transactional id takes over from one in a replaceable fatal state: its
        init fences the broken one and aborts whatever transaction it left open (the caller rewinds it). More
        than ``MAX_REPLACEMENTS`` within ``REPLACEMENT_WINDOW_S`` stop the worker (a fresh process starts clean)."""
        now = time.monotonic()
        self._replaced_at = [t for t in self._replaced_at if now - t < REPLACEMENT_WINDOW_S] + [now]
        if len(self._replaced_at) > MAX_REPLACEMENTS:
            raise StreamError(f"the transactional producer broke {len(self._replaced_at)} times within "
                              f"{REPLACEMENT_WINDOW_S:.0f}s (last: {self._broken}); stopping")
        log.error("the transactional producer is in a fatal state (%s); a fresh producer with the same "
                  "transactional id takes over and the open transaction's batches are consumed again", self._broken)
        with contextlib.suppress(KafkaException, RuntimeError):
            self._producer.purge()  # its records belong to the transaction the new producer's init aborts
        self._take_over(timeout_s)

    def _replace_stuck_producer(self, deadline: Deadline) -> None:
        self._abandoned = [(p, t) for p, t in self._abandoned if t.is_alive()]  # their calls returned at last
        stuck = self._guard.abandon()
        self._abandoned.append((self._producer, stuck))
        if len(self._abandoned) > MAX_STUCK_PRODUCERS:
            raise StreamError(f"{len(self._abandoned)} transactional producers stuck in send_offsets_to_transaction "
                              "at once; stopping (a fresh process starts clean)")
        log.error("send offsets to transaction did not return within its timeout (a librdkafka bug: "
                  "confluentinc/librdkafka#5456); a fresh transactional producer takes over and the batch is "
                  "consumed again")
        self._take_over(max(deadline.left(), SEND_OFFSETS_TIMEOUT_S))

    def _take_over(self, timeout_s: float) -> None:
        """A fresh producer with the same transactional id replaces the current one; its init fences the old one
        and aborts the transaction that one left open."""
        with self._serving:
            self._producer = Producer(self._config)
            self._in_transaction = False
            self._broken = None
        self.init_transactions(timeout_s)

    def _txn_call(self, operation: str, call: Callable[[float], object], deadline: Deadline,
                  attempts: int = 3) -> None:
        """``call(seconds_left)``; retriable errors are retried while attempts and ``deadline`` last."""
        for attempt in range(1, attempts + 1):
            try:
                call(deadline.left(0.001))
                return
            except KafkaException as exc:
                error = TransactionError(operation, exc.args[0])
                self._note_broken(exc.args[0])
                if (not error.retriable or error.fatal or error.requires_abort or attempt == attempts
                        or deadline.passed()):
                    raise error from exc
                log.warning("%s: retriable error, retrying: %s", operation, exc)

    def close(self, timeout_s: float) -> int:
        """Flush what is queued, serving its delivery reports; returns how many records are still undelivered."""
        self._closing = True
        deadline = Deadline(timeout_s)
        if self._native is not None:
            self._native.abort()  # a produce_joined waiting for queue space returns now
        with self._serving:
            undelivered = 0
            if self._native_open:
                assert self._native is not None
                self._native_open = False
                undelivered += self._native.close(timeout_s)
                self._settle(self._native.take_done())
            try:
                return undelivered + int(self._producer.flush(deadline.left()))
            except KafkaException as exc:  # a transactional producer in a fatal state refuses even to flush
                log.debug("producer flush at close: %s", exc)
                return undelivered + len(self._producer)
