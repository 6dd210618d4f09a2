"""The worker's commit calls against a fake consumer: what goes out, when, and what a rebalance defers."""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from stream.config import WorkerSettings
from stream.worker import Worker, WorkerSummary
from tests.handlers import PoisonHandler

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


@pytest.fixture
def worker(model_dir: Path) -> Worker:
    settings = WorkerSettings(bootstrap_servers="127.0.0.1:1", input_topic="in", output_topic="out",
                              group_id="g", model_dir=model_dir)
    w = Worker(settings, handler=PoisonHandler(model_dir))
    w._tracker.assign([TP])
    return w


def test_one_async_commit_at_a_time_and_shutdown_retakes_what_it_holds(worker: Worker) -> None:
    consumer = worker._consumer = FakeConsumer()  # type: ignore[assignment]
    worker._tracker.dispatch(TP, 0, 9, 10).ack(10)
    assert worker._async_commit_due()
    worker._commit(asynchronous=True)
    assert consumer.commits == [(True, {TP: 10})]
    assert not worker._async_commit_due(), "a second async commit while the first has no answer"
    worker._tracker.dispatch(TP, 10, 14, 5).ack(5)
    # Shutdown while the async commit of 10 is unanswered: the sync commit takes 15, and would take 10 too.
    worker._commit_settled(deadline=float("inf"))
    assert consumer.commits[-1] == (False, {TP: 15})
    # The async commit then fails (a rebalance moved the generation on): nothing is lost, 15 is confirmed.
    worker._on_commit(KafkaError(KafkaError.ILLEGAL_GENERATION), [TopicPartition("in", 0, 10)])
    assert worker._async_commit_due()
    assert worker._tracker.committable(unconfirmed=True) == {}


def test_shutdown_commit_deferred_by_a_rebalance_serves_the_group_and_commits_again(worker: Worker) -> None:
    consumer = worker._consumer = FakeConsumer([KafkaError.ILLEGAL_GENERATION, KafkaError.REBALANCE_IN_PROGRESS])
    worker._tracker.dispatch(TP, 0, 9, 10).ack(10)
    worker._commit(asynchronous=True)  # unanswered: its position must still go out with shutdown's commit
    worker._commit_settled(deadline=float("inf"))
    assert [c for c in consumer.commits if not c[0]] == [(False, {TP: 10})] * 3
    assert consumer.consumes == 2, "the group is served between the attempts"
    assert worker._committed_positions.get(TP) == 10


def test_shutdown_commit_gives_up_at_the_deadline(worker: Worker) -> None:
    consumer = worker._consumer = FakeConsumer([KafkaError.REBALANCE_IN_PROGRESS] * 100)
    worker._tracker.dispatch(TP, 0, 0, 1).ack()
    worker._commit_settled(deadline=0.0)  # already past: one attempt, no waiting
    assert len(consumer.commits) == 1 and consumer.consumes == 0


def test_run_shortens_the_gil_switch_interval_raises_the_gc_threshold_and_restores_both(
        worker: Worker, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[float, tuple[int, int, int]]] = []

    def fake_run() -> WorkerSummary:
        seen.append((sys.getswitchinterval(), gc.get_threshold()))
        raise RuntimeError("stop here")

    before, gc_before = sys.getswitchinterval(), gc.get_threshold()
    monkeypatch.setattr(worker, "_run", fake_run)
    with pytest.raises(RuntimeError, match="stop here"):
        worker.run()
    assert seen == [(pytest.approx(0.001), (50_000, *gc_before[1:]))] and worker.settings.gil_switch_interval_ms == 1.0
    assert sys.getswitchinterval() == before and gc.get_threshold() == gc_before


class RewindConsumer:
    """committed() times out ``timeouts`` times, then answers offset 7 for every partition; seek() fails with
    ``seek_errors[partition]`` where given."""

    def __init__(self, timeouts: int, partitions: int = 1, seek_errors: dict[int, int] | None = None) -> None:
        self.timeouts = timeouts
        self.partitions = partitions
        self.seek_errors = seek_errors or {}
        self.seeks: list[tuple[str, int, int]] = []

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(TP[0], p) for p in range(self.partitions)]

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        if self.timeouts:
            self.timeouts -= 1
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        return [TopicPartition(tp.topic, tp.partition, 7) for tp in partitions]

    def seek(self, tp: TopicPartition) -> None:
        if tp.partition in self.seek_errors:
            raise KafkaException(KafkaError(self.seek_errors[tp.partition]))
        self.seeks.append((tp.topic, tp.partition, tp.offset))


def test_a_rewind_whose_committed_offsets_time_out_stays_pending_and_is_tried_again(worker: Worker) -> None:
    """Exactly-once after an aborted transaction: a coordinator that does not answer in time (seen when a
    replica was frozen mid-call) must not fail the worker; the rewind is retried by the next loop."""
    consumer = worker._consumer = RewindConsumer(timeouts=1)  # type: ignore[assignment]
    worker._rewind_after = worker._epoch
    worker._rewind()
    assert worker._rewind_pending() and consumer.seeks == []
    worker._rewind()
    assert not worker._rewind_pending() and consumer.seeks == [("in", 0, 7)]


def test_a_rewind_leaves_partitions_that_are_not_fetching_yet_to_start_at_their_committed_offset(
        worker: Worker) -> None:
    """librdkafka refuses to seek a partition whose fetch has not started (its committed offset is still being
    read, e.g. held by a frozen replica's open transaction): _STATE. Nothing was taken from it, so there is
    nothing to rewind; the worker must not fail (seen in a freeze/thaw run: exit 1)."""
    worker._tracker.assign([("in", p) for p in range(3)])
    consumer = worker._consumer = RewindConsumer(  # type: ignore[assignment]
        timeouts=0, partitions=3, seek_errors={1: KafkaError._STATE, 2: KafkaError._PREV_IN_PROGRESS})
    worker._rewind_after = worker._epoch
    worker._rewind()
    assert not worker._rewind_pending() and consumer.seeks == [("in", 0, 7)]


def test_a_rewind_fails_the_worker_on_any_other_seek_error(worker: Worker) -> None:
    worker._consumer = RewindConsumer(timeouts=0, seek_errors={0: KafkaError._UNKNOWN_PARTITION})  # type: ignore[assignment]
    worker._rewind_after = worker._epoch
    with pytest.raises(KafkaException):
        worker._rewind()


def test_the_model_and_both_schemas_are_named_in_stream_model_info(worker: Worker) -> None:
    from prometheus_client import generate_latest

    text = generate_latest(worker.metrics.registry).decode()
    line = next(ln for ln in text.splitlines() if ln.startswith("stream_model_info{"))
    for part in ('name="demo-fraud-mlp"', 'device="cpu"', 'input_schema="stream.demo.FraudEvent:1"',
                 'output_schema="stream.demo.FraudPrediction:3"'):
        assert part in line, line
