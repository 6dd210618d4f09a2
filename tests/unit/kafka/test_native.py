"""The native producer (stream/kafka/_nativeproduce.c) without a broker: records to an unreachable address time out
in librdkafka and come back as failed delivery reports, enough to check failure accounting, the full-queue wait
and closing. Delivery to a real broker is in tests/integration/test_native.py."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from stream.errors import PublishError
from stream.kafka import native
from stream.kafka.delivery import SpanDelivery
from stream.kafka.native import NativeProducer
from stream.kafka.offsets import OffsetTracker
from stream.kafka.publish import Publisher

needs_native = pytest.mark.skipif(native.unavailable() is not None, reason=f"native producer: {native.unavailable()}")

UNREACHABLE = {"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": 200, "log_level": 0,
               "queue.buffering.max.messages": 4}


def joined(n: int) -> tuple[bytes, np.ndarray]:
    values = [b"value-%d" % i for i in range(n)]
    return b"".join(values), np.cumsum([len(v) for v in values]).astype(np.int64)


def deliveries(publisher: Publisher, n: int, partition: int = 0) -> dict[int, SpanDelivery]:
    tracker = OffsetTracker()
    tracker.assign([("in", partition)])
    return {partition: SpanDelivery(publisher, tracker.dispatch(("in", partition), 0, n - 1, n))}


def test_the_extension_is_built_where_ci_requires_it() -> None:
    """CI sets STREAM_REQUIRE_NATIVE=1: a lost compiler must fail the run, not skip the tests below."""
    if os.environ.get("STREAM_REQUIRE_NATIVE") == "1":
        assert native.unavailable() is None


@needs_native
def test_failed_records_are_reported_per_slot_and_never_complete_it() -> None:
    producer = NativeProducer(UNREACHABLE, "out", slots=8)
    values, ends = joined(3)
    assert producer.produce(values, ends, [b"k", None, b"k"], np.array([5, 5, 2], dtype=np.int32)) == 3
    deadline = time.monotonic() + 10
    failed: list[tuple[int, int, str]] = []
    total = 0
    while total < 3 and time.monotonic() < deadline:
        assert len(producer.poll(0.1)) == 0  # nothing is ever acknowledged
        listed, count, fatal = producer.failures()
        failed += listed
        total += count
        assert fatal is None
    assert sorted(slot for slot, _, _ in failed) == [2, 5, 5]
    assert all("timed out" in text.lower() for _, _, text in failed)
    assert producer.close(1.0) == 0
    assert producer.failures() == ([], 0, None)  # reported once


@needs_native
def test_bad_arguments_are_refused_before_anything_is_queued() -> None:
    producer = NativeProducer(UNREACHABLE, "out", slots=4)
    values, ends = joined(2)
    slots = np.zeros(2, dtype=np.int32)
    with pytest.raises(ValueError, match="one entry per record"):
        producer.produce(values, ends, [None], slots)
    with pytest.raises(ValueError, match="slots must be in range"):
        producer.produce(values, ends, [None, None], np.array([0, 4], dtype=np.int32))
    with pytest.raises(ValueError, match="past the values buffer"):
        producer.produce(values[:-1], ends, [None, None], slots)
    with pytest.raises(TypeError, match="bytes or None"):
        producer.produce(values, ends, [None, "key"], slots)  # type: ignore[list-item]
    for bad, error in (({2: []}, ValueError), ({0: [("a", "not bytes")]}, TypeError), ({0: "x"}, ValueError),
                       ({0: [("a",)]}, TypeError)):
        with pytest.raises(error):
            producer.produce(values, ends, [None, None], slots, bad)  # type: ignore[arg-type]
    producer.close(0.0)
    with pytest.raises(RuntimeError, match="closed"):
        producer.produce(values, ends, [None, None], slots)


@needs_native
def test_bad_configuration_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"No such configuration property: \"no.such.setting\""):
        NativeProducer({"no.such.setting": 1}, "out")
    with pytest.raises(ValueError, match="no callbacks"):
        NativeProducer({"error_cb": print}, "out")


@needs_native
def test_publisher_waits_out_a_full_queue_and_acknowledges_nothing_that_failed() -> None:
    """10 records through a queue of 4: the native produce call serves reports (here, timeouts) until each one
    fits; every failure is recorded by the Publisher, the span never completes."""
    done: list[SpanDelivery] = []
    publisher = Publisher(UNREACHABLE, on_span_done=done.append, native_topic="out")
    assert publisher.native_topic == "out"
    span = deliveries(publisher, 10)
    values, ends = joined(10)
    started = time.monotonic()
    publisher.produce_joined("out", values, ends, [None] * 10, np.zeros(10, dtype=np.int64), span)
    assert time.monotonic() - started >= 0.2  # the fifth record waited for the first ones to time out
    assert publisher.close(5.0) == 0
    assert isinstance(publisher.failure(), PublishError)
    assert "timed out" in str(publisher.failure()).lower()
    assert span[0].span.outstanding == 10 and done == []


@needs_native
def test_closing_from_another_thread_stops_a_native_produce_waiting_for_queue_space() -> None:
    publisher = Publisher({**UNREACHABLE, "message.timeout.ms": 60_000}, on_span_done=lambda d: None,
                          native_topic="out")
    values, ends = joined(4)
    publisher.produce_joined("out", values, ends, [None] * 4, np.zeros(4, dtype=np.int64),
                             deliveries(publisher, 4))  # fills the queue
    undelivered: list[int] = []
    closer = threading.Timer(0.2, lambda: undelivered.append(publisher.close(0.2)))
    closer.start()
    values, ends = joined(1)
    with pytest.raises(PublishError, match="closed while the local queue was full"):
        publisher.produce_joined("out", values, ends, [None], np.zeros(1, dtype=np.int64),
                                 deliveries(publisher, 1))
    closer.join()
    assert undelivered == [4]
    with pytest.raises(PublishError, match="closed"):
        publisher.produce_joined("out", values, ends, [None], np.zeros(1, dtype=np.int64),
                                 deliveries(publisher, 1))
    publisher.serve()  # after close: nothing to serve, no error


@needs_native
def test_records_for_another_topic_go_through_confluent_kafka() -> None:
    publisher = Publisher(UNREACHABLE, on_span_done=lambda d: None, native_topic="out")
    values, ends = joined(2)
    publisher.produce_joined("elsewhere", values, ends, [None, None], np.zeros(2, dtype=np.int64),
                             deliveries(publisher, 2))
    assert publisher._native_spans == {}  # no slot taken: nothing went through the C client
    assert len(publisher._producer) >= 2
    publisher.close(1.0)


@needs_native
def test_a_transactional_publisher_has_no_second_client_and_enqueues_on_its_own_handle() -> None:
    publisher = Publisher({**UNREACHABLE, "transactional.id": "t"}, on_span_done=lambda d: None,
                          native_topic="out")
    assert publisher.native_topic is None and publisher._native is None
    assert publisher._native_txn_topic == "out"


@needs_native
def test_load_generator_stops_when_failed_bursts_hold_every_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """A burst with a failed event never completes, so its delivery slot never frees: with every slot held by
    failed bursts the generator stops and reports, instead of waiting for a slot forever."""
    from producers import load

    monkeypatch.setattr(load, "_NATIVE_SLOTS", 2)
    config = {"message.timeout.ms": 200, "log_level": 0}
    summary = load.produce_events("127.0.0.1:1", "t", 5_000, config=config, native=True, timeout_s=2.0)
    assert summary.requested == 2 * 500 and summary.delivered == 0 and summary.failed == 1_000  # two bursts
    assert summary.first_error is not None and "timed out" in summary.first_error.lower()


@needs_native
def test_the_c_modules_take_only_open_clients_of_the_right_kind() -> None:
    """They read a client's librdkafka handle out of its object: only after checking its type (any object at
    least as big as a handle was read, and ``Queue(12345, 't')`` crashed), that it is open, and of the right
    kind; a queue whose consumer was closed first refuses to be used, and its close touches nothing."""
    import gc

    from confluent_kafka import Consumer, Producer

    from stream.kafka import _nativeconsume, _nativeproduce

    values, ends = joined(1)
    for bad in (12345, object(), "x" * 100, [None] * 10):
        with pytest.raises(TypeError, match=r"a confluent_kafka\.Consumer is needed"):
            _nativeconsume.Queue(bad, "t")
        with pytest.raises(TypeError, match=r"a confluent_kafka\.Producer is needed"):
            _nativeproduce.produce_into(bad, "t", values, ends, [None])
    consumer = Consumer({**UNREACHABLE, "group.id": "g"})
    producer = Producer(UNREACHABLE)
    try:
        with pytest.raises(TypeError, match=r"a confluent_kafka\.Producer is needed"):
            _nativeproduce.produce_into(consumer, "t", values, ends, [None])
        with pytest.raises(TypeError, match=r"a confluent_kafka\.Consumer is needed"):
            _nativeconsume.Queue(producer, "t")
        queue = _nativeconsume.Queue(consumer, "t")
        with pytest.raises(RuntimeError, match="already initialised"):
            queue.__init__(consumer, "t")  # type: ignore[misc]
        assert isinstance(queue.pending(), bool)
        # Tracked by the collector, with the consumer it holds: a cycle through it (an on_assign callback that
        # keeps the queue, held by the consumer) is collected.
        assert gc.is_tracked(queue) and consumer in gc.get_referents(queue)
    finally:
        producer.flush(0)
    queue.close()
    closed = _nativeconsume.Queue(consumer, "t")
    consumer.close()
    with pytest.raises(RuntimeError, match="closed before its native queue"):
        closed.consume(10, 0.0)
    with pytest.raises(RuntimeError, match="closed before its native queue"):
        closed.pending()
    closed.wake()
    closed.close()
    with pytest.raises(RuntimeError, match="the Consumer is closed"):
        _nativeconsume.Queue(consumer, "t")
    assert type(closed).__module__ == "stream.kafka._nativeconsume"


@needs_native
def test_timeouts_that_are_no_number_of_milliseconds_are_refused_or_clamped() -> None:
    """A float timeout was cast to an int as it was (undefined for a NaN, an infinity, or more than 24 days)."""
    from confluent_kafka import Consumer

    from stream.kafka import _nativeconsume, _nativeproduce

    producer = _nativeproduce.Producer({"bootstrap.servers": "127.0.0.1:1", "log_level": "0"}, "t", 4)
    with pytest.raises(ValueError, match="NaN"):
        producer.flush(float("nan"))
    producer.flush(float("inf"))  # nothing queued: at once
    assert producer.close(float("inf")) == 0
    consumer = Consumer({**UNREACHABLE, "group.id": "g"})
    queue = _nativeconsume.Queue(consumer, "t")
    try:
        with pytest.raises(ValueError, match="NaN"):
            queue.consume(1, float("nan"))
        queue.consume(1, -5.0)  # negative: no wait
    finally:
        queue.close()
        consumer.close()
