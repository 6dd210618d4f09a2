"""Record batches the consumer cannot read, and how the worker gets past one.

A producer can write a batch that librdkafka cannot decompress: its records decompress to more than
``receive.message.max.bytes`` (100 MB by default; 120 values of 900 KB of one character pack into a few KB of
zstd, well under the broker's ``max.message.bytes``), or its codec is one this build of librdkafka lacks.
librdkafka then reports ``_BAD_COMPRESSION`` at the batch's first offset and fetches the same batch again, for
ever: the partition goes no further, and a worker that stopped at the error stopped every replica in turn on the
same batch.

With a dead-letter topic the worker dead-letters each offset of such a batch (reason ``unreadable``: it cannot
know their contents) and reads on after it. librdkafka names the batch's first offset only, so `batch_end` finds
its last by asking a consumer of its own where fetching starts to return something else: at an offset inside the
batch the broker sends the whole batch again (the same error at the same first offset), past it the next batch.
Exponential, then binary search: about 2 log2(n) fetches for a batch of n records.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from stream.errors import StreamError

log = logging.getLogger(__name__)
UNREADABLE_CODES = frozenset({KafkaError._BAD_COMPRESSION})
PROBE_TIMEOUT_S = 5.0  # one fetch of the search: at most this long for an answer
# The whole search of one batch (200,000 records: about 36 fetches, 2.5-6.3 s four at once on 2 cores,
# docs/operations.md "Memory and logs")
SEARCH_TIMEOUT_S = 20.0
MEASURING_THREADS = 4  # batches measured at once (each with a consumer of its own), of as many partitions
# What the worker's warning and `stream read` say of such a batch
READ_WITH = ("a batch whose records decompress past receive.message.max.bytes can be read with a larger "
             "KAFKA_CONSUMER_RECEIVE_MESSAGE_MAX_BYTES")


def probe_config(consumer_config: Mapping[str, Any]) -> dict[str, Any]:
    """The worker's consumer settings (brokers, security, fetch sizes, isolation) for a consumer of its own that
    only assigns: no group callbacks, no commits, no statistics, end of partition reported."""
    conf = {k: v for k, v in consumer_config.items() if not callable(v)}
    conf.update({"group.id": f"unreadable-probe-{uuid.uuid4().hex[:12]}", "enable.auto.commit": False,
                 "enable.auto.offset.store": False, "enable.partition.eof": True, "statistics.interval.ms": 0,
                 "auto.offset.reset": "latest"})
    return conf


def batch_end(make_consumer: Callable[[], Consumer], topic: str, partition: int, base: int,
              timeout_s: float = SEARCH_TIMEOUT_S, probe_timeout_s: float = PROBE_TIMEOUT_S,
              clock: Callable[[], float] = time.monotonic, stop: threading.Event | None = None) -> int:
    """The last offset of the unreadable batch whose first offset is ``base`` (librdkafka's error names it).
    ``stop``: set, the search ends within a second (`StreamError`)."""
    deadline = clock() + timeout_s
    stop = stop or threading.Event()

    def probe(at: int) -> bool:
        left = deadline - clock()
        if left <= 0:
            raise StreamError(f"{topic}[{partition}]: the unreadable batch at {base} was not measured within "
                              f"{timeout_s:.0f} s")
        return _inside(consumer, topic, partition, base, at, min(probe_timeout_s, left), stop)

    consumer = make_consumer()
    try:
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=probe_timeout_s)
        inside, step = base, 1  # inside: an offset known to be in the batch
        past = high  # an offset known to be past it: its last offset is below the end of the partition
        while inside + step < past:  # exponential: most batches are small
            if not probe(inside + step):
                past = inside + step
                break
            inside, step = inside + step, step * 2
        while past - inside > 1:  # binary
            at = (inside + past) // 2
            if probe(at):
                inside = at
            else:
                past = at
        return inside
    finally:
        consumer.close()


def _inside(consumer: Consumer, topic: str, partition: int, base: int, at: int, timeout_s: float,
            stop: threading.Event) -> bool:
    """Whether fetching from ``at`` returns the unreadable batch that starts at ``base`` (else a readable record,
    another batch or the partition's end)."""
    consumer.assign([TopicPartition(topic, partition, at)])
    end = time.monotonic() + max(timeout_s, 0.0)
    while True:
        left = end - time.monotonic()
        if left <= 0:
            raise StreamError(f"{topic}[{partition}]: no answer fetching from {at} within {timeout_s:.1f} s while "
                              f"measuring the unreadable batch at {base}")
        if stop.is_set():
            raise StreamError(f"{topic}[{partition}]: measuring the unreadable batch at {base} stopped")
        msg = consumer.poll(min(left, 0.5))
        if msg is None or msg.partition() != partition:
            continue
        err = msg.error()
        if err is None:
            if msg.offset() is not None and msg.offset() >= at:  # type: ignore[operator]
                return False
            continue  # from before this assignment
        if err.code() == KafkaError._PARTITION_EOF:
            if (msg.offset() or 0) >= at:  # the end of the partition is past it
                return False
            continue  # from before this assignment
        if err.code() in UNREADABLE_CODES:
            return msg.offset() == base
        if err.fatal() or not err.retriable():
            raise StreamError(f"{topic}[{partition}]: fetching from {at} while measuring the unreadable batch at "
                              f"{base}: {err.str()}")
        log.debug("measuring the unreadable batch at %s[%d]@%d: %s", topic, partition, base, err.str())


def _timed(measure: Callable[..., int], *args: Any, **kwargs: Any) -> tuple[int, float]:
    started = time.monotonic()
    return measure(*args, **kwargs), time.monotonic() - started


class UnreadableBatches:
    """What the intake does with the unreadable batches it meets (`met`): each batch measured (`batch_end`) on a
    thread beside the poll thread (up to `MEASURING_THREADS` at once), which goes on with the other partitions;
    then its rows (`rows`), each an offset of the batch with no value (length `UNREADABLE`), which the decode stage
    dead-letters as ``unreadable``; once all are taken, the partition's fetching moves past the batch (``seek``).
    Without a dead-letter topic (``make_consumer`` None) the batch is not measured: its first offset alone is
    taken, which stops the worker on purpose as any bad record does then. ``wake``: called when a measurement ends (the
    intake's, so that a take waiting for records returns)."""

    def __init__(self, topic: str, make_consumer: Callable[[], Consumer] | None,
                 seek: Callable[[int, int], None]) -> None:
        self.topic = topic
        self.wake: Callable[[], None] = lambda: None
        self._make_consumer = make_consumer
        self._seek = seek
        self._pending: dict[int, list[int]] = {}  # partition: [next offset to take, last offset of the batch]
        # partition: ((its batch's last offset, seconds measuring it), to come; its first offset; librdkafka's words)
        self._measuring: dict[int, tuple[Future[tuple[int, float]], int, str]] = {}
        self._executor: ThreadPoolExecutor | None = None
        self._stop = threading.Event()
        # Without a dead-letter topic, partition: the batch whose first offset was taken (its fetching is not moved,
        # so librdkafka reports it again and again until the worker stops). With one, librdkafka drops the errors
        # fetched before the seek itself (their fetch version is outdated).
        self._stopping_at: dict[int, int] = {}

    @property
    def pending(self) -> bool:
        """Whether batches are being measured or have rows left to take."""
        return bool(self._pending or self._measuring)

    def met(self, partition: int, base: int, text: str) -> None:
        if partition in self._pending or partition in self._measuring or self._stopping_at.get(partition) == base:
            return  # librdkafka's fetcher meets the batch again until the seek (or the stop)
        if self._make_consumer is None:
            log.error("%s[%d]@%d: the consumer cannot read the record batch starting there (%s), and with no "
                      "--dlq-topic it is not skipped", self.topic, partition, base, text)
            self._pending[partition] = [base, base]
            self._stopping_at[partition] = base
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(MEASURING_THREADS, thread_name_prefix="unreadable-batch")
        future = self._executor.submit(_timed, batch_end, self._make_consumer, self.topic, partition, base,
                                       stop=self._stop)
        future.add_done_callback(lambda _: self.wake())
        self._measuring[partition] = (future, base, text)

    def rows(self, n: int) -> tuple[list[int], list[int]]:
        """Up to ``n`` rows of the batches measured: (their partitions, their offsets); a partition whose rows are
        all taken is moved past its batch. Raises `StreamError` where a batch could not be measured."""
        for partition, (future, base, text) in list(self._measuring.items()):
            if future.done():
                del self._measuring[partition]
                last, took_s = future.result()
                log.warning("%s[%d]@%d: the consumer cannot read the record batch at offsets %d-%d (%s): its %d "
                            "offsets are dead-lettered as unreadable and the partition is read on from %d "
                            "(measured in %.2f s); %s, and it stays in the input topic until its retention",
                            self.topic, partition, base, base, last, text, last - base + 1, last + 1, took_s,
                            READ_WITH)
                self._pending[partition] = [base, last]
        partitions: list[int] = []
        offsets: list[int] = []
        for partition, span in list(self._pending.items()):
            if len(offsets) >= n:
                break
            first, last = span
            upto = min(last, first + n - len(offsets) - 1)
            offsets += range(first, upto + 1)
            partitions += [partition] * (upto - first + 1)
            span[0] = upto + 1
            if upto == last:
                del self._pending[partition]
                if self._make_consumer is not None:
                    self._seek(partition, last + 1)
        return partitions, offsets

    def forget(self, partitions: Iterable[int] | None = None) -> None:
        """Partitions revoked (their next owner meets their batches again: nothing of them was committed), or None:
        every partition, rewound to its committed offset (an aborted transaction). A measurement under way ends
        unused."""
        for table in (self._pending, self._measuring, self._stopping_at):
            for partition in list(table) if partitions is None else partitions:
                table.pop(partition, None)

    def close(self) -> None:
        """Before the consumer's close: ends a measurement under way (within a second) and waits for it, so that
        its client does not outlive the process's end."""
        self._stop.set()
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
