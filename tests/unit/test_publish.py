"""The Publisher without a broker: records to an unreachable address time out in librdkafka and come back as
failed delivery reports, which is enough to check who serves them and what a full local queue does."""

from __future__ import annotations

import threading
import time

import pytest

from stream.errors import PublishError
from stream.offsets import OffsetTracker
from stream.publish import Publisher, SpanDelivery

UNREACHABLE = {"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": 200, "log_level": 0,
               "queue.buffering.max.messages": 4}


def spans(publisher: Publisher, n: int) -> list[SpanDelivery]:
    tracker = OffsetTracker()
    tracker.assign([("in", 0)])
    return [SpanDelivery(publisher, tracker.dispatch(("in", 0), 0, n - 1, n))] * n


def test_a_full_local_queue_is_freed_by_serving_delivery_reports_on_the_producing_thread() -> None:
    """10 records through a queue of 4: produce_many serves reports (here, timeouts) until each one fits; the
    callbacks run on the calling thread, and every failure is recorded, none acknowledged."""
    done: list[SpanDelivery] = []
    publisher = Publisher(UNREACHABLE, on_span_done=done.append)
    threads: set[str] = set()
    original = publisher.record_failure

    def record(error: PublishError, msg: object) -> None:
        threads.add(threading.current_thread().name)
        original(error, msg)  # type: ignore[arg-type]

    publisher.record_failure = record  # type: ignore[method-assign]
    callbacks = spans(publisher, 10)
    started = time.monotonic()
    publisher.produce_many("out", [b"v"] * 10, [None] * 10, [None] * 10, callbacks)
    assert time.monotonic() - started >= 0.2  # the sixth record waited for the first ones to time out
    assert publisher.close(5.0) == 0  # serves the last reports, on this thread too
    assert threads == {threading.current_thread().name}
    assert isinstance(publisher.failure(), PublishError)
    assert callbacks[0].span.outstanding == 10 and done == []


def test_closing_from_another_thread_stops_a_producer_waiting_for_queue_space() -> None:
    """Shutdown closes the publisher when the processor did not stop in time: a processor blocked on a full
    queue gives up, and close reports what is still undelivered."""
    publisher = Publisher({**UNREACHABLE, "message.timeout.ms": 60_000}, on_span_done=lambda d: None)
    publisher.produce_many("out", [b"v"] * 4, [None] * 4, [None] * 4, spans(publisher, 4))  # fills the queue
    undelivered: list[int] = []
    closer = threading.Timer(0.2, lambda: undelivered.append(publisher.close(0.2)))
    closer.start()
    with pytest.raises(PublishError, match="closed while the local queue was full"):
        publisher.produce_many("out", [b"v"], [None], [None], spans(publisher, 1))
    closer.join()
    assert undelivered == [4]
