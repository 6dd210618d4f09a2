"""The rebalance callbacks (`stream.pipeline.rebalance`) against a fake consumer: what an assignment starts, what a
revoke finishes and commits, what a lost assignment drops."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from stream.kafka.offsets import OffsetTracker
from stream.kafka.records import Records
from stream.ops.metrics import StreamMetrics
from stream.ops.stalls import StallDetector
from stream.ops.summary import WorkerSummary
from stream.pipeline.batching import MicroBatcher
from stream.pipeline.committer import CommitLedger, Committer
from stream.pipeline.pausing import InputPause
from stream.pipeline.rebalance import IdleReplica, Rebalancer

T = "in"


class Consumer:
    def __init__(self) -> None:
        self.commits: list[dict[tuple[str, int], int]] = []
        self.calls: list[str] = []

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> list[TopicPartition]:
        assert not asynchronous
        self.commits.append({(tp.topic, tp.partition): tp.offset for tp in offsets})
        return offsets

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.calls.append("pause")

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.calls.append("resume")


class Intake:
    def __init__(self) -> None:
        self.routed: list[tuple[str, int]] = []
        self.forgotten: list[int] = []

    def route(self, tps: list[tuple[str, int]]) -> None:
        self.routed += tps

    def forget(self, partitions: set[int]) -> None:  # the unreadable batches met on them (stream.kafka.unreadable)
        self.forgotten += sorted(partitions)


class StepClock:
    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def setup(budget_s: float = 5.0, clock: Any = None) -> tuple[Rebalancer, Consumer, OffsetTracker,
                                                              MicroBatcher[Records], Committer, InputPause]:
    metrics, tracker = StreamMetrics(), OffsetTracker()
    clock = clock or StepClock(0.0)
    stalls = StallDetector(60.0, clock)
    consumer = Consumer()
    ledger = CommitLedger(tracker, stalls, WorkerSummary(), metrics)
    committer = Committer(consumer, ledger, tracker, metrics, exactly_once=False)  # type: ignore[arg-type]
    batcher: MicroBatcher[Records] = MicroBatcher(100, 1000.0, clock, size=len)
    pause = InputPause(metrics)
    r = Rebalancer(Intake(), batcher, tracker, stalls, committer, pause, metrics,  # type: ignore[arg-type]
                   revoke_budget_s=budget_s, failed=lambda: False, rewinding=lambda: False, clock=clock)
    return r, consumer, tracker, batcher, committer, pause


def tps(*partitions: int) -> list[TopicPartition]:
    return [TopicPartition(T, p) for p in partitions]


def test_an_assignment_is_routed_tracked_and_takes_the_pause_state() -> None:
    r, consumer, tracker, _, committer, pause = setup()
    committer.ledger.start_at((T, 0), 99)  # from an earlier assignment of the same partition
    pause.paused = True
    r.on_assign(consumer, tps(0, 1))  # type: ignore[arg-type]
    assert r.intake.routed == [(T, 0), (T, 1)]  # type: ignore[union-attr]
    assert tracker.assigned() == [(T, 0), (T, 1)] and committer.ledger.position((T, 0)) is None
    assert consumer.calls == ["pause"]


def test_a_revoke_finishes_in_flight_records_commits_them_and_drops_unstarted_ones() -> None:
    r, consumer, tracker, batcher, committer, _ = setup()
    r.on_assign(consumer, tps(0, 1))  # type: ignore[arg-type]
    committer.ledger.start_at((T, 0), 0)
    span = tracker.dispatch((T, 0), 0, 9, 10)
    batcher.add([Records.build([b"a", b"b"], [None, None], [0, 1], [10, 0])])
    acker = threading.Timer(0.05, lambda: span.ack(10))  # the processing stage acknowledges meanwhile
    acker.start()
    r.on_revoke(consumer, tps(0))  # type: ignore[arg-type]
    acker.join()
    assert consumer.commits == [{(T, 0): 10}]
    assert tracker.assigned() == [(T, 1)] and len(batcher) == 1, "partition 1's record stays in the open batch"
    assert r.intake.forgotten == [0]  # type: ignore[union-attr]


def test_a_revoke_gives_up_on_records_not_acknowledged_within_its_budget(caplog: pytest.LogCaptureFixture) -> None:
    r, consumer, tracker, _, _, _ = setup(budget_s=1.0, clock=StepClock(0.1))
    r.on_assign(consumer, tps(0))  # type: ignore[arg-type]
    tracker.dispatch((T, 0), 0, 4, 5)  # never acknowledged
    r.on_revoke(consumer, tps(0))  # type: ignore[arg-type]
    assert consumer.commits == [] and tracker.assigned() == []
    assert "5 records still unacknowledged after 1.2s (the revoke's time was up)" in caplog.text


def test_once_publishing_ended_a_revoke_waits_for_no_acknowledgement(caplog: pytest.LogCaptureFixture) -> None:
    """The consumer's close revokes after the worker's publisher closed: records still in flight then were left
    undone (a batch abandoned while stopping), and waiting for them took the revoke's whole budget (30 s), past
    the close's own, so the group waited out the session timeout too."""
    r, consumer, tracker, _, committer, _ = setup(budget_s=30.0, clock=time.monotonic)
    r.on_assign(consumer, tps(0))  # type: ignore[arg-type]
    committer.ledger.start_at((T, 0), 0)
    tracker.dispatch((T, 0), 0, 4, 5).ack(5)
    tracker.dispatch((T, 0), 5, 9, 5)  # abandoned: never acknowledged
    r.publishing_ended()
    started = time.monotonic()
    r.on_revoke(consumer, tps(0))  # type: ignore[arg-type]
    assert time.monotonic() - started < 1.0
    assert consumer.commits == [{(T, 0): 5}], "what was acknowledged is committed, nothing past it"
    assert "5 records still unacknowledged" in caplog.text and "left undone" in caplog.text


def test_a_lost_assignment_commits_nothing_and_drops_its_state() -> None:
    r, consumer, tracker, batcher, _, _ = setup()
    r.on_assign(consumer, tps(0))  # type: ignore[arg-type]
    tracker.dispatch((T, 0), 0, 4, 5).ack(5)
    batcher.add([Records.build([b"a"], [None], [0], [5])])
    r.on_lost(consumer, tps(0))  # type: ignore[arg-type]
    assert consumer.commits == [] and tracker.assigned() == [] and len(batcher) == 0
    assert r.intake.forgotten == [0]  # type: ignore[union-attr]


def test_a_replica_without_partitions_warns_once_after_30_s(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    idle = IdleReplica("events", clock=lambda: now[0])
    idle.check(0, joined=False)  # not in the group yet: nothing to say
    now[0] = 100.0
    idle.check(0, joined=True)
    now[0] = 129.0
    idle.check(0, joined=True)
    assert "no partition" not in caplog.text
    for t in (130.0, 131.0, 500.0):
        now[0] = t
        idle.check(0, joined=True)
    assert caplog.text.count("held no partition of events for 30s") == 1
    idle.check(2, joined=True)  # partitions again, then none: a new 30 s
    now[0] = 510.0
    idle.check(0, joined=True)
    now[0] = 540.0
    idle.check(0, joined=True)
    assert caplog.text.count("held no partition of events") == 2
