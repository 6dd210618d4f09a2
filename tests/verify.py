"""The tests' verifier, written apart from the code it checks: it shares nothing with the worker or the
project's own tools (`stream.ops.verify`, `stream.kafka.topics`, `stream.codec`), so that a bug there cannot hide a
bug in the worker. It reads with confluent-kafka's plain clients and decodes with fastavro and the schema files
themselves:

- `end_offsets`: each partition read to its end (the offset its end-of-partition event names) from where the
  broker's ListOffsets answer puts it (which the embedded Tansu broker gets too low), not the project's probe;
- `committed_offsets`: the group's offsets as a plain consumer of the group reads them (not the admin API's
  ListConsumerGroupOffsets: librdkafka crashes the process when its broker answers NOT_COORDINATOR, as a
  coordinator moving on a fresh or faulted cluster does; confluentinc/librdkafka#5040, still in 2.16.0);
- `OutputReader`: every record of an output topic, `read_committed`, decoded by its writer schema's id.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from fastavro import parse_schema, schemaless_reader

SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"


def _plain(schema: Any) -> Any:
    """``schema`` without its logical types: values as they are on the wire (a timestamp-millis is its int), as
    the worker writes them, not as fastavro would convert them (a datetime)."""
    if isinstance(schema, dict):
        return {k: _plain(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [_plain(v) for v in schema]
    return schema


def writer_schemas() -> dict[int, Any]:
    listed = json.loads((SCHEMAS / "registry.json").read_text())["schemas"]
    return {int(i): parse_schema(_plain(json.loads((SCHEMAS / name).read_text()))) for i, name in listed.items()}


def decode_value(schemas: Mapping[int, Any], value: bytes) -> dict[str, Any]:
    """A Confluent-framed Avro value (magic byte 0, a 4-byte schema id, the body) as a dict."""
    if len(value) < 5 or value[0] != 0:
        raise ValueError(f"not Confluent-framed Avro: {value[:8]!r}")
    record = schemaless_reader(BytesIO(value[5:]), schemas[int.from_bytes(value[1:5], "big")], None)
    assert isinstance(record, dict)
    return record


def partitions(bootstrap: str, topic: str, client_config: Mapping[str, Any] | None = None) -> list[int]:
    client = AdminClient({**(client_config or {}), "bootstrap.servers": bootstrap})
    meta = client.list_topics(topic, timeout=15).topics[topic]
    if meta.error is not None:
        raise AssertionError(f"topic {topic}: {meta.error}")
    return sorted(meta.partitions)


def end_offsets(bootstrap: str, topic: str, timeout_s: float = 60.0,
                client_config: Mapping[str, Any] | None = None) -> dict[int, int]:
    """Each partition's end, found by reading it to the end (read_uncommitted: transaction markers count),
    from where the broker's ListOffsets says it ends (on Kafka, at once; Tansu answers too low, and the rest is
    read)."""
    parts = partitions(bootstrap, topic, client_config)
    consumer = Consumer({**(client_config or {}), "bootstrap.servers": bootstrap,
                         "group.id": f"ends-{uuid.uuid4().hex}", "enable.auto.commit": False,
                         "enable.partition.eof": True, "isolation.level": "read_uncommitted"})
    try:
        listed = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False) for p in parts}
        consumer.assign([TopicPartition(topic, p, max(listed[p][1], listed[p][0], 0)) for p in parts])
        ends: dict[int, int] = {}
        deadline = time.monotonic() + timeout_s
        while len(ends) < len(parts):
            assert time.monotonic() < deadline, f"{topic}: no end of partitions {sorted(set(parts) - set(ends))}"
            for msg in consumer.consume(10_000, 0.2):
                error, partition, offset = msg.error(), msg.partition(), msg.offset()
                if partition is None or offset is None:
                    continue
                if error is not None and error.code() == KafkaError._PARTITION_EOF:
                    ends.setdefault(partition, offset)  # its end when read (a live topic grows after)
        return ends
    finally:
        consumer.close()


def record_times(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list[float]:
    """Every record's timestamp (seconds; the producer's create time unless the topic sets the broker's) of
    ``topic``, read from the start to its end (`end_offsets`)."""
    ends = end_offsets(bootstrap, topic, timeout_s)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"times-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "isolation.level": "read_uncommitted"})
    times: list[float] = []
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p, end in ends.items() if end > 0])
        at = {p: 0 for p in ends}
        deadline = time.monotonic() + timeout_s
        while any(at[p] < ends[p] for p in ends):
            assert time.monotonic() < deadline, f"{topic}: read to {at}, its ends {ends}"
            for msg in consumer.consume(10_000, 0.2):
                partition, offset = msg.partition(), msg.offset()
                if msg.error() is None and partition is not None and offset is not None:
                    at[partition] = offset + 1
                    times.append(msg.timestamp()[1] / 1000.0)
        return times
    finally:
        consumer.close()


def group_reader(bootstrap: str, group: str, client_config: Mapping[str, Any] | None = None) -> Consumer:
    """A consumer of ``group`` that never joins it, only reads its committed offsets (``committed``): the offsets
    as they are, a transaction's pending ones left out without waiting for it (read_uncommitted)."""
    return Consumer({**(client_config or {}), "bootstrap.servers": bootstrap, "group.id": group,
                     "enable.auto.commit": False, "isolation.level": "read_uncommitted"})


def committed_offsets(bootstrap: str, group: str, topic: str,
                      client_config: Mapping[str, Any] | None = None) -> dict[int, int]:
    """The group's committed offset per partition of ``topic`` (-1: none)."""
    asked = [TopicPartition(topic, p) for p in partitions(bootstrap, topic, client_config)]
    reader = group_reader(bootstrap, group, client_config)
    try:
        listed = reader.committed(asked, timeout=30)
    finally:
        reader.close()
    return {tp.partition: tp.offset if tp.offset >= 0 else -1 for tp in listed}


class CommitWatch:
    """Groups watched on a thread of their own: each topic whose name starts with ``topic_prefix`` (topics listed
    every 0.2 s) names a group (``group_of(topic)``) and the topic it consumes (``input_of(topic)``), whose
    committed records over every partition are looked at every ``every_s`` until they reach ``until``. Per
    group, its topic (``topics``) and each look's (wall time the request went out, records committed): a commit
    seen missing at a look was made after that look's time. The worker's output topic is made before it starts, so
    its group is watched before it commits."""

    def __init__(self, bootstrap: str, topic_prefix: str, group_of: Callable[[str], str],
                 input_of: Callable[[str], str], until: int, every_s: float = 0.005) -> None:
        import threading

        self.looks: dict[str, list[tuple[float, int]]] = {}
        self.topics: dict[str, str] = {}  # group -> the topic that named it
        self.errors: list[str] = []
        self._bootstrap = bootstrap
        self._admin = AdminClient({"bootstrap.servers": bootstrap})
        self._readers: dict[str, tuple[Consumer, list[TopicPartition]]] = {}  # group -> its reader, what it asks
        self._prefix, self._group_of, self._input_of = topic_prefix, group_of, input_of
        self._until, self._every_s = until, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="commit-watch", daemon=True)

    def __enter__(self) -> CommitWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(30)
        for reader, _ in self._readers.values():
            reader.close()

    def _run(self) -> None:
        active: set[str] = set()
        listed_at = 0.0
        while not self._stop.wait(self._every_s if active else 0.05):
            try:
                if time.monotonic() - listed_at >= 0.2:
                    listed_at = time.monotonic()
                    for topic in self._admin.list_topics(timeout=10).topics:
                        group = self._group_of(topic) if topic.startswith(self._prefix) else None
                        if group is not None and group not in self.looks:
                            consumed = self._input_of(topic)
                            self._readers[group] = (group_reader(self._bootstrap, group), [
                                TopicPartition(consumed, p) for p in partitions(self._bootstrap, consumed)])
                            self.looks[group], self.topics[group] = [], topic
                            active.add(group)
                for group in list(active):
                    reader, asked = self._readers[group]
                    sent = time.time()
                    committed = sum(max(tp.offset, 0) for tp in reader.committed(asked, timeout=15))
                    self.looks[group].append((sent, committed))
                    if committed >= self._until:
                        active.discard(group)
            except Exception as exc:  # a look that failed is no look (its time is not recorded); the next one tries
                self.errors.append(repr(exc))

    def last_short_of(self, group: str, records: int) -> float | None:
        """The time of the last look at ``group`` that saw fewer than ``records`` committed (None: none did)."""
        short = [t for t, committed in self.looks.get(group, []) if committed < records]
        return max(short) if short else None


def check_committed(committed: Mapping[int, int], ends: Mapping[int, int]) -> list[str]:
    """Partitions whose committed offset is not their end (an empty one may have none)."""
    return [f"partition {p}: committed {committed.get(p, -1)}, end {end}" for p, end in sorted(ends.items())
            if committed.get(p, -1) != end and not (end == 0 and committed.get(p, -1) == -1)]


def committed_problems(bootstrap: str, group: str, topic: str) -> list[str]:
    return check_committed(committed_offsets(bootstrap, group, topic), end_offsets(bootstrap, topic))


def headers_of(msg: Message) -> dict[str, bytes]:
    """A record's headers with bytes values."""
    return {k: v for k, v in msg.headers() or [] if isinstance(v, bytes)}  # type: ignore[str-unpack]


def source_of(record: Mapping[str, Any], headers: Mapping[str, bytes]) -> tuple[str, int, int]:
    """The input record a prediction (its ``input_*`` fields) or a dead letter (its ``stream.input.*`` headers)
    answers."""
    if isinstance(record.get("input_offset"), int) and record["input_offset"] >= 0:
        return str(record["input_topic"]), int(record["input_partition"]), int(record["input_offset"])
    return (headers["stream.input.topic"].decode(), int(headers["stream.input.partition"]),
            int(headers["stream.input.offset"]))


@dataclass
class Prediction:
    event_id: str
    record: dict[str, Any]
    key: bytes | None
    headers: dict[str, bytes]

    @property
    def source(self) -> tuple[str, int, int]:
        return source_of(self.record, self.headers)


@dataclass
class OutputReader:
    """Every record of ``topic`` from the beginning, ``read_committed``, read incrementally."""

    bootstrap: str
    topic: str
    predictions: list[Prediction] = field(default_factory=list)
    client_config: dict[str, Any] = field(default_factory=dict)  # security settings, as for any client

    def __post_init__(self) -> None:
        self._schemas = writer_schemas()
        self._consumer = Consumer({**self.client_config, "bootstrap.servers": self.bootstrap,
                                   "group.id": f"verify-{uuid.uuid4().hex}", "enable.auto.commit": False,
                                   "isolation.level": "read_committed"})
        self._consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING)
                               for p in partitions(self.bootstrap, self.topic, self.client_config)])
        self._ids: Counter[str] = Counter()

    def poll(self, timeout_s: float = 0.2) -> int:
        got = 0
        for msg in self._consumer.consume(10_000, timeout_s):
            if msg.error() is not None:
                continue
            record = decode_value(self._schemas, msg.value())  # type: ignore[arg-type]
            headers = headers_of(msg)
            self._ids[str(record["event_id"])] += 1
            self.predictions.append(Prediction(str(record["event_id"]), record, msg.key(), headers))
            got += 1
        return got

    def read_until(self, expected_ids: set[str], timeout_s: float, idle_timeout_s: float = 60.0) -> bool:
        """Until every expected id was read (True), or time runs out (False)."""
        deadline = time.monotonic() + timeout_s
        last_progress = time.monotonic()
        while time.monotonic() < deadline:
            if self.missing(expected_ids) == 0:
                return True
            if self.poll():
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > idle_timeout_s:
                return False
        return self.missing(expected_ids) == 0

    def missing(self, expected_ids: set[str]) -> int:
        return sum(1 for i in expected_ids if i not in self._ids)

    def duplicates(self) -> int:
        return sum(c - 1 for c in self._ids.values() if c > 1)

    def unexpected(self, expected_ids: set[str]) -> int:
        return sum(1 for i in self._ids if i not in expected_ids)

    def close(self) -> None:
        self._consumer.close()
