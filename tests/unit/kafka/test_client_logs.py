"""Connection errors and librdkafka's own lines at a bearable rate (stream.kafka.client_logs)."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError

from stream.kafka.client_logs import ConnectionWatch, RepeatFilter


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def refused() -> KafkaError:
    return KafkaError(KafkaError._TRANSPORT, "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed")


def test_an_outage_is_one_warning_a_reminder_every_30_s_and_one_line_when_it_ends(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    watch = ConnectionWatch(clock)
    with caplog.at_level(logging.INFO, logger="stream.kafka.client_logs"):
        for _ in range(620):  # 20 errors a second for 31 s, from two clients
            assert watch.error("consumer", refused()) and watch.error("producer", refused())
            clock.now += 0.05
        assert watch.unreachable and watch.unreachable_for() == pytest.approx(31.0)
        watch.reachable()
        watch.reachable()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3, lines
    assert lines[0].startswith("cannot reach the Kafka brokers (consumer: 127.0.0.1:1/bootstrap")
    assert lines[1].startswith("still cannot reach the Kafka brokers after 30 s") and "more such errors" in lines[1]
    assert lines[2] == "the Kafka brokers answer again, after 31 s unreachable"
    assert [r.levelname for r in caplog.records] == ["WARNING", "WARNING", "INFO"]
    assert not watch.unreachable and watch.unreachable_for() == 0.0


def test_other_errors_are_left_to_the_caller_and_a_long_silence_starts_a_new_outage(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    watch = ConnectionWatch(clock)
    assert not watch.error("producer", KafkaError(KafkaError._MSG_TIMED_OUT, "timed out"))
    with caplog.at_level(logging.INFO, logger="stream.kafka.client_logs"):
        watch.error("consumer", refused())
        clock.now += 61.0  # no error and no news for two reminder periods
        watch.error("consumer", refused())
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["cannot reach the Kafka brokers"] * 2


def test_repeat_filter_lets_a_line_through_once_per_window_and_counts_the_rest() -> None:
    clock = Clock()
    repeats = RepeatFilter(clock, window_s=30.0)

    def record(text: str) -> logging.LogRecord:
        return logging.LogRecord("stream.librdkafka.consumer", logging.ERROR, __file__, 1, text, None, None)

    passed = []
    for i in range(100):  # the same line, its numbers changing
        r = record(f"FAIL [rdkafka#consumer-{i % 3}]: Connect to ipv4#127.0.0.1:{i} failed")
        if repeats.filter(r):
            passed.append(r.getMessage())
        clock.now += 0.5
    assert len(passed) == 2  # at 0 s and at 30 s
    assert passed[1].endswith("(59 more like it in the last 30 s)")
    assert repeats.filter(record("another line"))
