"""Where input records come from: confluent-kafka's ``consume()``, or the C consumer (`stream.kafka.native.NativeInput`)
that takes them from a librdkafka queue the assigned partitions' fetch queues are forwarded to."""

from __future__ import annotations

import faulthandler
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from stream.config import WorkerSettings
from stream.errors import KafkaClientError, StreamError
from stream.kafka import native
from stream.kafka.records import MESSAGES_A_CONSUME, MessageRows, Records
from stream.kafka.replies import ADDRESS_HEADERS, watched_headers
from stream.kafka.unreadable import UNREADABLE_CODES, UnreadableBatches, probe_config

log = logging.getLogger(__name__)
_LEAVE_BOUND_S = 5.0  # `leave_group`: at most this long (or half the close's bound) before the close
_LEAVE_SERVE_S = 0.3  # and at least this long, for a rebalance already on its way
_HELD_GRACE_S = 10.0  # `close_within`: a close holding the interpreter ends the process this long after its bound
_SERVE_CONSUMER_S = 0.1  # native input: the consumer's own queue is served at least this often (and when it has ops)


class Intake:
    """Takes up to n records for the poll thread, serving the group (rebalances, commit results, errors) meanwhile."""

    def __init__(self, consumer: Consumer, source: native.NativeInput | None, clock: Callable[[], float],
                 watched: tuple[str, ...] = ADDRESS_HEADERS, unreadable: UnreadableBatches | None = None) -> None:
        self._consumer = consumer
        self._watched = watched
        self._source = source
        self._clock = clock
        self._serve_consumer_at = 0.0  # native input: when the consumer's own queue is next served
        self._unreadable = unreadable  # None: an unreadable batch fails the take (`consume_error`)
        if unreadable is not None:
            unreadable.wake = self.wake

    @classmethod
    def open(cls, consumer: Consumer, settings: WorkerSettings, clock: Callable[[], float],
             consumer_config: Mapping[str, Any]) -> Intake:
        """The C consumer when it can be used, else confluent-kafka's; logs the choice. ``consumer_config``: the
        consumer's settings, for the one that measures an unreadable batch (`stream.kafka.unreadable`)."""
        topic = settings.input_topic
        probe = probe_config(consumer_config)

        def seek(partition: int, offset: int) -> None:
            consumer.seek(TopicPartition(topic, partition, offset))

        unreadable = UnreadableBatches(topic, None if settings.dlq_topic is None else lambda: Consumer(probe), seek)
        why_not = "--no-native-consumer" if not settings.native_consumer else native.unavailable()
        watched = watched_headers(settings.copy_header_names)
        if why_not is None:
            try:
                source = native.NativeInput(consumer, topic, watched)
            except (RuntimeError, TypeError, ValueError) as exc:
                why_not = str(exc)
            else:
                log.info("input records taken through the native consumer (stream.kafka._nativeconsume)")
                return cls(consumer, source, clock, watched, unreadable)
        log.info("input records taken through confluent-kafka (native consumer off: %s)", why_not)
        return cls(consumer, None, clock, watched, unreadable)

    def route(self, tps: list[tuple[str, int]]) -> None:
        """Newly assigned partitions (from on_assign, before confluent-kafka assigns them): the input topic's
        records go to the C consumer's queue, none to the consumer's own."""
        if self._source is not None:
            self._source.route([p for t, p in tps if t == self._source.topic])

    def take(self, n: int, timeout_s: float, first: bool = False) -> Records:
        """Up to ``n`` consumed records, waiting up to ``timeout_s`` for them; serves the group meanwhile.
        ``first``: waiting up to ``timeout_s`` for the first record only, then taking what is already fetched,
        up to ``n`` in all: one batch's worth of a backlog in one `Records` (no copy to join it later)."""
        unreadable = self._unreadable
        if unreadable is not None and unreadable.pending:
            # the rows of a batch the consumer could not read first (once it is measured), then what is fetched
            pre = Records.unreadable(*unreadable.rows(n))
            if len(pre):
                return pre if len(pre) >= n else Records.concat([pre, self.take(n - len(pre), 0)])
        consumer = self._consumer
        source = self._source
        if source is None:
            return self._take_messages(n, timeout_s, first)
        now = self._clock()
        if now >= self._serve_consumer_at:
            # Rebalances (on_assign routes new partitions to the native queue before they are assigned),
            # commit results and client errors. Served before taking records, so records taken next are of
            # partitions assigned now.
            self._serve_consumer_at = now + _SERVE_CONSUMER_S
            if len(self._records_of(consumer.consume(100, 0))):
                raise StreamError("a record reached the consumer's own queue while the native consumer takes the "
                                  "input (a partition assigned without on_assign?)")
        records, errors, pending = source.consume(n, timeout_s, first)
        for partition, offset, code, text in errors:
            self._error(partition, offset, KafkaError(code, text))
        if pending:
            self._serve_consumer_at = 0.0  # at the next call
        return records

    @property
    def wakeable(self) -> bool:
        """Whether `wake` can cut a waiting `take` short (the C consumer's queue can; confluent-kafka's cannot)."""
        return self._source is not None

    def wake(self) -> None:
        """Make a `take` waiting now (or the next one) return at once; from any thread. A no-op unless
        `wakeable`."""
        source = self._source
        if source is not None:
            source.wake()

    def close(self) -> None:
        """Before the consumer's close, which destroys the client the C consumer uses."""
        if self._unreadable is not None:
            self._unreadable.close()
        if self._source is not None:
            self._source.close()
            self._source = None

    def _take_messages(self, n: int, timeout_s: float, first: bool) -> Records:
        """`take` through confluent-kafka's ``consume``, at most `MESSAGES_A_CONSUME` records a call, each call's
        Messages read and let go before the next (each holds its record's headers, parsed whole): ``consume(n,
        timeout_s)``, or with ``first`` ``consume(1, timeout_s)`` and then what is already fetched."""
        consumer = self._consumer
        rows = MessageRows(self._watched)
        deadline = self._clock() + timeout_s
        taken = 0
        want, wait = (1, timeout_s) if first else (min(n, MESSAGES_A_CONSUME), timeout_s)
        while True:
            messages = consumer.consume(want, wait)
            got = len(messages)
            self._add(rows, messages)
            taken += got
            if taken >= n or got < want:  # all of them, or none left within the wait
                return rows.records()
            want = min(n - taken, MESSAGES_A_CONSUME)
            wait = 0 if first else max(deadline - self._clock(), 0.0)

    def _add(self, rows: MessageRows, messages: list[Message]) -> None:
        good = []
        for msg in messages:
            err = msg.error()
            if err is None:
                good.append(msg)
            else:
                self._error(msg.partition(), msg.offset(), err)
        messages.clear()
        rows.add(good)

    def _error(self, partition: int | None, offset: int | None, err: KafkaError) -> None:
        """An error event of the consumer's: a batch it cannot read goes to `UnreadableBatches`, the rest to
        `consume_error`."""
        if (err.code() in UNREADABLE_CODES and self._unreadable is not None and partition is not None
                and partition >= 0 and offset is not None and offset >= 0):
            self._unreadable.met(partition, offset, err.str())
        else:
            consume_error(err)

    def forget(self, partitions: set[int] | None = None) -> None:
        """Revoked partitions (the batches met on them and not yet passed are their next owner's), or None: every
        partition, rewound to its committed offset (its batches are met again)."""
        if self._unreadable is not None:
            self._unreadable.forget(partitions)

    def _records_of(self, messages: list[Message]) -> Records:
        rows = MessageRows(self._watched)
        self._add(rows, messages)
        return rows.records()


def consume_error(err: KafkaError) -> None:
    """End of partition: nothing; fatal or not retriable: raise; else a warning."""
    if err.code() == KafkaError._PARTITION_EOF:
        return
    if err.fatal() or not err.retriable():
        raise KafkaClientError("consume", err)
    log.warning("consume: %s", err)


def leave_group(consumer: Consumer, bound_s: float) -> None:
    """Unsubscribe and serve the group's callbacks here, so that the close has no rebalance left to serve: within
    librdkafka's close, an assignment that arrives meanwhile (a --stop-at-end replica stopping while the group hands
    it the partitions of one that left) makes ``assign`` wait for ever (librdkafka #4884) inside confluent-kafka's
    rebalance callback, which holds the interpreter. Records polled here are dropped: nothing of theirs was
    committed."""
    end = time.monotonic() + bound_s
    try:
        consumer.unsubscribe()
        served_until = time.monotonic() + _LEAVE_SERVE_S
        while time.monotonic() < end and (consumer.assignment() or time.monotonic() < served_until):
            consumer.poll(0.05)
    except Exception as exc:  # a client already failed: the close below still runs
        log.debug("leaving the group before the close: %s", exc)


def close_within(consumer: Consumer, timeout_s: float) -> bool:
    """Leave the group (`leave_group`, then the close; a revoke callback then finds nothing left to do) within
    ``timeout_s``; False when the close did not return by then. librdkafka's close has no bound of its own; past
    the bound the caller goes on without it, and its process must end without running the client's destructor,
    which would wait for that close. Where the close holds the interpreter while it hangs, nothing in Python can
    run again: a watchdog outside the interpreter (`faulthandler`) then prints every thread's stack and ends the
    process (exit 1) ``_HELD_GRACE_S`` after the bound."""
    errors: list[BaseException] = []

    def close() -> None:
        try:
            consumer.close()
        except Exception as exc:  # confluent-kafka raises KafkaError itself here, not KafkaException
            errors.append(exc)

    started = time.monotonic()
    leave_group(consumer, min(_LEAVE_BOUND_S, timeout_s / 2))
    faulthandler.dump_traceback_later(timeout_s + _HELD_GRACE_S, exit=True)
    try:
        closing = threading.Thread(target=close, name="consumer-close", daemon=True)
        closing.start()
        closing.join(max(timeout_s - (time.monotonic() - started), 0.0))
    finally:
        faulthandler.cancel_dump_traceback_later()
    if closing.is_alive():
        log.warning("the consumer's close did not return within %.0f s; leaving the group to its session timeout",
                    timeout_s)
        return False
    if errors:
        log.warning("consumer close: %s", errors[0])
    return True
