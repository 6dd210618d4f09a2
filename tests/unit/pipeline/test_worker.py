"""The worker as a whole, without a broker: what it says about itself at start-up, and how the poll thread
turns taken records into dispatched batches (the poll loop's pausing is in test_pausing.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from stream.config import WorkerSettings
from stream.kafka.records import Records
from stream.pipeline.spans import Spans
from stream.pipeline.worker import Worker
from tests.handlers import PoisonHandler


class NoConsumer:
    """Nothing is consumed here; the worker only needs the object."""

    def assignment(self) -> list[Any]:
        return []


class NoPublisher:
    def failure(self) -> None:
        return None


@pytest.fixture
def worker(model_dir: Path) -> Worker:
    settings = WorkerSettings(bootstrap_servers="127.0.0.1:1", input_topic="in", output_topic="out",
                              group_id="g", model_dir=model_dir, max_batch_size=4, native_consumer=False)
    return Worker(settings, handler=PoisonHandler(model_dir))


def connected_spans(worker: Worker) -> Spans:
    """The worker's parts built over clients that are never used here."""
    return worker._connect(NoConsumer(), NoPublisher()).spans  # type: ignore[arg-type]


def records(partitions: list[int], offsets: list[int]) -> Records:
    return Records.build([b"v"] * len(partitions), [None] * len(partitions), partitions, offsets)


def test_the_model_and_both_schemas_are_named_in_stream_model_info(worker: Worker) -> None:
    text = generate_latest(worker.metrics.registry).decode()
    line = next(ln for ln in text.splitlines() if ln.startswith("stream_model_info{"))
    for part in ('name="demo-fraud-mlp"', 'device="cpu"', 'input_schema="stream.demo.FraudEvent:1"',
                 'output_schema="stream.demo.FraudPrediction:3"', 'shadow="false"'):
        assert part in line, line


def test_records_of_partitions_no_longer_assigned_are_dropped_when_taken(worker: Worker) -> None:
    batches = connected_spans(worker)
    worker._tracker.assign([("in", 0)])
    batches.accept(records([0, 1, 0], [5, 9, 6]))
    assert worker._summary.consumed == 2 and len(worker._batcher) == 2


def test_a_closed_batch_is_one_span_per_partition_and_sets_the_commit_base(worker: Worker) -> None:
    batches = connected_spans(worker)
    worker._tracker.assign([("in", 0), ("in", 1)])
    batches.accept(records([0, 1, 0], [5, 9, 6]))
    batch = batches.close_batch()
    spans = {p: (d.span.first, d.span.last, d.span.count) for p, d in batch.deliveries.items()}
    assert spans == {0: (5, 6, 2), 1: (9, 9, 1)} and worker._tracker.in_flight() == 3
    assert worker._ledger.position(("in", 0)) == 5 and worker._ledger.position(("in", 1)) == 9
    assert len(worker._batcher) == 0 and worker._summary.batches == 1


def test_a_batch_over_its_size_is_cut_and_the_rest_stays_open(worker: Worker) -> None:
    """Records taken while paused can overfill the open batch: only max_batch_size of them go."""
    batches = connected_spans(worker)
    worker._tracker.assign([("in", 0)])
    batches.accept(records([0] * 6, list(range(6))))
    assert len(batches.close_batch().records) == 4 and len(worker._batcher) == 2


def test_a_range_the_consumer_hands_over_twice_after_a_seek_is_taken_once(
        worker: Worker, caplog: pytest.LogCaptureFixture) -> None:
    """Seen in a long exactly-once chaos run right after a rewind's seek: one batch held offsets 240935..240952
    of a partition twice, and the span check stopped the worker. The second copy is dropped when taken."""
    batches = connected_spans(worker)
    worker._tracker.assign([("in", 0), ("in", 1)])
    batches.accept(records([0, 0, 1, 0, 0, 1, 0], [10, 11, 3, 10, 11, 3, 12]))
    batch = batches.close_batch()
    assert batch.offsets.tolist() == [10, 11, 3, 12]
    spans = {p: (d.span.first, d.span.last, d.span.count) for p, d in batch.deliveries.items()}
    assert spans == {0: (10, 12, 3), 1: (3, 3, 1)}
    batches.accept(records([0, 0, 0], [11, 12, 13]))  # a later take repeating what the batch before held
    assert batches.close_batch().offsets.tolist() == [13]
    assert worker._summary.consumed == 5
    assert "dropped 3 records taken a second time from the consumer (partitions [0, 1], offsets 3..11)" in caplog.text
    worker._tracker.forget([("in", 0)])  # a rewind (or a new assignment) starts the partition over
    worker._tracker.assign([("in", 0)])
    batches.accept(records([0, 0], [10, 11]))
    assert batches.close_batch().offsets.tolist() == [10, 11]


class TextLike(PoisonHandler):
    max_tokens = 10  # a text model's cut: each record counts min(its bytes + 2, 10) tokens


def test_a_token_budget_closes_a_batch_at_its_texts_most_tokens_and_the_rest_opens_the_next(model_dir: Path) -> None:
    settings = WorkerSettings(bootstrap_servers="127.0.0.1:1", input_topic="in", output_topic="out", group_id="g",
                              model_dir=model_dir, max_batch_size=100, max_batch_tokens=25, native_consumer=False)
    w = Worker(settings, handler=TextLike(model_dir))
    batches = connected_spans(w)
    w._tracker.assign([("in", 0)])
    sizes = [3, 500, 1, 6, 2]  # value bytes: at most 5, 10, 3, 8, 4 tokens
    batches.accept(Records.build([b"x" * n for n in sizes], [None] * 5, [0] * 5, range(5)))
    assert w._batcher.ready() and w._batcher.weight == 30
    first = batches.close_batch()
    assert first.offsets.tolist() == [0, 1, 2]  # 5 + 10 + 3 = 18; with the next 8, 26 > 25
    assert w._batcher.weight == 12 and not w._batcher.ready()
    assert batches.close_batch().offsets.tolist() == [3, 4]


def test_a_token_budget_needs_a_text_model_and_room_for_one_text(model_dir: Path) -> None:
    from stream.errors import ConfigError

    base = {"bootstrap_servers": "127.0.0.1:1", "input_topic": "in", "output_topic": "out", "group_id": "g",
            "model_dir": model_dir, "native_consumer": False}
    with pytest.raises(ConfigError, match="takes no tokens"):
        Worker(WorkerSettings(**base, max_batch_tokens=100), handler=PoisonHandler(model_dir))
    with pytest.raises(ConfigError, match="below the model's --max-tokens 10"):
        Worker(WorkerSettings(**base, max_batch_tokens=9), handler=TextLike(model_dir))


def test_a_batch_over_both_its_size_and_its_token_budget_is_cut_once_and_the_rest_stays_in_order(
        model_dir: Path) -> None:
    settings = WorkerSettings(bootstrap_servers="127.0.0.1:1", input_topic="in", output_topic="out", group_id="g",
                              model_dir=model_dir, max_batch_size=4, max_batch_tokens=25, native_consumer=False)
    w = Worker(settings, handler=TextLike(model_dir))
    batches = connected_spans(w)
    w._tracker.assign([("in", 0)])
    # Six records taken at once (over the size of 4), each counting 10 tokens: the first two fit 25.
    batches.accept(Records.build([b"x" * 20] * 6, [None] * 6, [0] * 6, range(6)))
    assert batches.close_batch().offsets.tolist() == [0, 1]
    assert batches.close_batch().offsets.tolist() == [2, 3]
    assert batches.close_batch().offsets.tolist() == [4, 5]


mib = 1_048_576


def byte_bound_worker(model_dir: Path, max_batch_bytes: int) -> tuple[Worker, Spans]:
    """A worker of --max-batch-bytes ``max_batch_bytes`` and its spans, partition 0 of "in" assigned."""
    settings = WorkerSettings(bootstrap_servers="127.0.0.1:1", input_topic="in", output_topic="out", group_id="g",
                              model_dir=model_dir, max_batch_bytes=max_batch_bytes, native_consumer=False)
    w = Worker(settings, handler=PoisonHandler(model_dir))
    batches = connected_spans(w)
    w._tracker.assign([("in", 0)])
    return w, batches


def test_a_byte_bound_cuts_a_batch_of_large_values_and_no_part_keeps_much_more_of_the_take_alive(
        model_dir: Path) -> None:
    """A take of large values (one buffer) is cut at --max-batch-bytes: without buffers of their own, each batch
    cut from it kept the whole take alive until the last of them was done."""
    w, batches = byte_bound_worker(model_dir, 3 * mib + mib // 2)
    values = [bytes([65 + i]) * mib for i in range(10)]  # 10 MiB in one take
    batches.accept(Records.build(values, [None] * 10, [0] * 10, range(10)))
    assert w._batcher.ready() and w._batcher.bytes == 10 * mib
    cut = []
    while len(w._batcher):
        batch = batches.close_batch().records
        assert batch.nbytes <= 3 * mib + mib // 2
        assert len(batch.buffer) <= 2 * max(batch.nbytes, mib), (len(batch.buffer), batch.nbytes)
        cut.append(batch.values())
    assert [len(c) for c in cut] == [3, 3, 3, 1] and [v for c in cut for v in c] == values
    # a value over the bound is a batch of its own
    batches.accept(Records.build([b"x" * 4 * mib, b"y"], [None] * 2, [0] * 2, [10, 11]))
    assert batches.close_batch().records.values() == [b"x" * 4 * mib]
    assert batches.close_batch().records.values() == [b"y"]


@pytest.mark.parametrize("beside", ["header", "key"])
def test_a_byte_bound_counts_the_keys_and_watched_headers_a_batch_holds_beside_its_values(
        model_dir: Path, beside: str) -> None:
    """A producer of small values with large keys, or carrying large headers the worker keeps (a trace context, a
    reply address, a --copy-headers name): their bytes count toward --max-batch-bytes as a value's do, so batches
    of them are cut too, each record's with it."""
    w, batches = byte_bound_worker(model_dir, 3 * mib + mib // 2)
    large = [bytes([65 + i]) * mib for i in range(10)]
    if beside == "header":
        replies = {i: (None, None, None, None, large[i], None, 0, 0) for i in range(10)}
        batches.accept(Records.build([b"v"] * 10, [None] * 10, [0] * 10, range(10), replies))
    else:
        batches.accept(Records.build([b"v"] * 10, list(large), [0] * 10, range(10)))
    assert w._batcher.ready() and w._batcher.bytes == 10 * mib + 10
    cut = []
    while len(w._batcher):
        batch = batches.close_batch().records
        assert batch.nbytes <= 3 * mib + mib // 2
        cut.append(batch.keys if beside == "key" else [batch.replies[i][4] for i in range(len(batch))])
    assert [len(c) for c in cut] == [3, 3, 3, 1] and [v for c in cut for v in c] == large


def test_takes_are_sized_by_the_bytes_the_open_batch_has_room_for(worker: Worker) -> None:
    # nothing taken yet: values as large as --max-input-bytes (1 MiB) are assumed, 32 of them in 32 MiB
    assert worker._largest_record == 1_048_576 and worker._take_n() == 4  # the count's room, 4
    worker._batcher.max_bytes = 10_000
    assert worker._take_n() == 1
    worker._largest_record = 3_000
    assert worker._take_n() == 3
    worker._batcher.add([Records.build([b"v" * 9_000], [None], [0], [0])])
    assert worker._take_n() == 1  # at least one
    worker._largest_record = 10
    assert worker._take_n() == 3  # the count's room left


def test_a_batch_byte_bound_is_a_flag_with_its_default_and_its_floor() -> None:
    from pydantic import ValidationError

    base = {"input_topic": "in", "output_topic": "out", "group_id": "g"}
    assert WorkerSettings(**base).max_batch_bytes == 32 * 1_048_576
    with pytest.raises(ValidationError, match="max_batch_bytes"):
        WorkerSettings(**base, max_batch_bytes=100)


@pytest.mark.parametrize("stopping", [False, True])
def test_the_warm_up_is_logged_as_done_only_when_it_ran_every_batch(
        worker: Worker, stopping: bool, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A stop during the warm-up (a SIGTERM at start-up) ends it early: the log says so, not "warmed"."""
    def warm(_limit_s: float, stop: Any, progress: Any) -> tuple[int, int, float]:
        progress(1, 2)
        return (1 if stop() else 2), 2, 0.3

    monkeypatch.setattr(worker._engine, "warm", warm)
    if stopping:
        worker.request_stop()
    with caplog.at_level("INFO", logger="stream.pipeline.worker"):
        worker._warm()
    assert worker.health.warming is None
    expected = ("warm-up left after 1 of 2 batches (0.3 s): the worker is stopping" if stopping
                else "model warmed in 0.3 s: 2 of 2 batches of the shapes it will use")
    assert [r.getMessage() for r in caplog.records] == [expected]


def test_a_start_up_step_gives_its_result_or_its_error_and_ends_at_once_when_stopped() -> None:
    import threading
    import time

    from stream.errors import ConfigError, StoppedAtStartUp
    from stream.kafka.guarded import unless_stopped

    assert unless_stopped(lambda: 7, lambda: False, "adding") == 7

    def refuse() -> int:
        raise ConfigError("no such subject")

    with pytest.raises(ConfigError, match="no such subject"):
        unless_stopped(refuse, lambda: False, "refusing")
    never = threading.Event()
    stop = threading.Timer(0.3, lambda: None)
    stop.start()
    started = time.monotonic()
    with pytest.raises(StoppedAtStartUp, match="waiting for a registry"):
        unless_stopped(lambda: never.wait(30), lambda: not stop.is_alive(), "waiting for a registry")
    assert time.monotonic() - started < 2.0
    never.set()


def test_a_model_call_past_its_timeout_fails_the_worker_with_its_stack_and_the_probes_say_so(
        model_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A call into the model that never returns leaves the poll loop turning and the partitions held: past
    --model-timeout-s liveness fails, and the poll loop's check fails the worker with a ModelHung naming the
    call, the thread's stack in the log."""
    import threading

    import numpy as np

    from stream.errors import ModelHung

    settings = WorkerSettings(bootstrap_servers="127.0.0.1:1", input_topic="in", output_topic="out", group_id="g",
                              model_dir=model_dir, native_consumer=False, model_timeout_s=5)
    w = Worker(settings, handler=PoisonHandler(model_dir))
    engine = w._engine
    now = [100.0]
    engine.calls._clock = lambda: now[0]
    gate, entered = threading.Event(), threading.Event()
    real = engine.handler.predict

    def hanging_predict(inputs: Any) -> Any:
        entered.set()
        assert gate.wait(30), "the test never let the model go"
        return real(inputs)

    monkeypatch.setattr(engine.handler, "predict", hanging_predict)
    thread = threading.Thread(target=lambda: engine.run(np.zeros((7, 32), np.float32)), name="device")
    thread.start()
    try:
        assert entered.wait(30)
        call = engine.calls.longest()
        assert call is not None and (call.what, call.n, call.thread) == ("predict", 7, thread.ident)
        now[0] += 4.9
        w._check_model()
        assert w._failure.error is None and w.health.live() == []
        now[0] += 0.1
        why = "the model's predict on a batch of 7 has not returned for 5 s (--model-timeout-s 5)"
        assert w.health.live() == [why] and why in w.health.ready()
        with caplog.at_level("ERROR", logger="stream.pipeline.worker"):
            w._check_model()
        assert isinstance(w._failure.error, ModelHung) and str(w._failure.error) == why
        assert w._stop.is_set()
        [logged] = [r.getMessage() for r in caplog.records if r.name == "stream.pipeline.worker"]
        assert logged.startswith(why + ": stopping without it") and "Thread device is at:" in logged
        assert "in hanging_predict" in logged and "gate.wait(30)" in logged, logged
    finally:
        gate.set()
        thread.join(10)
    assert engine.calls.longest() is None, "a call that returned is no longer under way"


def test_each_call_into_the_model_is_watched_on_its_own_thread(model_dir: Path) -> None:
    """The handler's prepare, its predict and its postprocess are each under way while they run, never after."""
    import threading

    import numpy as np
    import torch

    from stream.pipeline.inference import InferenceEngine

    handler = PoisonHandler(model_dir)
    seen: list[tuple[str, int, bool]] = []

    class Watched(PoisonHandler):
        def prepare(self, inputs: Any) -> Any:
            record("prepare")
            return inputs

        def predict(self, inputs: Any) -> Any:
            record("predict")
            return handler.predict(inputs)

        def postprocess(self, raw: Any) -> Any:
            record("postprocess")
            return handler.postprocess(raw)

    engine = InferenceEngine(Watched(model_dir), torch.device("cpu"))
    handler.load(engine.device)

    def record(step: str) -> None:
        call = engine.calls.longest()
        assert call is not None
        seen.append((call.what, call.n, call.thread == threading.get_ident()))

    engine.run({"features": np.zeros((3, 32), np.float32)})
    assert seen == [("prepare", 3, True), ("predict", 3, True), ("postprocess", 3, True)]
    assert engine.calls.longest() is None


def test_a_warm_up_whose_model_hangs_exits_1_with_its_stack(model_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """The warm-up runs on the main thread before the worker joins its group: a call into the model there that
    never returns would leave the worker alive and never ready. Past --model-timeout-s the watch logs where the
    main thread is and exits 1 (no partition is held: nothing to commit or hand over)."""
    import threading

    import numpy as np

    settings = WorkerSettings(bootstrap_servers="127.0.0.1:1", input_topic="in", output_topic="out", group_id="g",
                              model_dir=model_dir, native_consumer=False, model_timeout_s=1)
    w = Worker(settings, handler=PoisonHandler(model_dir))
    exited: list[int] = []
    gone, released = threading.Event(), threading.Event()

    def exit_now(code: int) -> None:
        exited.append(code)
        gone.set()

    w._exit = exit_now
    monkeypatch.setattr(w._engine.handler, "warm_inputs", lambda: [{"features": np.zeros((5, 32), np.float32)}],
                        raising=False)
    real = w._engine.handler.predict

    def stuck_predict(inputs: Any) -> Any:
        assert released.wait(30), "the test never let the model go"
        return real(inputs)

    monkeypatch.setattr(w._engine.handler, "predict", stuck_predict)
    releaser = threading.Thread(target=lambda: (gone.wait(30), released.set()))
    releaser.start()
    with caplog.at_level("ERROR", logger="stream.pipeline.worker"):
        w._warm()  # returns once the test lets the model go, after the watch "exited"
    releaser.join(10)
    assert exited == [1]
    [logged] = [r.getMessage() for r in caplog.records if r.name == "stream.pipeline.worker"]
    assert logged.startswith("the model's predict on a batch of 5 has not returned for 1 s (--model-timeout-s 1) "
                             "in the warm-up: exiting (1) without it, before joining the group. Thread MainThread")
    assert "in stuck_predict" in logged and "in _warm" in logged, logged
