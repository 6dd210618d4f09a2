"""One latency step of the benchmark (`Bench.latency`): a worker under a steady offered load from a separate load
generator, its predictions' latencies read from the brokers' clocks."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from typing import TYPE_CHECKING, Any

import numpy as np

from stream.bench.probes import (
    PERCENTILES,
    CpuSampler,
    gc_pauses,
    generator_rate,
    metric,
    read_latencies,
    visible_latencies,
    wait_assigned,
)
from stream.bench.processes import finish, finish_reader, start_reader
from stream.local.broker import free_port
from stream.local.children import WorkerProcess, die_with_parent

if TYPE_CHECKING:
    from stream.bench.runner import Bench


def latency_step(bench: Bench, capacity: float, load: float, wait_ms: float, extra: list[str] | None = None,
                 label: str = "", reader: str | None = None) -> dict[str, Any]:
    """The worker under a steady offered load: a separate load-generator process paces events at
    ``load`` x ``capacity``; events of its first ``warmup_seconds`` (from the first event it stamped) are
    not counted (fetch start, first batches).

    Two latencies per prediction, both from broker clocks where possible: *pipeline* = input record's
    append time -> its prediction's append time (both topics LogAppendTime; what the worker controls);
    *from event* = the event's ``ts_ms`` (stamped by the generator) -> prediction append (adds the
    upstream producer's linger and send).

    ``reader`` (an ``isolation.level``): a third, *visible* = input append -> the moment a separate reader
    process with that isolation (``stream.bench.visibility``, started before the load) received the
    prediction; under exactly-once, ``read_committed`` readers wait for the transaction's commit."""
    tag = f"{int(load * 100)}-{int(wait_ms)}{label}"
    inp = bench.topic(f"lat-in-{tag}", log_append_time=True)
    out = bench.topic(f"lat-out-{tag}", log_append_time=True)
    port = free_port()
    worker = WorkerProcess(
        ["--bootstrap-servers", bench.bootstrap, "--input-topic", inp, "--output-topic", out, "--group-id",
         f"bench-lat-{bench.run}-{tag}", "--model-dir", str(bench.model_dir), "--max-wait-ms",
         str(wait_ms), "--metrics-port", str(port), "--log-level", "INFO", *(extra or [])],
        bench.work / f"lat-{tag}.log", {"KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "6000"})
    rate = capacity * load
    warmup = bench.cfg.warmup_seconds
    count = max(int(rate * (bench.cfg.latency_seconds + warmup)), 1)
    receipts_path = bench.work / f"lat-{tag}-receipts.npy"
    visibility: subprocess.Popen[str] | None = None
    try:
        wait_assigned(worker)
        if reader is not None:
            visibility = start_reader(bench.bootstrap, out, count, reader, wait_ms, receipts_path)
        with CpuSampler() as sampler:
            sampler.watch("worker", worker.pid)
            sampler.watch("broker", bench.broker_pid)
            generator = subprocess.Popen(
                [sys.executable, "-m", "producers", "--bootstrap-servers", bench.bootstrap, "--topic", inp,
                 "--count", str(count), "--rate", f"{rate:.3f}", "--seed", "7", "--pregenerate"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
            sampler.watch("generator", generator.pid)
            gen_out = finish(generator, "load generator", bench.cfg.latency_seconds + warmup + 300)
        rows, log_append = read_latencies(bench.bootstrap, inp, out, count)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        receipts = finish_reader(visibility, receipts_path) if visibility is not None else None
    finally:
        if visibility is not None and visibility.poll() is None:
            visibility.kill()
            visibility.wait()
        worker.terminate()
    # Warm-up is timed from the first event the generator stamped: its own start-up (a Python process
    # importing numpy and the client, ~1 s here) is not load.
    counted = rows[:, 0] >= rows[:, 0].min() + warmup * 1000.0
    steady = rows[counted]
    # The same window for CPU: from the end of the warm-up to the last event the generator stamped.
    window = (rows[:, 0].min() / 1000.0 + warmup, rows[:, 0].max() / 1000.0)
    cpu = sampler.cores(*window)
    pipeline, from_event, sizes = steady[:, 1], steady[:, 2], steady[:, 3]
    seen: dict[str, Any] = {}
    if receipts is not None:
        visible = visible_latencies(rows, receipts)[counted]
        seen = {"visible_isolation": reader,
                **{f"visible_{name}_ms": float(np.percentile(visible, q)) for name, q in PERCENTILES}}
    batches = metric(metrics, "stream_transaction_batches_count")
    if batches:
        seen["transactions"] = batches
        seen["batches_per_transaction"] = (metric(metrics, "stream_transaction_batches_sum") or 0.0) / batches
    return {
        "load": load, "max_wait_ms": wait_ms, "settings": " ".join(extra or []) or "defaults",
        "offered_rate": rate, "achieved_rate": generator_rate(gen_out), "events": len(steady),
        "warmup_events": count - len(steady),
        **{f"{name}_ms": float(np.percentile(pipeline, q)) for name, q in PERCENTILES},
        **{f"from_event_{name}_ms": float(np.percentile(from_event, q)) for name, q in PERCENTILES},
        "mean_batch_size": float(len(sizes) / np.sum(1.0 / sizes)) if len(sizes) else 0.0,
        "timestamps": "LogAppendTime" if log_append else "CreateTime (the broker ignores LogAppendTime)",
        "latencies_ms": pipeline.tolist(), "batch_sizes": sizes.tolist(),
        "worker_inference_seconds_sum": metric(metrics, "stream_inference_seconds_sum"),
        # Mean cores over the counted window: worker, local broker (absent for a given cluster), generator.
        "cpu_cores": cpu,
        # The broker's stop-the-world collections in the same window (None: no log of a broker of our own).
        "broker_gc": gc_pauses(bench.broker_gc_log, *window) if bench.broker_gc_log is not None else None,
        **seen,
    }
