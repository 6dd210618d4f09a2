"""The native producer against the session broker: every record delivered once, with its key and value, to
the partition confluent-kafka's producer picks for that key; spans acknowledged only after delivery."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from stream import native
from stream.offsets import OffsetTracker
from stream.publish import Publisher, SpanDelivery
from stream.topics import create_topics
from tests.conftest import BrokerInfo

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120),
              pytest.mark.skipif(native.unavailable() is not None, reason=f"native: {native.unavailable()}")]
PARTITIONS = 6


def _read(bootstrap: str, topic: str, count: int) -> list[tuple[int, bytes | None, bytes | None]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-reader", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    found: list[tuple[int, bytes | None, bytes | None]] = []
    try:
        for _ in range(300):
            found += [(m.partition(), m.key(), m.value()) for m in consumer.consume(1000, 0.1) if m.error() is None]
            if len(found) >= count:
                break
    finally:
        consumer.close()
    return found


def test_records_arrive_once_keyed_like_confluent_kafka_and_spans_complete_after_delivery(
        broker: BrokerInfo, unique_name: Callable[[str], str]) -> None:
    out, reference = unique_name("out"), unique_name("ref")
    create_topics(broker.bootstrap, [out, reference], PARTITIONS)
    n = 3000
    keys: list[bytes | None] = [None if i % 10 == 0 else b"account-%d" % (i % 97) for i in range(n)]
    values = [b"prediction-%d" % i for i in range(n)]
    ends = np.cumsum([len(v) for v in values]).astype(np.int64)
    row_partitions = np.arange(n, dtype=np.int64) % 3  # three input partitions: three spans
    tracker = OffsetTracker()
    tracker.assign([("in", p) for p in range(3)])
    done: list[SpanDelivery] = []
    publisher = Publisher({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "acks": "all",
                           "linger.ms": 5}, on_span_done=done.append, native_topic=out)
    deliveries = {p: SpanDelivery(publisher, tracker.dispatch(("in", p), 0, n // 3 - 1, n // 3)) for p in range(3)}
    publisher.produce_joined(out, b"".join(values), ends, keys, row_partitions, deliveries)
    assert done == []  # nothing is acknowledged before its reports are served
    for _ in range(100):
        publisher.send_now(0.1)
        if len(done) == 3:
            break
    assert len(done) == 3 and {id(d) for d in done} == {id(d) for d in deliveries.values()}
    assert all(d.span.outstanding == 0 for d in done)
    assert publisher.failure() is None
    assert publisher.close(5.0) == 0

    confluent = Producer({"bootstrap.servers": broker.bootstrap})
    for k, v in zip(keys, values, strict=True):
        confluent.produce(reference, v, k)
    assert confluent.flush(30) == 0

    got = _read(broker.bootstrap, out, n)
    assert sorted(v for _, _, v in got) == sorted(values)  # each once
    by_value = {v: (p, k) for p, k, v in got}
    assert all(by_value[v][1] == k for k, v in zip(keys, values, strict=True))
    expected = {v: p for p, _, v in _read(broker.bootstrap, reference, n)}
    keyed = [v for k, v in zip(keys, values, strict=True) if k is not None]
    assert all(by_value[v][0] == expected[v] for v in keyed)  # same partitioner, same partition per key
