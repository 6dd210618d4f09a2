"""Keeping one batch ahead on the device: the processor's begin/complete split (the stage that interleaves them
is tested in test_stage.py), and (on a machine with CUDA only) the engine's asynchronous CUDA path."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from producers.events import generate_events
from stream.bench.gpu import build_model
from stream.cli import main
from stream.codec import decode
from stream.errors import ModelError
from stream.kafka.publish import HEADER_OFFSET
from stream.models.demo import WEIGHTS_FILE, DemoFraudHandler, FraudMLP
from stream.pipeline.inference import InferenceEngine, InFlight
from tests.handlers import POISON_MARK, PoisonHandler
from tests.unit.pipeline.test_processing import REGISTRY, FakePublisher, batch_of, events, make

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


class _Timed:
    """A recorded CUDA timing event's stand-in: complete at once, ``ms`` into the device's timeline."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: _Timed) -> float:
        return end.ms - self.ms


def test_the_device_time_of_records_batches_leaves_the_warm_up_out(model_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The summary's device_busy_s (and the benchmarks' device time a batch, over the records' batches) counted
    the warm-up's first passes too; they are kept apart, in warm_device_s."""
    engine = InferenceEngine(DemoFraudHandler(model_dir), torch.device("cpu"))

    def timed_run(_inputs: object) -> None:  # a batch that kept the device 40 ms, as its CUDA events say
        flight = InFlight(1, time.perf_counter())
        flight.begun, flight.done = _Timed(0.0), _Timed(40.0)
        engine.wait(flight)

    monkeypatch.setattr(engine.handler, "warm_inputs", lambda: [{}, {}, {}], raising=False)
    monkeypatch.setattr(engine, "run", timed_run)
    assert engine.warm(60.0)[:2] == (3, 3)
    assert engine.device_busy_s == 0.0 and engine.warm_device_s == pytest.approx(0.12)
    timed_run({})  # a batch of records
    assert engine.device_busy_s == pytest.approx(0.04) and engine.warm_device_s == pytest.approx(0.12)


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
    features = generate_events(10, seed=1).features
    out = engine.run(features).outputs
    assert engine.handler.name == "bench-mlp-16x3" and len(out["fraud_score"]) == 10
    # The same weights run directly, as a 16x3 MLP: the handler served the model the benchmark built.
    direct = FraudMLP(32, (16, 16, 16))
    direct.load_state_dict(load_file(str(folder / WEIGHTS_FILE)))
    with torch.inference_mode():
        expected = torch.sigmoid(direct(torch.as_tensor(features, dtype=torch.float32))).numpy()
    assert out["fraud_score"] == pytest.approx(expected, abs=1e-6)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine this would run the whole benchmark")
def test_bench_gpu_without_cuda_fails_with_a_clear_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench-gpu", "--broker", "tansu"]) == 2
    assert "bench-gpu needs a CUDA device" in capsys.readouterr().err
