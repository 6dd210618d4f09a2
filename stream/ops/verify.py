"""An independent reader of the output topic: it shares no state with the workers, only the schemas.

Used by the demo and the tests to check that every event has exactly one prediction and that the
group's committed offsets reached the input's end offsets.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from stream.codec import SchemaRegistry, decode
from stream.kafka.publish import HEADER_OFFSET, HEADER_PARTITION, HEADER_TOPIC
from stream.kafka.topics import partitions_of


def headers_of(msg: Message) -> dict[str, bytes]:
    """A record's headers with bytes values (the only kind the worker writes)."""
    return {k: v for k, v in msg.headers() or [] if isinstance(v, bytes)}  # type: ignore[str-unpack]


def input_source(record: Mapping[str, object], headers: Mapping[str, bytes]) -> tuple[str, int, int]:
    """(topic, partition, offset) of the input record that a prediction answers: its ``input_*`` fields
    (prediction schema version 2 on), else its ``stream.input.*`` headers (dead-letter records, older schemas)."""
    offset = record.get("input_offset", -1)
    if isinstance(offset, int) and offset >= 0:
        return str(record["input_topic"]), int(record["input_partition"]), offset  # type: ignore[call-overload]
    try:
        return headers[HEADER_TOPIC].decode(), int(headers[HEADER_PARTITION]), int(headers[HEADER_OFFSET])
    except KeyError:
        raise ValueError("record names no input record: no input_* fields and no stream.input.* headers") from None


@dataclass
class Prediction:
    event_id: str
    record: dict[str, object]
    key: bytes | None
    headers: dict[str, bytes]
    received_ms: float

    @property
    def source(self) -> tuple[str, int, int]:
        """(topic, partition, offset) of the input record this prediction answers."""
        return input_source(self.record, self.headers)


@dataclass
class OutputReader:
    """Reads every prediction on ``topic`` from the beginning (``read_committed``), incrementally."""

    bootstrap: str
    topic: str
    predictions: list[Prediction] = field(default_factory=list)
    client_config: dict[str, Any] = field(default_factory=dict)  # security settings, as for any client

    def __post_init__(self) -> None:
        self._registry = SchemaRegistry.from_dir()
        self._consumer = Consumer({
            **self.client_config,
            "bootstrap.servers": self.bootstrap,
            "group.id": f"verifier-{uuid.uuid4().hex[:12]}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        })
        self._consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING)
                               for p in partitions_of(self.bootstrap, self.topic, self.client_config)])
        self._ids: Counter[str] = Counter()

    def poll(self, timeout_s: float = 0.2) -> int:
        got = 0
        for msg in self._consumer.consume(10_000, timeout_s):
            if msg.error() is not None:
                continue
            _, record = decode(self._registry, msg.value())
            event_id = str(record["event_id"])
            self._ids[event_id] += 1
            self.predictions.append(Prediction(event_id, record, msg.key(), headers_of(msg), time.time() * 1000.0))
            got += 1
        return got

    def read_until(self, expected_ids: set[str], timeout_s: float, idle_timeout_s: float = 60.0) -> bool:
        """Poll until every expected id was seen (True) or time runs out (False)."""
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

    def latencies_ms(self) -> np.ndarray:
        """Reader receive time minus the event's producer timestamp, per prediction."""
        return np.asarray([p.received_ms - float(p.record["event_ts_ms"]) for p in self.predictions])  # type: ignore[arg-type]

    def close(self) -> None:
        self._consumer.close()


def check_committed(committed: dict[int, int], ends: dict[int, int]) -> list[str]:
    """Partitions whose committed offset differs from the end offset (empty partitions may have none)."""
    problems = []
    for p, end in sorted(ends.items()):
        got = committed.get(p, -1)
        if got != end and not (end == 0 and got == -1):
            problems.append(f"partition {p}: committed {got}, end {end}")
    return problems
