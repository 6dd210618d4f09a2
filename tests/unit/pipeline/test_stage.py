"""The stages (`stream.pipeline.stage`): a prepare pool, the device thread and the finish thread; batches published in
the order they were offered whatever order their prepares end in, each stage working on another batch than the
others, nothing published after a failure, delivery reports served while idle, per-stage metrics."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from stream.errors import StreamError
from stream.kafka.deadline import Deadline
from stream.ops.metrics import StreamMetrics
from stream.pipeline.processing import Abandoned, BatchProcessor, Begun, Dispatched
from stream.pipeline.stage import ProcessingStages
from stream.pipeline.transactions import Transactions
from tests.unit.pipeline.test_processing import FakePublisher, batch_of, events, make

WAIT_S = 10.0  # a bound for events the stages must bring about, never reached when they work


def predicted_offsets(pub: FakePublisher) -> list[int]:
    return [offset for _, _, offset in pub.sources()]


class Spy:
    """Wraps a BatchProcessor: records its calls by batch length, and can hold a step until a test lets it go."""

    def __init__(self, processor: BatchProcessor) -> None:
        self.processor = processor
        self.engine = processor.engine
        self.calls: list[tuple[str, int]] = []
        self.hold: dict[tuple[str, int], threading.Event] = {}  # (step, batch length) -> waits for it
        self.raise_at: dict[tuple[str, int], BaseException] = {}
        self._lock = threading.Lock()

    def _step(self, name: str, n: int) -> None:
        with self._lock:
            self.calls.append((name, n))
        gate = self.hold.get((name, n))
        if gate is not None:
            assert gate.wait(WAIT_S), f"{name} of the batch of {n} was held past the test's bound"
        error = self.raise_at.get((name, n))
        if error is not None:
            raise error

    def prepare(self, batch: Dispatched) -> Begun:
        self._step("prepare", len(batch.records))
        return self.processor.prepare(batch)

    def submit(self, begun: Begun) -> Begun:
        self._step("submit", len(begun.batch.records))
        return self.processor.submit(begun)

    def complete(self, begun: Begun) -> None:
        self._step("complete", len(begun.batch.records))
        self.processor.complete(begun)


class Failures:
    def __init__(self) -> None:
        self.seen: list[BaseException] = []

    def fail(self, exc: BaseException) -> None:
        self.seen.append(exc)

    def failed(self) -> bool:
        return bool(self.seen)


def stages_of(processor: BatchProcessor | Spy, pub: FakePublisher, failures: Failures, *, inflight: int = 4,
              prepare_threads: int = 2, metrics: StreamMetrics | None = None,
              on_idle: object = None) -> ProcessingStages:
    return ProcessingStages(processor, pub, Transactions(StreamMetrics(), "in", 60.0),  # type: ignore[arg-type]
                            max_inflight_batches=inflight, prepare_threads=prepare_threads, torch_threads=1,
                            overlap=True, exactly_once=False, fail=failures.fail, failed=failures.failed,
                            metrics=metrics, on_idle=on_idle)  # type: ignore[arg-type]


def offer_all(stages: ProcessingStages, pub: FakePublisher, sizes: list[int]) -> None:
    for n in sizes:
        batch = batch_of(events(n), pub)[0]
        assert stages.offer(lambda b=batch: b, 0)  # type: ignore[misc]


def wait_for(condition: object, what: str) -> None:
    deadline = Deadline(WAIT_S)
    while not condition() and not deadline.passed():  # type: ignore[operator]
        threading.Event().wait(0.005)
    assert condition(), what  # type: ignore[operator]


def test_batches_are_published_in_the_order_offered_whatever_order_their_prepares_end_in(model_dir: Path) -> None:
    processor, pub = make(model_dir)
    spy = Spy(processor)
    first = spy.hold[("prepare", 3)] = threading.Event()  # the first batch's prepare ends last
    stages = stages_of(spy, pub, Failures(), prepare_threads=3)
    stages.start()
    offer_all(stages, pub, [3, 4, 5])
    wait_for(lambda: ("prepare", 5) in spy.calls and ("prepare", 4) in spy.calls, "the pool prepared on")
    assert ("submit", 4) not in spy.calls, "the device took a batch out of order"
    first.set()
    stages.finish(Deadline(30.0))
    for step in ("submit", "complete"):
        assert [n for name, n in spy.calls if name == step] == [3, 4, 5]
    assert predicted_offsets(pub) == [0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3, 4]


def test_each_stage_works_on_its_own_batch_at_the_same_time(model_dir: Path) -> None:
    """While the finish thread is held on the first batch, the device runs the second and a prepare thread the
    third: the worker runs at its slowest stage's rate, not at the sum of them (a serial design would never
    reach the second batch's submit before the first batch's complete returned)."""
    processor, pub = make(model_dir)
    spy = Spy(processor)
    finishing = spy.hold[("complete", 3)] = threading.Event()
    submitting = spy.hold[("submit", 4)] = threading.Event()
    stages = stages_of(spy, pub, Failures(), prepare_threads=1)
    stages.start()
    offer_all(stages, pub, [3, 4, 5])
    wait_for(lambda: {("complete", 3), ("submit", 4), ("prepare", 5)} <= set(spy.calls),
             "the three stages did not hold three batches at once")
    assert pub.sent == [], "nothing published while the finish thread is held"
    submitting.set()
    finishing.set()
    stages.finish(Deadline(30.0))
    assert predicted_offsets(pub) == [0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3, 4]


def test_nothing_is_published_after_a_failure(model_dir: Path) -> None:
    processor, pub = make(model_dir)
    spy = Spy(processor)
    spy.raise_at[("complete", 3)] = StreamError("publish failed")
    failures = Failures()
    stages = stages_of(spy, pub, failures)
    offer_all(stages, pub, [3, 4, 5])
    stages.start()
    stages.finish(Deadline(30.0))
    assert [type(e) for e in failures.seen] == [StreamError]
    assert ("complete", 4) not in spy.calls and ("complete", 5) not in spy.calls
    assert pub.sent == []


def test_a_failed_prepare_fails_the_worker_in_order(model_dir: Path) -> None:
    """The batches offered before it are published; it and those after are not."""
    processor, pub = make(model_dir)
    spy = Spy(processor)
    spy.raise_at[("prepare", 4)] = RuntimeError("decode failed")
    failures = Failures()
    stages = stages_of(spy, pub, failures, prepare_threads=3)
    offer_all(stages, pub, [3, 4, 5])
    stages.start()
    stages.finish(Deadline(30.0))
    assert [str(e) for e in failures.seen] == ["decode failed"]
    assert predicted_offsets(pub) == [0, 1, 2]


def test_a_batch_abandoned_while_stopping_leaves_the_ones_after_it_unpublished(model_dir: Path) -> None:
    processor, pub = make(model_dir)
    spy = Spy(processor)
    spy.raise_at[("prepare", 4)] = Abandoned("stopping while the schema registry is unreachable")
    failures = Failures()
    stages = stages_of(spy, pub, failures)
    offer_all(stages, pub, [3, 4, 5])
    stages.start()
    stages.finish(Deadline(30.0))
    assert failures.seen == [], "abandoning is not a failure"
    assert predicted_offsets(pub) == [0, 1, 2]


def test_the_first_queue_at_its_bound_refuses_more_until_the_device_takes_one(model_dir: Path) -> None:
    processor, pub = make(model_dir)
    stages = stages_of(processor, pub, Failures(), inflight=1)
    first, second = batch_of(events(2), pub)[0], batch_of(events(3), pub)[0]
    assert stages.offer(lambda: first, 0) and not stages.offer(lambda: second, 0.01)
    assert not stages.idle() and stages.queued() == 1
    stages.start()
    assert stages.offer(lambda: second, 5.0), "taken by the device: a slot is free again"
    stages.finish(Deadline(30.0))
    assert len(predicted_offsets(pub)) == 5


def test_idle_once_every_batch_is_settled_and_the_poll_thread_is_woken(model_dir: Path) -> None:
    processor, pub = make(model_dir)
    woken = threading.Event()
    stages = stages_of(processor, pub, Failures(), on_idle=woken.set)
    assert stages.idle()
    stages.start()
    try:
        offer_all(stages, pub, [5])
        assert woken.wait(WAIT_S), "the last batch out did not wake the poll thread"
        assert stages.idle() and predicted_offsets(pub) == [0, 1, 2, 3, 4]
        assert pub.kicks[-1] == 5, "sent at once: the finish thread flushes when it runs out of work"
    finally:
        stages.finish(Deadline(5.0))


def test_a_delivery_callback_raising_while_idle_fails_the_worker_and_the_stages_go_on(model_dir: Path) -> None:
    """The idle finish thread serves delivery reports; an exception from a callback there must fail the worker
    (which then stops), not end the thread silently."""
    processor, pub = make(model_dir)

    def serve() -> None:
        raise RuntimeError("a delivery callback failed")

    pub.serve = serve  # type: ignore[method-assign]
    failures = Failures()
    stages = stages_of(processor, pub, failures)
    stages.start()
    try:
        wait_for(lambda: failures.seen, "the callback's error did not fail the worker")
        assert isinstance(failures.seen[0], RuntimeError)
        assert all(t.is_alive() for t in stages._threads)
    finally:
        stages.finish(Deadline(5.0))
    assert not any(t.is_alive() for t in stages._threads)


@pytest.mark.parametrize("stale", [True, False])
def test_batches_of_a_rewound_epoch_are_dropped(model_dir: Path, stale: bool) -> None:
    processor, pub = make(model_dir)
    spy = Spy(processor)
    stages = stages_of(spy, pub, Failures())
    if stale:
        stages._transactions.rewind_after = 0  # an aborted transaction of epoch 0
    offer_all(stages, pub, [4])
    stages.start()
    stages.finish(Deadline(30.0))
    assert len(predicted_offsets(pub)) == (0 if stale else 4)
    assert (spy.calls == []) == stale, "a stale batch is not even prepared"
    assert stages.idle()


def test_each_stage_reports_its_busy_time_threads_and_queue_and_each_batch_its_wait(model_dir: Path) -> None:
    processor, pub = make(model_dir)
    metrics = StreamMetrics()
    stages = stages_of(processor, pub, Failures(), prepare_threads=3, metrics=metrics)
    offer_all(stages, pub, [2, 3])
    assert stages.queued() == 2
    assert metrics.registry.get_sample_value("stream_stage_queue_batches", {"stage": "prepare"}) == 2
    threading.Event().wait(0.05)  # both wait at least this long before the threads start
    stages.start()
    stages.finish(Deadline(30.0))
    sample = metrics.registry.get_sample_value
    assert [sample("stream_stage_threads", {"stage": s}) for s in ("prepare", "device", "finish")] == [3, 1, 1]
    assert all(sample("stream_stage_busy_seconds_total", {"stage": s}) > 0 for s in ("prepare", "device", "finish"))
    assert all(sample("stream_stage_cpu_seconds_total", {"stage": s}) > 0 for s in ("prepare", "device", "finish"))
    assert all(sample("stream_stage_queue_batches", {"stage": s}) == 0 for s in ("prepare", "device", "finish"))
    counts, total = metrics.queue_wait_seconds.snapshot()
    assert counts.sum() == 2 and 0.1 <= total < 60.0


class Timed(Spy):
    """Each prepare uses ``PREPARE_CPU_S`` of its thread's CPU; each submit waits ``SUBMIT_WAIT_S`` using none
    (as a thread waiting for the GIL, or for a core, would)."""

    PREPARE_CPU_S, SUBMIT_WAIT_S = 0.05, 0.2

    def _step(self, name: str, n: int) -> None:
        if name == "prepare":
            until = time.thread_time() + self.PREPARE_CPU_S
            while time.thread_time() < until:
                pass
        elif name == "submit":
            threading.Event().wait(self.SUBMIT_WAIT_S)


def test_a_stage_s_cpu_seconds_count_its_thread_s_work_and_not_its_waits(model_dir: Path) -> None:
    """Busy minus CPU is how long a working stage waited: the prepares' CPU is counted in full, the submits'
    waits are busy time but no CPU."""
    processor, pub = make(model_dir)
    metrics = StreamMetrics()
    stages = stages_of(Timed(processor), pub, Failures(), prepare_threads=2, metrics=metrics)
    stages.start()
    offer_all(stages, pub, [2, 3])
    stages.finish(Deadline(30.0))
    busy, cpu = stages.busy_seconds(), stages.cpu_seconds()
    assert cpu["prepare"] >= 2 * Timed.PREPARE_CPU_S and busy["prepare"] >= cpu["prepare"]
    assert busy["device"] >= 2 * Timed.SUBMIT_WAIT_S and cpu["device"] < Timed.SUBMIT_WAIT_S, (busy, cpu)
    assert 0 < cpu["finish"] <= busy["finish"] + 0.01


def test_after_a_failure_an_idle_finish_thread_aborts_its_transaction_at_once_and_a_hung_device_is_left(
        model_dir: Path) -> None:
    """A device thread inside a call that never returns hands nothing on: the finish thread must not wait for a
    next batch to abort the open transaction, and `finish` reports the thread it could not end."""
    processor, pub = make(model_dir)
    spy = Spy(processor)
    never = spy.hold[("submit", 4)] = threading.Event()
    failures = Failures()
    stages = stages_of(spy, pub, failures)
    aborts: list[float] = []
    stages._transactions.abort = lambda _publisher: aborts.append(time.monotonic())  # type: ignore[method-assign]
    offer_all(stages, pub, [3, 4])
    stages.start()
    try:
        wait_for(lambda: predicted_offsets(pub) == [0, 1, 2] and ("submit", 4) in spy.calls,
                 "the first batch was not published, or the second not submitted")
        assert aborts == []
        failed_at = time.monotonic()
        failures.fail(StreamError("the model hung"))
        wait_for(lambda: aborts, "the idle finish thread did not abort the transaction")
        assert aborts[0] - failed_at < 1.0
        started = time.monotonic()
        assert [t.name for t in stages.finish(Deadline(0.3))] == ["device", "finish"]
        assert time.monotonic() - started < 2.0
    finally:
        never.set()
        stages.finish(Deadline(5.0))
    assert not any(t.is_alive() for t in stages._threads)
    assert predicted_offsets(pub) == [0, 1, 2], "nothing is published after the failure"
