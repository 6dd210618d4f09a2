"""The committer against a fake consumer: what goes out, when, and what a rebalance defers."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from stream.errors import KafkaClientError
from stream.kafka.deadline import Deadline
from stream.kafka.offsets import OffsetTracker
from stream.ops.metrics import StreamMetrics
from stream.ops.stalls import StallDetector
from stream.ops.summary import WorkerSummary
from stream.pipeline.committer import CommitLedger, Committer

TP = ("in", 0)


class FakeConsumer:
    """Sync commits fail with ``failures`` (in turn) before succeeding; records every call."""

    def __init__(self, failures: list[int] | None = None) -> None:
        self.failures = list(failures or [])
        self.commits: list[tuple[bool, dict[tuple[str, int], int]]] = []
        self.consumes = 0

    def commit(self, *, offsets: list[TopicPartition], asynchronous: bool) -> list[TopicPartition] | None:
        self.commits.append((asynchronous, {(tp.topic, tp.partition): tp.offset for tp in offsets}))
        if not asynchronous and self.failures:
            raise KafkaException(KafkaError(self.failures.pop(0)))
        return None if asynchronous else offsets

    def consume(self, num: int, timeout: float) -> list[Any]:
        self.consumes += 1
        return []


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def committer(consumer: FakeConsumer, *, exactly_once: bool = False,
              clock: Clock | None = None) -> tuple[Committer, OffsetTracker, WorkerSummary]:
    tracker, summary, clock = OffsetTracker(), WorkerSummary(), clock or Clock()
    metrics = StreamMetrics()
    ledger = CommitLedger(tracker, StallDetector(60.0, clock), summary, metrics, clock)
    c = Committer(consumer, ledger, tracker, metrics, exactly_once=exactly_once, clock=clock)  # type: ignore[arg-type]
    tracker.assign([TP])
    return c, tracker, summary


def test_one_async_commit_at_a_time_and_shutdown_retakes_what_it_holds() -> None:
    consumer = FakeConsumer()
    c, tracker, _ = committer(consumer)
    tracker.dispatch(TP, 0, 9, 10).ack(10)
    assert c.ledger.async_due()
    c.commit(asynchronous=True)
    assert consumer.commits == [(True, {TP: 10})]
    assert not c.ledger.async_due(), "a second async commit while the first has no answer"
    tracker.dispatch(TP, 10, 14, 5).ack(5)
    # Shutdown while the async commit of 10 is unanswered: the sync commit takes 15, and would take 10 too.
    c.commit_settled(Deadline(float("inf")))
    assert consumer.commits[-1] == (False, {TP: 15})
    # The async commit then fails (a rebalance moved the generation on): nothing is lost, 15 is confirmed.
    c.ledger.on_commit(KafkaError(KafkaError.ILLEGAL_GENERATION), [TopicPartition("in", 0, 10)])
    assert c.ledger.async_due()
    assert tracker.committable(unconfirmed=True) == {}


def test_an_unanswered_async_commit_is_given_up_on_after_30_s() -> None:
    clock = Clock()
    c, tracker, _ = committer(FakeConsumer(), clock=clock)
    tracker.dispatch(TP, 0, 0, 1).ack()
    c.commit(asynchronous=True)
    clock.now += 30.0
    assert not c.ledger.async_due()
    clock.now += 0.01
    assert c.ledger.async_due()


def test_a_failed_async_commit_offers_its_positions_again() -> None:
    consumer = FakeConsumer()
    c, tracker, summary = committer(consumer)
    tracker.dispatch(TP, 0, 9, 10).ack(10)
    c.commit(asynchronous=True)
    c.ledger.on_commit(KafkaError(KafkaError.REQUEST_TIMED_OUT), [TopicPartition("in", 0, 10)])
    c.commit(asynchronous=True)
    assert consumer.commits == [(True, {TP: 10}), (True, {TP: 10})]
    c.ledger.on_commit(None, [TopicPartition("in", 0, 10)])
    assert c.ledger.position(TP) == 10 and summary.last_committed_at is not None


def test_committed_counts_advance_from_the_assignments_first_offset() -> None:
    c, tracker, summary = committer(FakeConsumer())
    c.ledger.start_at(TP, 40)
    c.ledger.start_at(TP, 45)  # only the first dispatch sets the base
    tracker.dispatch(TP, 40, 49, 10).ack(10)
    assert c.commit(asynchronous=False)
    assert summary.committed == 10 and c.ledger.position(TP) == 50
    c.ledger.reassigned([TP])
    assert c.ledger.position(TP) is None


def test_shutdown_commit_deferred_by_a_rebalance_serves_the_group_and_commits_again() -> None:
    consumer = FakeConsumer([KafkaError.ILLEGAL_GENERATION, KafkaError.REBALANCE_IN_PROGRESS])
    c, tracker, _ = committer(consumer)
    tracker.dispatch(TP, 0, 9, 10).ack(10)
    c.ledger.start_at(TP, 0)
    c.commit(asynchronous=True)  # unanswered: its position must still go out with shutdown's commit
    c.commit_settled(Deadline(float("inf")))
    assert [x for x in consumer.commits if not x[0]] == [(False, {TP: 10})] * 3
    assert consumer.consumes == 2, "the group is served between the attempts"
    assert c.ledger.position(TP) == 10


def test_shutdown_commit_gives_up_at_the_deadline() -> None:
    consumer = FakeConsumer([KafkaError.REBALANCE_IN_PROGRESS] * 100)
    c, tracker, _ = committer(consumer)
    tracker.dispatch(TP, 0, 0, 1).ack()
    c.commit_settled(Deadline(0.0))  # already past: one attempt, no waiting
    assert len(consumer.commits) == 1 and consumer.consumes == 0


def test_any_other_commit_error_is_raised() -> None:
    c, tracker, _ = committer(FakeConsumer([KafkaError.GROUP_AUTHORIZATION_FAILED]))
    tracker.dispatch(TP, 0, 0, 1).ack()
    with pytest.raises(KafkaClientError):
        c.commit(asynchronous=False)


def test_exactly_once_positions_are_only_recorded() -> None:
    consumer = FakeConsumer()
    c, tracker, summary = committer(consumer, exactly_once=True)
    c.ledger.start_at(TP, 0)
    tracker.dispatch(TP, 0, 4, 5).ack(5)
    assert c.commit(asynchronous=True)
    assert consumer.commits == [] and c.ledger.position(TP) == 5 and summary.committed == 5


def test_commit_latency_by_mode_and_the_last_commits_time() -> None:
    clock = Clock()
    consumer = FakeConsumer()
    tracker, summary = OffsetTracker(), WorkerSummary()
    metrics = StreamMetrics()
    ledger = CommitLedger(tracker, StallDetector(60.0, clock), summary, metrics, clock)
    c = Committer(consumer, ledger, tracker, metrics, exactly_once=False, clock=clock)  # type: ignore[arg-type]
    tracker.assign([TP])
    started = metrics.last_commit._value.get()
    assert started > 0, "the worker's start until a commit advances a position"
    tracker.dispatch(TP, 0, 9, 10).ack(10)
    c.commit(asynchronous=True)
    clock.now += 0.04
    c.ledger.on_commit(None, [TopicPartition("in", 0, 10)])
    tracker.dispatch(TP, 10, 10, 1).ack()
    c.commit(asynchronous=False)
    seen = {(s.labels["mode"], s.name): s.value for f in metrics.registry.collect() if f.name == "stream_commit_seconds"
            for s in f.samples if s.name.endswith(("_count", "_sum"))}
    assert seen[("async", "stream_commit_seconds_count")] == 1
    assert seen[("async", "stream_commit_seconds_sum")] == pytest.approx(0.04)
    assert seen[("sync", "stream_commit_seconds_count")] == 1
    assert metrics.last_commit._value.get() == summary.last_committed_at >= started
