"""Backpressure: the poll loop's pause and resume (`stream.pipeline.pausing`) against a fake consumer and a fake clock:
input is paused only while a closed batch waits for the processor, and resumed as soon as no batch waits, however
the batch went (dispatched, or dropped by a lost assignment, a revoke or an exactly-once rewind)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from stream.config import WorkerSettings
from stream.kafka.records import Records
from stream.pipeline.worker import Connected, Worker
from tests.handlers import PoisonHandler

TOPIC = "in"


class StepClock:
    """Moves on by ``step`` seconds each time it is read: the loop's stall timer runs without real waiting."""

    def __init__(self, step: float) -> None:
        self.now = 0.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


class PausingConsumer:
    """Records pause/resume; ``on_consume`` runs inside each consume() (where rebalance callbacks run). Like
    librdkafka, a partition's pause flag outlives its assignment: unassigned and assigned again, it is still
    paused until resumed."""

    def __init__(self, worker: Worker, partitions: list[int]) -> None:
        self.worker = worker
        self.partitions = [TopicPartition(TOPIC, p) for p in partitions]
        self.paused: set[int] = set()
        self.calls: list[str] = []
        self.consumes = 0
        self.on_consume: Callable[[PausingConsumer], None] = lambda c: None
        self.parts: Connected  # the worker's parts over this consumer (`fill_and_block`)

    def assignment(self) -> list[TopicPartition]:
        return list(self.partitions)

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.calls.append("pause")
        self.paused |= {tp.partition for tp in partitions}

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.calls.append("resume")
        self.paused -= {tp.partition for tp in partitions}

    def consume(self, num: int, timeout: float) -> list[Any]:
        self.consumes += 1
        self.on_consume(self)
        if self.consumes > 200:
            self.worker.request_stop()
        return []

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> None:
        return None


class IdlePublisher:
    """Never fails; the dispatched batch is never processed here."""

    def failure(self) -> None:
        return None


@pytest.fixture
def worker(model_dir: Path) -> Worker:
    settings = WorkerSettings(bootstrap_servers="127.0.0.1:1", input_topic=TOPIC, output_topic="out", group_id="g",
                              model_dir=model_dir, max_batch_size=2, max_wait_ms=0, max_inflight_batches=1,
                              stall_timeout_s=3600, native_consumer=False)
    return Worker(settings, handler=PoisonHandler(model_dir), clock=StepClock(0.05))


def fill_and_block(worker: Worker, partitions: list[int]) -> PausingConsumer:
    """A closed batch waits for a processor that does not take it (its one queue slot is held)."""
    consumer = PausingConsumer(worker, partitions)
    consumer.parts = worker._connect(consumer, IdlePublisher())  # type: ignore[arg-type]  # (stages not started)
    consumer.parts.rebalancer.on_assign(consumer, consumer.partitions)  # type: ignore[arg-type]
    consumer.calls.clear()  # (on_assign sets the new partitions' pause state either way)
    assert consumer.parts.stage._slots.acquire(blocking=False)  # the processor's queue is full
    worker._batcher.add([Records.build([b"a", b"b"], [None, None], partitions[:1] * 2, [0, 1])])
    return consumer


def until_paused_then(action: Callable[[PausingConsumer], None]) -> Callable[[PausingConsumer], None]:
    done: list[bool] = []

    def step(consumer: PausingConsumer) -> None:
        if consumer.paused and not done:
            done.append(True)
            action(consumer)
        if done and not consumer.paused & {tp.partition for tp in consumer.partitions}:
            consumer.worker.request_stop()  # resumed: the test has what it needs
    return step


@pytest.mark.parametrize("how", ["lost", "revoked", "rewound"])
def test_input_resumes_when_the_waiting_batch_is_dropped(worker: Worker, how: str) -> None:
    """The outage behind the exactly-once freeze/thaw stall: paused behind a full queue, the waiting batch was
    emptied by a lost assignment (or a rewind), nothing was ever dispatched again, so nothing resumed the
    partitions, and new assignments were paused too."""
    consumer = fill_and_block(worker, [0, 1])

    def drop(c: PausingConsumer) -> None:
        if how == "lost":
            consumer.parts.rebalancer.on_lost(c, c.partitions)  # type: ignore[arg-type]
            c.partitions = [TopicPartition(TOPIC, 2)]
            consumer.parts.rebalancer.on_assign(c, c.partitions)  # type: ignore[arg-type]
        elif how == "revoked":
            consumer.parts.rebalancer.on_revoke(c, c.partitions[:1])  # type: ignore[arg-type]
            c.partitions = c.partitions[1:]
        else:
            worker._batcher.take()  # what Transactions.rewind does to the open batch

    consumer.on_consume = until_paused_then(drop)
    worker._poll_loop(consumer.parts)
    assert consumer.calls[:1] == ["pause"], "a stalled batch pauses input first"
    assigned = {tp.partition for tp in consumer.partitions}
    assert "resume" in consumer.calls and not consumer.paused & assigned, consumer.calls
    assert not worker._pause.paused and worker.metrics.paused_partitions._value.get() == 0
    assert len(worker._batcher) == 0 and consumer.parts.stage.queued() == 0, "nothing was dispatched"


def test_input_stays_paused_while_the_batch_still_waits(worker: Worker) -> None:
    consumer = fill_and_block(worker, [0])
    worker._poll_loop(consumer.parts)  # the fake consumer stops the loop after 200 consume calls
    assert consumer.calls == ["pause"] and consumer.paused == {0}
    assert worker.metrics.paused_partitions._value.get() == 1


def test_input_resumes_when_the_processor_takes_the_batch(worker: Worker) -> None:
    consumer = fill_and_block(worker, [0])
    consumer.on_consume = until_paused_then(lambda c: consumer.parts.stage._slots.release())  # the processor took one
    worker._poll_loop(consumer.parts)
    assert consumer.calls == ["pause", "resume"] and consumer.parts.stage.queued() == 1


def test_partitions_lost_while_paused_and_assigned_again_later_are_not_left_paused(worker: Worker) -> None:
    """The at-least-once freeze/thaw stall: a replica paused behind a full queue is frozen, thaws, finds its
    partitions lost (nothing assigned: the resume has nothing to resume), and is given the same partitions
    again a while later, not paused any more itself. librdkafka still has them paused from before."""
    consumer = fill_and_block(worker, [3, 4, 5])
    steps: list[str] = []

    def step(c: PausingConsumer) -> None:
        if c.paused and not steps:
            steps.append("lost")
            consumer.parts.rebalancer.on_lost(c, c.partitions)  # type: ignore[arg-type]
            c.partitions = []
        elif steps == ["lost"] and not worker._pause.paused:
            steps.append("assigned again")
            c.partitions = [TopicPartition(TOPIC, p) for p in (3, 4, 5)]
            consumer.parts.rebalancer.on_assign(c, c.partitions)  # type: ignore[arg-type]
        elif len(steps) == 2:
            worker.request_stop()

    consumer.on_consume = step
    worker._poll_loop(consumer.parts)
    assert steps == ["lost", "assigned again"]
    assert consumer.paused == set(), f"{sorted(consumer.paused)} still paused: {consumer.calls}"
