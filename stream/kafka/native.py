"""Predictions produced and acknowledged in C, and input records consumed in C: the optional extensions
``stream.kafka._nativeproduce`` (``NativeProducer``) and ``stream.kafka._nativeconsume`` (``NativeInput``, at the
end of this module), both binding to librdkafka through ``stream/kafka/_rdkafka.h``.

Why: through confluent-kafka every prediction costs a ``produce()`` call and, when the broker acknowledges it, a
``Message`` object and a Python callback, each with the GIL held on the processing thread (measured: 3.8-3.9 µs
of process CPU a record, value slicing included, against 1.6-1.8 µs in C; 2 M records to a local Kafka, three
interleaved runs). The extension enqueues a whole batch from the encoder's joined buffer with one
``rd_kafka_produce_batch()`` call (GIL released) and counts delivery reports per *slot* (one span of input
records) in C; Python learns only which slots completed and which records failed.

It binds to the librdkafka that confluent-kafka already loaded (looked up in ``/proc/self/maps``, else the
wheel's bundled copy), so both clients run the same library. Without a C compiler at install time, on a
platform without ``/proc``, or with a librdkafka that lacks a symbol, ``unavailable()`` says why and the
worker publishes through confluent-kafka as before.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping
from typing import Any

import confluent_kafka
import numpy as np

from stream.kafka.records import Records
from stream.kafka.replies import ADDRESS_HEADERS

try:
    from stream.kafka import _nativeconsume, _nativeproduce
except ImportError as exc:  # not compiled (optional extensions)
    _nativeproduce = _nativeconsume = None  # type: ignore[assignment]
    _IMPORT_ERROR: str | None = f"the C extensions are not built ({exc})"
else:
    _IMPORT_ERROR = None

_load_error: str | None = None
_loaded = False


def _librdkafka_path() -> str | None:
    """The librdkafka confluent-kafka runs on: the one mapped into this process, else the wheel's copy."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(maxsplit=5)[-1].strip()
                if "librdkafka" in os.path.basename(path) and os.path.exists(path):
                    return path
    except OSError:
        pass
    libs = os.path.join(os.path.dirname(os.path.dirname(confluent_kafka.__file__)), "confluent_kafka.libs")
    found = sorted(glob.glob(os.path.join(libs, "librdkafka*.so*")))
    return found[0] if found else None


def unavailable() -> str | None:
    """Why the native producer and consumer cannot be used here, or None when they can (loads the binding once)."""
    global _load_error, _loaded
    if _IMPORT_ERROR is not None:
        return _IMPORT_ERROR
    if not _loaded and _load_error is None:
        path = _librdkafka_path()
        if path is None:
            _load_error = "librdkafka not found"
        else:
            try:
                assert _nativeproduce is not None and _nativeconsume is not None
                _nativeproduce.load(path)
                _nativeconsume.load(path)
                _loaded = True
            except ImportError as exc:
                _load_error = str(exc)
    return _load_error


def _conf_str(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class NativeProducer:
    """One topic's records, produced in batches; delivery counted per slot.

    ``produce`` takes slot ids chosen by the caller; a slot completes (is returned by ``poll``/``flush``/
    ``take_done``) once every record given to it so far is acknowledged. A failed record never counts, so its
    slot never completes: the caller reads failures with ``failures()``. Methods are not for concurrent use
    from several threads, except ``abort`` and ``close``, which a shutting-down thread may call while another
    is blocked in ``produce`` waiting for queue space."""

    def __init__(self, config: Mapping[str, Any], topic: str, slots: int = 1 << 16) -> None:
        reason = unavailable()
        if reason is not None:
            raise RuntimeError(f"native producer unavailable: {reason}")
        callables = sorted(k for k, v in config.items() if callable(v))
        if callables:
            raise ValueError(f"native producer takes no callbacks in its config: {callables}")
        self.topic = topic
        self.slots = slots
        assert _nativeproduce is not None
        self._producer = _nativeproduce.Producer(
            {k: _conf_str(v) for k, v in config.items()}, topic, slots)

    def produce(self, values: bytes, ends: np.ndarray, keys: list[bytes | None], slots: np.ndarray,
                headers: dict[int, list[tuple[str, bytes]]] | None = None) -> int:
        """Enqueue records ``values[ends[i-1]:ends[i]]`` in order (``headers``: {row: its headers} of the rows
        that carry any: each of those goes on its own, librdkafka's batch call taking no headers); returns how
        many were enqueued (all of them unless ``abort`` was called while the local queue was full)."""
        return int(self._producer.produce(values, np.ascontiguousarray(ends, dtype=np.int64),
                                          keys, np.ascontiguousarray(slots, dtype=np.int32), headers))

    def poll(self, timeout_s: float) -> np.ndarray:
        return np.frombuffer(self._producer.poll(timeout_s), dtype=np.int32)

    def flush(self, timeout_s: float) -> np.ndarray:
        """Have librdkafka send what is queued now (not after linger.ms) and serve reports for up to
        ``timeout_s`` or until everything is settled; returns the slots completed meanwhile."""
        return np.frombuffer(self._producer.flush(timeout_s), dtype=np.int32)

    def take_done(self) -> np.ndarray:
        return np.frombuffer(self._producer.take_done(), dtype=np.int32)

    def failures(self) -> tuple[list[tuple[int, int, str]], int, str | None]:
        """(up to 64 of the failed records since the last call as (slot, error code, text), how many failed in
        all, the fatal error if the producer hit one)."""
        listed, total, fatal = self._producer.failures()
        return listed, int(total), fatal

    def __len__(self) -> int:
        return int(self._producer.outq_len())

    def abort(self) -> None:
        self._producer.abort()

    def close(self, timeout_s: float) -> int:
        """Flush for up to ``timeout_s``, then release the client; returns how many records are undelivered."""
        return int(self._producer.close(timeout_s))


def produce_into(producer: confluent_kafka.Producer, topic: str, values: bytes | memoryview, ends: np.ndarray,
                 keys: list[bytes | None]) -> tuple[int, int]:
    """Enqueue records ``values[ends[i-1]:ends[i]]`` on a confluent-kafka producer's own handle, in C, with no
    delivery callback (exactly-once: its transaction's commit acknowledges them). Returns (records enqueued,
    librdkafka's error code for the first one refused, 0 when none was)."""
    if not isinstance(producer, confluent_kafka.Producer):
        raise TypeError(f"a confluent_kafka.Producer is needed, got {type(producer).__name__}")
    assert _nativeproduce is not None
    enqueued, error = _nativeproduce.produce_into(producer, topic, values,  # type: ignore[arg-type]
                                                  np.ascontiguousarray(ends, dtype=np.int64), keys)
    return int(enqueued), int(error)


class NativeInput:
    """Input records of a ``confluent_kafka.Consumer``'s subscription, taken in C as ``Records``.

    Why: ``Consumer.consume()`` builds a ``Message`` per record (with the GIL held: its topic, key and value
    objects), which the worker then takes apart again. Here the input partitions' fetch queues are forwarded to
    a queue of this object's (``route``, called in ``on_assign`` before the partitions are assigned), and
    ``consume`` copies what it takes into one buffer. The consumer keeps everything else: the group protocol,
    commits, pause, seek and its callbacks, which its own ``consume()`` serves; ``consume`` here returns early and
    says ``pending`` when the consumer's queue has something for it. ``close`` must come before the consumer's."""

    def __init__(self, consumer: confluent_kafka.Consumer, topic: str,
                 watched: tuple[str, ...] = ADDRESS_HEADERS) -> None:
        """``watched``: the header names whose values each record's `Records.replies` entry holds."""
        reason = unavailable()
        if reason is not None:
            raise RuntimeError(f"native consumer unavailable: {reason}")
        if not isinstance(consumer, confluent_kafka.Consumer):
            raise TypeError(f"a confluent_kafka.Consumer is needed, got {type(consumer).__name__}")
        assert _nativeconsume is not None
        self.topic = topic
        self._queue = _nativeconsume.Queue(consumer, topic, watched)
        self._closed = False

    def route(self, partitions: list[int]) -> None:
        """Forward these partitions' records here; call it in ``on_assign``. A no-op once closed (the consumer's
        own ``close()`` may still assign what a rebalance in progress handed it)."""
        if not self._closed:
            self._queue.route(partitions)

    def consume(self, n: int, timeout_s: float, first: bool = False
                ) -> tuple[Records, list[tuple[int, int, int, str]], bool]:
        """(up to ``n`` records, error events among them as (partition, offset, code, text), whether the
        consumer's own queue has something to serve). ``first``: ``timeout_s`` is a wait for the first record;
        the others are those already fetched then (no wait for ``n``)."""
        values, starts, lengths, keys, partitions, offsets, errors, pending, replies, sizes = self._queue.consume(
            n, timeout_s, first)
        records = Records(values, np.frombuffer(starts, dtype=np.int64), np.frombuffer(lengths, dtype=np.int64),
                          keys, np.frombuffer(partitions, dtype=np.int32), np.frombuffer(offsets, dtype=np.int64),
                          replies, None if sizes is None else np.frombuffer(sizes, dtype=np.int64))
        return records, errors, pending

    def pending(self) -> bool:
        return bool(self._queue.pending())

    def wake(self) -> None:
        self._queue.wake()

    def close(self) -> None:
        self._closed = True
        self._queue.close()
