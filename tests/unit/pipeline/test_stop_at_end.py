"""--stop-at-end against a fake consumer: a coordinator that is not ready yet is asked again, not fatal; the broker is
asked as soon as the worker has finished its own partitions, else at most every `_ASK_EVERY_S`."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from stream.pipeline import stop_at_end
from stream.pipeline.stop_at_end import StopAtEnd


class Consumer:
    def __init__(self, not_coordinator_first: bool = True) -> None:
        self.calls = 0
        self.not_coordinator_first = not_coordinator_first
        self.committed_offset = 5

    def committed(self, tps: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        self.calls += 1
        if self.calls == 1 and self.not_coordinator_first:  # a fresh cluster's first group: no coordinator yet
            raise KafkaException(KafkaError(KafkaError.NOT_COORDINATOR, "Broker: Not coordinator"))
        return [TopicPartition(tp.topic, tp.partition, self.committed_offset) for tp in tps]


def _stop_at_end(consumer: Consumer, clock: Any, busy: Any = lambda: False,
                 taken_to: Any = lambda topic, ends: False) -> StopAtEnd:
    committer: Any = SimpleNamespace(ledger=SimpleNamespace(positions=lambda: {}), commit=lambda asynchronous: None)
    return StopAtEnd(consumer, "in", {0: 5}, committer, busy, taken_to, clock)  # type: ignore[arg-type]


def test_a_coordinator_not_ready_is_asked_again_at_the_next_check() -> None:
    clock = iter(range(100))
    end = _stop_at_end(Consumer(), lambda: float(next(clock)))
    assert end.reached() is False
    assert end.reached() is True


def test_the_broker_is_asked_at_once_when_the_worker_finishes_its_partitions_else_at_most_every_ask_interval() -> None:
    now = [0.0]
    busy = [True]
    own_done = [False]
    consumer = Consumer(not_coordinator_first=False)
    consumer.committed_offset = 3  # short of the end (5) until the test moves it
    end = _stop_at_end(consumer, lambda: now[0], lambda: busy[0], lambda topic, ends: topic == "in" and own_done[0])
    tick, ask_every = stop_at_end._CHECK_EVERY_S, stop_at_end._ASK_EVERY_S

    def look(is_busy: bool) -> bool:
        busy[0] = is_busy
        now[0] += tick
        return end.reached()

    assert look(True) is False and consumer.calls == 0  # busy: nothing asked
    assert look(False) is False and consumer.calls == 1  # the first idle look asks
    for _ in range(3):  # idle between two fetches, more to take: no round trip within the ask interval
        assert look(True) is False
        assert look(False) is False
    assert consumer.calls == 1
    now[0] += ask_every
    assert look(False) is False and consumer.calls == 2  # idle past the interval: asked again
    assert look(True) is False
    own_done[0] = True  # its partitions taken to their ends and processed: asked at the first idle look
    assert look(False) is False and consumer.calls == 3
    for _ in range(3):  # once, not at every look while it waits for the group's other partitions
        assert look(False) is False
    assert consumer.calls == 3
    consumer.committed_offset = 5
    now[0] += ask_every
    assert look(False) is True and consumer.calls == 4
