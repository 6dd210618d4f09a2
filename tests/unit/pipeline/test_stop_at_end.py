"""--stop-at-end against a fake consumer: a coordinator that is not ready yet is asked again, not fatal."""

from __future__ import annotations

from types import SimpleNamespace

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from stream.pipeline.stop_at_end import StopAtEnd


class Consumer:
    def __init__(self) -> None:
        self.calls = 0

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        self.calls += 1
        if self.calls == 1:  # a fresh cluster's first group: its coordinator is not there yet
            raise KafkaException(KafkaError(KafkaError.NOT_COORDINATOR, "Broker: Not coordinator"))
        return [TopicPartition(tp.topic, tp.partition, 5) for tp in tps]


def test_a_coordinator_not_ready_is_asked_again_at_the_next_check() -> None:
    clock = iter(range(100))
    end = StopAtEnd.__new__(StopAtEnd)
    end._consumer, end._topic, end._clock, end._next_check = Consumer(), "in", lambda: float(next(clock)), 0.0
    end._committer = SimpleNamespace(ledger=SimpleNamespace(positions=lambda: {}), commit=lambda asynchronous: None)
    end._busy, end._ends = lambda: False, {0: 5}
    assert end.reached() is False
    assert end.reached() is True
