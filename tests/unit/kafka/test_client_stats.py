"""The consumer's statistics as metrics: lag per assigned partition, prefetched records, stale figures dropped."""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from stream.kafka.client_stats import ConsumerStats


def _partition(pid: int, state: str, lag: int, fetchq: int) -> dict[str, Any]:
    return {"partition": pid, "fetch_state": state, "consumer_lag": lag, "consumer_lag_stored": lag,
            "fetchq_cnt": fetchq, "hi_offset": 1000, "committed_offset": 1000 - lag}


def _stats(topic: str, *parts: dict[str, Any]) -> str:
    partitions = {str(p["partition"]): p for p in parts}
    partitions["-1"] = {"partition": -1, "fetch_state": "none", "consumer_lag": -1, "fetchq_cnt": 0}
    return json.dumps({"name": "rdkafka#consumer-1", "type": "consumer",
                       "topics": {topic: {"topic": topic, "partitions": partitions},
                                  "other": {"partitions": {"0": _partition(0, "active", 999, 5)}}}})


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _scrape(stats: ConsumerStats) -> str:
    registry = CollectorRegistry()
    registry.register(stats)
    return generate_latest(registry).decode()


def test_lag_of_fetched_partitions_of_the_input_topic_only() -> None:
    stats = ConsumerStats("events", 5.0)
    stats.on_stats(_stats("events", _partition(0, "active", 12, 300), _partition(3, "active", 0, 0),
                          _partition(5, "none", 40, 0),  # known from metadata, not assigned here
                          _partition(6, "offset-query", -1, 0)))  # assigned, no committed offset yet
    assert stats.lag() == {0: 12, 3: 0}
    text = _scrape(stats)
    assert 'stream_consumer_lag_records{partition="0",topic="events"} 12.0' in text
    assert 'stream_consumer_lag_records{partition="3",topic="events"} 0.0' in text
    assert 'partition="5"' not in text and 'partition="6"' not in text and 'partition="-1"' not in text
    assert "stream_prefetched_records 300.0" in text


def test_stale_statistics_are_dropped_not_shown_as_current() -> None:
    clock = _Clock()
    stats = ConsumerStats("events", 5.0, clock)
    assert stats.lag() is None
    assert "stream_consumer_lag_records{" not in _scrape(stats)
    stats.on_stats(_stats("events", _partition(1, "active", 7, 0)))
    clock.now += 14.9
    assert stats.lag() == {1: 7}
    clock.now += 0.2  # three intervals without statistics: the consumer stopped serving them
    assert stats.lag() is None
    text = _scrape(stats)
    assert "stream_consumer_lag_records{" not in text and "\nstream_prefetched_records " not in text


def test_unreadable_statistics_keep_the_last_good_ones() -> None:
    stats = ConsumerStats("events", 5.0)
    stats.on_stats(_stats("events", _partition(2, "active", 3, 1)))
    stats.on_stats("{not json")
    stats.on_stats(json.dumps({"topics": {"events": {"partitions": {"0": {"partition": "x"}}}}}))
    assert stats.lag() == {2: 3}
