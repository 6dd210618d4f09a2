"""The processing stage's thread (`stream.stage`): batches in queue order, one batch ahead on an asynchronous
device, nothing published after a failure, delivery reports served while idle."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from stream.deadline import Deadline
from stream.errors import StreamError
from stream.metrics import StreamMetrics
from stream.processing import BatchProcessor, Begun, Dispatched
from stream.stage import ProcessingStage
from stream.transactions import Transactions
from tests.unit.test_processing import FakePublisher, batch_of, events, make


def predicted_offsets(pub: FakePublisher) -> list[int]:
    return [offset for _, _, offset in pub.sources()]


class Spy:
    """Wraps a BatchProcessor and records begin/complete/process calls by batch length."""

    def __init__(self, processor: BatchProcessor, fail_on: int | None = None) -> None:
        self.processor, self.fail_on, self.calls = processor, fail_on, []  # type: ignore[var-annotated]

    def begin(self, batch: Dispatched) -> Begun:
        self.calls.append(("begin", len(batch.records)))
        return self.processor.begin(batch)

    def complete(self, begun: Begun) -> None:
        self.calls.append(("complete", len(begun.batch.records)))
        if len(begun.batch.records) == self.fail_on:
            raise StreamError("publish failed")
        self.processor.complete(begun)

    def process(self, batch: Dispatched) -> None:
        self.calls.append(("process", len(batch.records)))
        self.processor.process(batch)


class Failures:
    def __init__(self) -> None:
        self.seen: list[BaseException] = []

    def fail(self, exc: BaseException) -> None:
        self.seen.append(exc)

    def failed(self) -> bool:
        return bool(self.seen)


def stage_of(processor: BatchProcessor | Spy, pub: FakePublisher, failures: Failures, *, pipelined: bool,
             inflight: int = 4) -> ProcessingStage:
    return ProcessingStage(processor, pub, Transactions(StreamMetrics(), "in", 60.0),  # type: ignore[arg-type]
                           max_inflight_batches=inflight, torch_threads=1, pipelined=pipelined, exactly_once=False,
                           fail=failures.fail, failed=failures.failed)


def run_stage(model_dir: Path, sizes: list[int], *, pipelined: bool,
              fail_on: int | None = None) -> tuple[Spy, FakePublisher, Failures]:
    """Queue batches of ``sizes``, then let the stage finish them and stop."""
    processor, pub = make(model_dir)
    spy, failures = Spy(processor, fail_on), Failures()
    stage = stage_of(spy, pub, failures, pipelined=pipelined, inflight=len(sizes))
    for n in sizes:
        batch = batch_of(events(n), pub)[0]
        assert stage.offer(lambda b=batch: b, 0)  # type: ignore[misc]
    stage.start()
    stage.finish(Deadline(30.0))
    return spy, pub, failures


def test_one_batch_ahead_on_an_asynchronous_device(model_dir: Path) -> None:
    spy, pub, _ = run_stage(model_dir, [3, 4, 5], pipelined=True)
    assert spy.calls == [("begin", 3), ("begin", 4), ("complete", 3), ("begin", 5), ("complete", 4),
                         ("complete", 5)]
    assert predicted_offsets(pub) == [0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3, 4]


def test_one_batch_at_a_time_otherwise(model_dir: Path) -> None:
    spy, pub, _ = run_stage(model_dir, [3, 4], pipelined=False)
    assert spy.calls == [("process", 3), ("process", 4)]
    assert len(predicted_offsets(pub)) == 7


def test_a_batch_ahead_is_never_published_after_a_failure(model_dir: Path) -> None:
    spy, pub, failures = run_stage(model_dir, [3, 4, 5], pipelined=True, fail_on=3)
    assert [type(e) for e in failures.seen] == [StreamError]
    assert ("complete", 4) not in spy.calls and ("complete", 5) not in spy.calls
    assert pub.sent == []


def test_a_queue_at_its_bound_refuses_more_until_the_stage_takes_one(model_dir: Path) -> None:
    processor, pub = make(model_dir)
    stage = stage_of(processor, pub, Failures(), pipelined=False, inflight=1)
    first, second = batch_of(events(2), pub)[0], batch_of(events(3), pub)[0]
    assert stage.offer(lambda: first, 0) and not stage.offer(lambda: second, 0.01)
    assert not stage.idle()
    stage.start()
    assert stage.offer(lambda: second, 5.0), "taken by the thread: a slot is free again"
    stage.finish(Deadline(30.0))
    assert len(predicted_offsets(pub)) == 5


def test_the_batch_ahead_completes_at_once_when_nothing_else_is_queued(model_dir: Path) -> None:
    """With an empty queue the stage finishes the batch on the device at once instead of waiting for the next."""
    processor, pub = make(model_dir)
    stage = stage_of(processor, pub, Failures(), pipelined=True)
    stage.start()
    try:
        batch = batch_of(events(5), pub)[0]
        assert stage.offer(lambda: batch, 0)
        for _ in range(200):
            if len(predicted_offsets(pub)) == 5:
                break
            threading.Event().wait(0.01)
        assert predicted_offsets(pub) == [0, 1, 2, 3, 4], "the only batch was held back waiting for a next one"
    finally:
        stage.finish(Deadline(5.0))


def test_a_delivery_callback_raising_while_idle_fails_the_worker_and_the_loop_goes_on(model_dir: Path) -> None:
    """The idle stage serves delivery reports; an exception from a callback there must fail the worker (which
    then stops), not end the processing thread silently."""
    processor, pub = make(model_dir)

    def serve() -> None:
        raise RuntimeError("a delivery callback failed")

    pub.serve = serve  # type: ignore[method-assign]
    failures = Failures()
    stage = stage_of(processor, pub, failures, pipelined=False)
    stage.start()
    try:
        for _ in range(200):
            if failures.seen:
                break
            threading.Event().wait(0.01)
        assert isinstance(failures.seen[0], RuntimeError)
        assert stage._thread.is_alive()
    finally:
        stage.finish(Deadline(5.0))
    assert not stage._thread.is_alive()


@pytest.mark.parametrize("stale", [True, False])
def test_batches_of_a_rewound_epoch_are_dropped(model_dir: Path, stale: bool) -> None:
    processor, pub = make(model_dir)
    stage = stage_of(processor, pub, Failures(), pipelined=False)
    if stale:
        stage._transactions.rewind_after = 0  # an aborted transaction of epoch 0
    batch = batch_of(events(4), pub)[0]
    assert stage.offer(lambda: batch, 0)
    stage.start()
    stage.finish(Deadline(30.0))
    assert len(predicted_offsets(pub)) == (0 if stale else 4)


def test_each_batch_reports_how_long_it_waited_in_the_queue(model_dir: Path) -> None:
    processor, pub = make(model_dir)
    waits: list[float] = []
    stage = ProcessingStage(processor, pub, Transactions(StreamMetrics(), "in", 60.0),  # type: ignore[arg-type]
                            max_inflight_batches=2, torch_threads=1, pipelined=False, exactly_once=False,
                            fail=Failures().fail, failed=Failures().failed, queue_wait=waits.append)
    first, second = batch_of(events(2), pub)[0], batch_of(events(3), pub)[0]
    assert stage.offer(lambda: first, 0) and stage.offer(lambda: second, 0)
    assert stage.queued() == 2
    threading.Event().wait(0.05)  # both wait at least this long before the thread starts
    stage.start()
    stage.finish(Deadline(30.0))
    assert len(waits) == 2 and all(0.05 <= w < 30.0 for w in waits)
    assert stage.queued() == 0
