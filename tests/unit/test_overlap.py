"""Keeping one batch ahead on the device: the processor's begin/complete split, the worker's processor loop
that interleaves them, and (on a machine with CUDA only) the engine's asynchronous CUDA path."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from producers.events import generate_events
from stream.bench.gpu import build_model
from stream.cli import main
from stream.codec import decode
from stream.config import WorkerSettings
from stream.errors import ModelError, StreamError
from stream.inference import InferenceEngine
from stream.models.demo import DemoFraudHandler
from stream.processing import BatchProcessor, Begun, Dispatched
from stream.publish import HEADER_OFFSET
from stream.worker import Worker
from tests.handlers import POISON_MARK, PoisonHandler
from tests.unit.test_processing import REGISTRY, FakePublisher, batch_of, events, make

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def predicted_offsets(pub: FakePublisher) -> list[int]:
    return [offset for _, _, offset in pub.sources()]


def test_batches_begun_ahead_complete_in_order_with_poison_isolated(model_dir: Path) -> None:
    processor, pub = make(model_dir)
    first, t1 = batch_of(events(10, [3]), pub)
    second, t2 = batch_of(events(6), pub)
    a = processor.begin(first)
    b = processor.begin(second)  # submitted before the first is completed
    assert pub.sent == [], "begin publishes nothing"
    processor.complete(a)
    processor.complete(b)
    assert predicted_offsets(pub) == [0, 1, 2, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5]
    assert [int(h[HEADER_OFFSET]) for t, _, _, h in pub.sent if t == "dlq"] == [3]
    assert t1.committable() == {("in", 0): 10} and t2.committable() == {("in", 0): 6}


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


def run_loop(model_dir: Path, sizes: list[int], *, asynchronous: bool, overlap: bool = True,
             fail_on: int | None = None) -> tuple[Worker, Spy, FakePublisher]:
    """Queue batches of ``sizes`` then the stop sentinel, run the worker's processor loop to its end."""
    settings = WorkerSettings(bootstrap_servers="127.0.0.1:1", input_topic="in", output_topic="out", group_id="g",
                              model_dir=model_dir, gpu_overlap=overlap, max_inflight_batches=len(sizes))
    worker = Worker(settings, handler=PoisonHandler(model_dir))
    worker._engine.asynchronous = asynchronous  # as on CUDA; the CPU engine computes in submit, which is fine here
    processor, pub = make(model_dir)
    spy = Spy(processor, fail_on)
    worker._processor = spy  # type: ignore[assignment]
    worker._publisher = pub  # type: ignore[assignment]
    for n in sizes:
        assert worker._slots.acquire(blocking=False)
        worker._queue.put(batch_of(events(n), pub)[0])
    worker._queue.put(None)
    worker._process_loop()
    return worker, spy, pub


def test_worker_keeps_one_batch_ahead_on_an_asynchronous_device(model_dir: Path) -> None:
    _, spy, pub = run_loop(model_dir, [3, 4, 5], asynchronous=True)
    assert spy.calls == [("begin", 3), ("begin", 4), ("complete", 3), ("begin", 5), ("complete", 4),
                         ("complete", 5)]
    assert predicted_offsets(pub) == [0, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3, 4]


@pytest.mark.parametrize(("asynchronous", "overlap"), [(False, True), (True, False)])
def test_worker_processes_one_batch_at_a_time_on_cpu_or_when_overlap_is_off(model_dir: Path, asynchronous: bool,
                                                                            overlap: bool) -> None:
    _, spy, pub = run_loop(model_dir, [3, 4], asynchronous=asynchronous, overlap=overlap)
    assert spy.calls == [("process", 3), ("process", 4)]
    assert len(predicted_offsets(pub)) == 7


def test_a_batch_ahead_is_never_published_after_a_failure(model_dir: Path) -> None:
    worker, spy, pub = run_loop(model_dir, [3, 4, 5], asynchronous=True, fail_on=3)
    assert isinstance(worker._failure, StreamError)
    assert ("complete", 4) not in spy.calls and ("complete", 5) not in spy.calls
    assert pub.sent == []


def test_worker_completes_the_batch_ahead_when_nothing_else_is_queued(model_dir: Path) -> None:
    """With an empty queue the loop finishes the batch on the device at once instead of waiting for the next."""
    settings = WorkerSettings(bootstrap_servers="127.0.0.1:1", input_topic="in", output_topic="out", group_id="g",
                              model_dir=model_dir)
    worker = Worker(settings, handler=PoisonHandler(model_dir))
    worker._engine.asynchronous = True
    processor, pub = make(model_dir)
    worker._processor = processor
    worker._publisher = pub  # type: ignore[assignment]
    loop = threading.Thread(target=worker._process_loop, daemon=True)
    loop.start()
    try:
        assert worker._slots.acquire(blocking=False)
        worker._queue.put(batch_of(events(5), pub)[0])
        for _ in range(200):
            if len(predicted_offsets(pub)) == 5:
                break
            loop.join(0.01)
        assert predicted_offsets(pub) == [0, 1, 2, 3, 4], "the only batch was held back waiting for a next one"
    finally:
        worker._queue.put(None)
        loop.join(5)
    assert not loop.is_alive()


def test_a_delivery_callback_raising_while_idle_fails_the_worker_and_the_loop_goes_on(model_dir: Path) -> None:
    """The idle processor serves delivery reports; an exception from a callback there must fail the worker
    (which then stops), not end the processing thread silently."""
    settings = WorkerSettings(bootstrap_servers="127.0.0.1:1", input_topic="in", output_topic="out", group_id="g",
                              model_dir=model_dir)
    worker = Worker(settings, handler=PoisonHandler(model_dir))
    worker._processor, pub = make(model_dir)

    def serve() -> None:
        raise RuntimeError("a delivery callback failed")

    pub.serve = serve  # type: ignore[method-assign]
    worker._publisher = pub  # type: ignore[assignment]
    loop = threading.Thread(target=worker._process_loop, daemon=True)
    loop.start()
    try:
        for _ in range(200):
            if worker._failure is not None:
                break
            loop.join(0.01)
        assert isinstance(worker._failure, RuntimeError) and worker._stop.is_set()
        assert loop.is_alive()
    finally:
        worker._queue.put(None)
        loop.join(5)
    assert not loop.is_alive()


# ---------------------------------------------------------------------------- CUDA only
@cuda
def test_cuda_engine_matches_the_cpu_with_several_batches_in_flight(model_dir: Path) -> None:
    cpu = InferenceEngine(DemoFraudHandler(model_dir), torch.device("cpu"))
    gpu = InferenceEngine(DemoFraudHandler(model_dir), torch.device("cuda"))
    assert gpu.asynchronous and not cpu.asynchronous
    # Sizes that grow the staging buffers, and more batches in flight than the staging ring has slots.
    batches = [generate_events(n, seed=n).features for n in (7, 1, 300, 5000, 64, 9000, 2, 4096)]
    flights = [gpu.submit(x) for x in batches]
    for x, flight in zip(batches, flights, strict=True):
        got = gpu.result(flight).outputs
        want = cpu.run(x).outputs
        np.testing.assert_allclose(got["fraud_score"], want["fraud_score"], rtol=1e-4, atol=1e-5)
        assert len(got["is_fraud"]) == len(x)


@cuda
def test_cuda_engine_result_is_unaffected_by_refilling_the_host_array(model_dir: Path) -> None:
    """The engine stages its own copy: the caller may reuse its array as soon as submit returns."""
    gpu = InferenceEngine(DemoFraudHandler(model_dir), torch.device("cuda"))
    x = generate_events(2048, seed=5).features
    want = gpu.run(x.copy()).outputs["fraud_score"]
    flight = gpu.submit(x)
    x[:] = 0.0
    np.testing.assert_allclose(gpu.result(flight).outputs["fraud_score"], want, rtol=1e-5)


@cuda
def test_cuda_model_errors_surface_from_result_and_poison_is_isolated(model_dir: Path) -> None:
    gpu = InferenceEngine(PoisonHandler(model_dir), torch.device("cuda"))
    bad = np.zeros((4, 32), dtype=np.float32)
    bad[2, 0] = POISON_MARK
    flight = gpu.submit(bad)  # never raises
    with pytest.raises(ModelError, match="poison"):
        gpu.result(flight)
    with pytest.raises(ModelError):
        gpu.run(np.zeros((4, 31), dtype=np.float32))
    processor, pub = make(model_dir)
    processor._engine = gpu
    batch, tracker = batch_of(events(12, [5, 6]), pub)
    processor.complete(processor.begin(batch))
    assert predicted_offsets(pub) == [0, 1, 2, 3, 4, 7, 8, 9, 10, 11]
    assert tracker.committable() == {("in", 0): 12}
    scores = [decode(REGISTRY, v)[1]["fraud_score"] for t, v, _, _ in pub.sent if t == "out" and v]
    assert all(0.0 <= s <= 1.0 for s in scores)



# ---------------------------------------------------------------------------- python -m stream bench-gpu
def test_bench_gpu_model_is_served_by_the_demo_handler(tmp_path: Path) -> None:
    folder = build_model(tmp_path / "model", width=16, depth=3)
    engine = InferenceEngine(DemoFraudHandler(folder), torch.device("cpu"))
    out = engine.run(generate_events(10, seed=1).features).outputs
    assert engine.handler.name == "bench-mlp-16x3" and len(out["fraud_score"]) == 10
    assert ((out["fraud_score"] >= 0) & (out["fraud_score"] <= 1)).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine this would run the whole benchmark")
def test_bench_gpu_without_cuda_fails_with_a_clear_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench-gpu", "--broker", "tansu"]) == 2
    assert "bench-gpu needs a CUDA device" in capsys.readouterr().err
