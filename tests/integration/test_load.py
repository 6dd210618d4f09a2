"""The load generator against the session broker: every event of the requested range arrives once, keyed by its
account, encoded as the event schema, stamped when it was sent; framed ahead of time or block by block, through
the C producer or confluent-kafka's."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from producers.events import generate_events
from producers.load import BLOCK, produce_events
from stream.codec import SchemaRegistry, decode
from stream.kafka import native
from stream.kafka.topics import create_topics
from tests.conftest import BrokerInfo

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
PARTITIONS = 3


@pytest.mark.parametrize("pregenerate", [True, False], ids=["pregenerated", "block-by-block"])
@pytest.mark.parametrize("use_native", [True, False], ids=["native-producer", "confluent-producer"])
def test_every_event_arrives_once_encoded_keyed_and_stamped_at_send(
        broker: BrokerInfo, unique_name: Callable[[str], str], pregenerate: bool, use_native: bool) -> None:
    if use_native and native.unavailable() is not None:
        pytest.skip(f"native: {native.unavailable()}")
    topic = unique_name("events")
    create_topics(broker.bootstrap, [topic], PARTITIONS)
    count, start = 2 * BLOCK + 123, 40  # three blocks, the last one short
    before = int(time.time() * 1000)
    summary = produce_events(broker.bootstrap, topic, count, seed=5, start=start, rate=40_000.0,
                             native=use_native, pregenerate=pregenerate)
    after = int(time.time() * 1000)
    assert summary.failed == 0 and summary.delivered == count == summary.requested, summary.line()

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"{topic}-reader",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    got: dict[str, tuple[bytes | None, dict[str, object]]] = {}
    duplicates = 0
    registry = SchemaRegistry.from_dir()
    try:
        for _ in range(300):
            for m in consumer.consume(5000, 0.1):
                assert m.error() is None, m.error()
                record = decode(registry, m.value())[1]
                duplicates += record["event_id"] in got
                got[str(record["event_id"])] = (m.key(), record)
            if len(got) + duplicates >= count:
                break
    finally:
        consumer.close()
    assert duplicates == 0 and len(got) == count

    stamps = set()
    # The generator draws its events a block at a time (the draws depend on where a block starts).
    blocks = [generate_events(min(BLOCK, count - i), seed=5, start=start + i) for i in range(0, count, BLOCK)]
    for expected in (record for block in blocks for record in block.records()):
        key, record = got[str(expected["event_id"])]
        assert key == str(expected["key"]).encode()
        assert record["key"] == expected["key"]
        assert record["features"] == expected["features"]  # the same float32 values
        assert before <= int(record["ts_ms"]) <= after  # type: ignore[call-overload]
        stamps.add(record["ts_ms"])
    assert len(stamps) > 1  # paced over ~0.25 s: stamped burst by burst, not once ahead of time
