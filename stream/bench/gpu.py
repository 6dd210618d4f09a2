"""``python -m stream bench-gpu``: the worker in a model-bound configuration on a CUDA device, against the
model's standalone batched throughput.

The demo model is far too small to bind anything on a GPU, so this builds a wide MLP of the same shape
(32 features in, one score out; ``--width`` x ``--depth`` hidden layers, random weights, fp32) and serves it
through the demo handler. Figures, all with the same model and batch size:

* **model alone**: forward passes over device-resident batches, back to back (the ceiling);
* **host-to-device copy**: one batch from page-locked memory, alone;
* **engine, serial** / **engine, overlapped**: the worker's inference engine fed from host arrays, waiting for each
  batch before the next / submitting the next batch before waiting for the one before (what the worker does);
* **worker drain**: ``python -m stream worker --device cuda`` draining pre-produced events from a broker, with
  ``--gpu-overlap`` (default) and ``--no-gpu-overlap``; ratio to the model alone, and to the lower of the model
  alone and the broker's ceiling;
* **broker pass-through**: the same events consumed, produced again and committed, no model (the broker's ceiling).
"""

from __future__ import annotations

import gc
import json
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import save_file

from producers.events import N_FEATURES, generate_events
from stream.bench.bench_config import BenchConfig
from stream.bench.processes import versions
from stream.bench.runner import Bench
from stream.errors import ConfigError
from stream.local.broker import BrokerKind, start_broker
from stream.local.kafka_node import KafkaHeap
from stream.models.demo import CONFIG_FILE, WEIGHTS_FILE, DemoFraudHandler, FraudMLP
from stream.pipeline.inference import InferenceEngine


@dataclass
class GpuBenchConfig:
    width: int = 8192
    depth: int = 8
    batch: int = 1024
    events: int = 500_000
    seconds: float = 5.0  # per in-process measurement
    rotate: int = 8  # distinct input batches, so no figure is a cache's
    results: Path = field(default_factory=lambda: Path("results") / time.strftime("bench-gpu-%Y%m%d-%H%M%S"))


def build_model(folder: Path, width: int, depth: int, seed: int = 1) -> Path:
    """A FraudMLP with ``depth`` hidden layers of ``width``, random weights, saved for the demo handler."""
    torch.manual_seed(seed)
    model = FraudMLP(N_FEATURES, (width,) * depth)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / WEIGHTS_FILE))
    (folder / CONFIG_FILE).write_text(json.dumps({
        "name": f"bench-mlp-{width}x{depth}", "version": f"random-{seed}", "n_features": N_FEATURES,
        "hidden": [width] * depth, "threshold": 0.5}))
    return folder


def _timed(step: Any, seconds: float, batch: int) -> tuple[float, int]:
    """Run ``step(i)`` for about ``seconds`` (after 3 warm-ups); (events/s, iterations)."""
    for i in range(3):
        step(i)
    torch.cuda.synchronize()
    started = time.perf_counter()
    i = 0
    while True:
        step(i)
        i += 1
        if i % 8 == 0:
            torch.cuda.synchronize()
            elapsed = time.perf_counter() - started
            if elapsed >= seconds:
                return i * batch / elapsed, i


def standalone(model_dir: Path, cfg: GpuBenchConfig, device: torch.device) -> dict[str, Any]:
    handler = DemoFraudHandler(model_dir)
    engine = InferenceEngine(handler, device)
    host = [generate_events(cfg.batch, seed=100 + k).features for k in range(cfg.rotate)]
    on_device = [torch.from_numpy(x).to(device) for x in host]
    pinned = [torch.from_numpy(x).pin_memory() for x in host]
    out: dict[str, Any] = {}

    def model_step(i: int) -> None:
        with torch.inference_mode():
            handler.predict(on_device[i % cfg.rotate])

    out["model_alone_rate"], _ = _timed(model_step, cfg.seconds, cfg.batch)
    out["model_ms_per_batch"] = cfg.batch / out["model_alone_rate"] * 1000.0

    def copy_step(i: int) -> None:
        pinned[i % cfg.rotate].to(device, non_blocking=True)

    copy_rate, _ = _timed(copy_step, min(cfg.seconds, 1.0), cfg.batch)
    out["h2d_ms_per_batch"] = cfg.batch / copy_rate * 1000.0

    def serial_step(i: int) -> None:
        engine.run(host[i % cfg.rotate])

    out["engine_serial_rate"], _ = _timed(serial_step, cfg.seconds, cfg.batch)

    ahead: list[Any] = []

    def overlapped_step(i: int) -> None:
        ahead.append(engine.submit(host[i % cfg.rotate]))
        if len(ahead) > 1:
            engine.result(ahead.pop(0))

    out["engine_overlapped_rate"], _ = _timed(overlapped_step, cfg.seconds, cfg.batch)
    while ahead:
        engine.result(ahead.pop(0))
    out["h2d_overlap"] = _copy_overlap(overlapped_step, lambda: [engine.result(f) for f in ahead])
    # The engine's outputs against a float64 reference on the CPU, on fresh inputs.
    x = generate_events(256, seed=99).features
    got = engine.run(x).outputs["fraud_score"].astype(np.float64)
    reference = FraudMLP(N_FEATURES, (cfg.width,) * cfg.depth).double()
    reference.load_state_dict({k: v.double() for k, v in handler._model.state_dict().items()})  # type: ignore[union-attr]
    with torch.inference_mode():
        want = torch.sigmoid(reference(torch.from_numpy(x).double())).numpy()
    out["max_abs_error_vs_float64"] = float(np.max(np.abs(got - want)))
    return out


def _copy_overlap(step: Any, finish: Any, steps: int = 16) -> dict[str, Any]:
    """Profile ``steps`` overlapped engine steps (CUPTI timestamps): the share of host-to-device copy time that
    ran while a kernel was running on the device."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            step(i)
        finish()
        torch.cuda.synchronize()
    kernels: list[tuple[float, float]] = []
    copies: list[tuple[float, float]] = []
    for e in prof.events():
        if getattr(e.device_type, "name", "") != "CUDA":
            continue
        interval = (float(e.time_range.start), float(e.time_range.end))
        if "HtoD" in e.name:
            copies.append(interval)
        elif not e.name.startswith(("Memcpy", "Memset")):
            kernels.append(interval)
    total = sum(b - a for a, b in copies)
    covered = sum(max(0.0, min(b, kb) - max(a, ka)) for a, b in copies for ka, kb in kernels)
    return {"copies": len(copies), "kernels": len(kernels), "copy_us": total,
            "overlapped_fraction": min(covered / total, 1.0) if total else None}


def run_gpu_bench(cfg: GpuBenchConfig, broker_kind: BrokerKind = "kafka", bootstrap: str | None = None,
                  console_print: Any = print) -> dict[str, Any]:
    if not torch.cuda.is_available():
        raise ConfigError("bench-gpu needs a CUDA device, and torch sees none on this machine")
    device = torch.device("cuda")
    broker_name = "given cluster" if bootstrap else broker_kind
    report: dict[str, Any] = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
                              "broker": broker_name,
                              "versions": {**versions(broker_name), "gpu": torch.cuda.get_device_name(device),
                                           "cuda": str(torch.version.cuda)}}
    model_dir = build_model(Path(tempfile.mkdtemp(prefix="stream-bench-gpu-")) / "model", cfg.width, cfg.depth)
    console_print(f"bench-gpu: model {cfg.width}x{cfg.depth} alone, copies, engine ...")
    report["standalone"] = standalone(model_dir, cfg, device)
    gc.collect()
    torch.cuda.empty_cache()  # the worker processes below need the device's memory
    broker = None if bootstrap else start_broker(broker_kind, kafka_heap=KafkaHeap.for_benchmark())
    servers = bootstrap or broker.bootstrap  # type: ignore[union-attr]
    try:
        bench = Bench(servers, BenchConfig(events=cfg.events), model_dir)
        report["preproduce_rate"] = bench.prepare()
        # The broker's own ceiling: a pass-through of the same events (consume, produce, commit; no model).
        console_print("bench-gpu: broker pass-through ...")
        ceiling = bench.contender("passthrough", cfg.events)
        report["broker_ceiling"] = {"events": ceiling.events, "seconds": ceiling.seconds, "rate": ceiling.rate}
        bound = min(report["standalone"]["model_alone_rate"], ceiling.rate)
        report["drain"] = []
        for name, extra in (("worker-gpu-overlap", []), ("worker-gpu-serial", ["--no-gpu-overlap"])):
            console_print(f"bench-gpu: {name} ...")
            drain = bench.worker_drain(name, ["--device", "cuda", "--max-batch-size", str(cfg.batch), *extra])
            report["drain"].append({"name": name, "events": drain.events, "seconds": drain.seconds,
                                    "rate": drain.rate, "peak_rss_mib": drain.peak_rss_mib,
                                    "ratio_to_model": drain.rate / report["standalone"]["model_alone_rate"],
                                    "ratio_to_bound": drain.rate / bound})
    finally:
        if broker is not None:
            broker.stop()
    cfg.results.mkdir(parents=True, exist_ok=True)
    (cfg.results / "bench-gpu.json").write_text(json.dumps(report, indent=1))
    return report


def format_gpu_table(report: dict[str, Any]) -> list[list[str]]:
    s = report["standalone"]
    model = s["model_alone_rate"]
    rows = [["what", "events/s", "vs model alone"],
            ["model alone (device-resident batches)", f"{model:,.0f}", "1.00"],
            ["engine, serial (host arrays, wait per batch)", f"{s['engine_serial_rate']:,.0f}",
             f"{s['engine_serial_rate'] / model:.2f}"],
            ["engine, overlapped (one batch ahead)", f"{s['engine_overlapped_rate']:,.0f}",
             f"{s['engine_overlapped_rate'] / model:.2f}"]]
    if "broker_ceiling" in report:
        ceiling = report["broker_ceiling"]["rate"]
        rows.append(["broker pass-through (no model)", f"{ceiling:,.0f}", f"{ceiling / model:.2f}"])
    rows += [[d["name"], f"{d['rate']:,.0f}", f"{d['ratio_to_model']:.2f}"
              + (f" ({d['ratio_to_bound']:.2f} of the lower bound)" if "ratio_to_bound" in d else "")]
             for d in report.get("drain", [])]
    return rows
