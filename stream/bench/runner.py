"""``python -m stream bench``: one broker, one pre-produced data set, the same demo model for every contender.

Prints a table and writes ``bench.json`` and PNG plots under ``results/bench-<time>/`` (not committed)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, TIMESTAMP_LOG_APPEND_TIME, Consumer, TopicPartition

from producers.load import produce_events
from stream.broker import BrokerKind, free_port, start_broker
from stream.codec import SchemaRegistry, decode
from stream.models.demo import DEFAULT_MODEL_DIR
from stream.models.train_demo import ensure_trained
from stream.process import WorkerProcess
from stream.topics import create_topics, partitions_of

PARTITIONS = 8
BEST_SETTINGS = ["--max-batch-size", "1024", "--max-wait-ms", "20", "--max-inflight-batches", "4"]


@dataclass
class BenchConfig:
    events: int = 1_000_000
    naive_events: int = 5_000
    faust_events: int = 100_000
    latency_seconds: float = 15.0
    loads: tuple[float, ...] = (0.1, 0.5, 0.9)
    waits_ms: tuple[float, ...] = (5.0, 20.0)
    contenders: tuple[str, ...] = ("passthrough", "naive", "faust", "handtuned")
    results: Path = field(default_factory=lambda: Path("results") / time.strftime("bench-%Y%m%d-%H%M%S"))


@dataclass
class Drain:
    name: str
    events: int
    seconds: float
    peak_rss_mib: float | None = None

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0


class Bench:
    def __init__(self, bootstrap: str, cfg: BenchConfig, model_dir: Path) -> None:
        self.bootstrap = bootstrap
        self.cfg = cfg
        self.model_dir = model_dir
        self.run = uuid.uuid4().hex[:6]
        self.work = Path(tempfile.mkdtemp(prefix="stream-bench-"))
        self.input = f"bench-in-{self.run}"

    def topic(self, stem: str, log_append_time: bool = False) -> str:
        name = f"bench-{stem}-{self.run}"
        create_topics(self.bootstrap, [name], PARTITIONS,
                      config={"message.timestamp.type": "LogAppendTime"} if log_append_time else None)
        return name

    # ------------------------------------------------------------------ drain throughput
    def prepare(self) -> float:
        create_topics(self.bootstrap, [self.input], PARTITIONS)
        summary = produce_events(self.bootstrap, self.input, self.cfg.events, seed=2026)
        if summary.failed:
            raise RuntimeError(f"pre-produce failed: {summary.line()}")
        return summary.rate

    def contender(self, name: str, events: int) -> Drain:
        out = self.topic(f"{name}-out")
        cmd = [sys.executable, "-m", "stream.bench.contenders", name, "--bootstrap", self.bootstrap, "--input",
               self.input, "--output", out, "--group", f"bench-{name}-{self.run}", "--events", str(events),
               "--model-dir", str(self.model_dir)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
        # faust routes print() through its logger (stderr): look for the result line in both streams.
        found = [ln[ln.index('{"events"'):] for ln in (proc.stdout + proc.stderr).splitlines() if '{"events"' in ln]
        if not found:
            raise RuntimeError(f"contender {name} failed ({proc.returncode}): {proc.stderr[-3000:]}")
        result = json.loads(found[0])
        return Drain(name, int(result["events"]), float(result["last_ts"]) - float(result["first_ts"]))

    def worker_drain(self, name: str, extra: list[str], replicas: int = 1) -> Drain:
        out = self.topic(f"{name}-out")
        group = f"bench-{name}-{self.run}"
        procs = []
        for i in range(replicas):
            summary = self.work / f"{name}-{i}.json"
            procs.append((WorkerProcess(
                ["--bootstrap-servers", self.bootstrap, "--input-topic", self.input, "--output-topic", out,
                 "--group-id", group, "--model-dir", str(self.model_dir), "--stop-at-end", "--summary-json",
                 str(summary), "--log-level", "WARNING", *extra],
                self.work / f"{name}-{i}.log", {"KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "6000"}), summary))
        peak = 0.0
        while any(p.proc.poll() is None for p, _ in procs):
            for p, _ in procs:
                peak = max(peak, _rss_mib(p.pid, "VmHWM") or 0.0)
            time.sleep(0.2)
        summaries = []
        for p, path in procs:
            if p.proc.returncode != 0:
                raise RuntimeError(f"worker {name} exit {p.proc.returncode}: {p.output()[-3000:]}")
            p.kill()
            summaries.append(json.loads(path.read_text()))
        first = min(s["first_consumed_at"] for s in summaries if s["first_consumed_at"])
        last = max(s["last_committed_at"] for s in summaries if s["last_committed_at"])
        return Drain(name, sum(s["consumed"] for s in summaries), last - first, peak)

    # ------------------------------------------------------------------ latency under load
    def latency(self, capacity: float, load: float, wait_ms: float) -> dict[str, Any]:
        inp = self.topic(f"lat-in-{int(load * 100)}-{int(wait_ms)}")
        out = self.topic(f"lat-out-{int(load * 100)}-{int(wait_ms)}", log_append_time=True)
        port = free_port()
        worker = WorkerProcess(
            ["--bootstrap-servers", self.bootstrap, "--input-topic", inp, "--output-topic", out, "--group-id",
             f"bench-lat-{self.run}-{load}-{wait_ms}", "--model-dir", str(self.model_dir), "--max-wait-ms",
             str(wait_ms), "--metrics-port", str(port), "--log-level", "INFO"],
            self.work / f"lat-{load}-{wait_ms}.log", {"KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "6000"})
        try:
            while " assigned " not in worker.output():
                if worker.proc.poll() is not None:
                    raise RuntimeError(worker.output()[-3000:])
                time.sleep(0.05)
            rate = capacity * load
            count = max(int(rate * self.cfg.latency_seconds), 1)
            produce_events(self.bootstrap, inp, count, seed=7, rate=rate)
            latencies, batch_sizes, log_append = _read_latencies(self.bootstrap, out, count)
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        finally:
            worker.terminate()
        lat = np.asarray(latencies)
        sizes = np.asarray(batch_sizes, dtype=np.float64)
        return {
            "load": load, "max_wait_ms": wait_ms, "offered_rate": rate, "events": count,
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "p999_ms": float(np.percentile(lat, 99.9)),
            "mean_batch_size": float(len(sizes) / np.sum(1.0 / sizes)) if len(sizes) else 0.0,
            "timestamps": "LogAppendTime" if log_append else "CreateTime (broker ignores LogAppendTime)",
            "latencies_ms": lat.tolist(), "batch_sizes": sizes.tolist(),
            "worker_inference_seconds_sum": _metric(metrics, "stream_inference_seconds_sum"),
        }


def _rss_mib(pid: int, field: str = "VmRSS") -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def _metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def _read_latencies(bootstrap: str, topic: str, count: int, timeout_s: float = 120.0,
                    ) -> tuple[list[float], list[int], bool]:
    """Event ts_ms -> the broker's append time of its prediction (LogAppendTime), per prediction."""
    registry = SchemaRegistry.from_dir()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-reader-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions_of(bootstrap, topic)])
    latencies: list[float] = []
    sizes: list[int] = []
    log_append = True
    deadline = time.monotonic() + timeout_s
    while len(latencies) < count and time.monotonic() < deadline:
        for m in consumer.consume(10_000, 0.2):
            if m.error() is not None:
                continue
            ts_type, ts = m.timestamp()
            log_append = log_append and ts_type == TIMESTAMP_LOG_APPEND_TIME
            record = decode(registry, m.value())[1]
            latencies.append(float(ts - record["event_ts_ms"]))
            sizes.append(int(record["batch_size"]))
    consumer.close()
    if len(latencies) < count:
        raise RuntimeError(f"only {len(latencies)} of {count} predictions arrived")
    return latencies, sizes, log_append


def _versions() -> dict[str, str]:
    import confluent_kafka
    import torch

    from stream.broker import KAFKA_VERSION

    return {"python": platform.python_version(), "torch": torch.__version__,
            "confluent_kafka": confluent_kafka.version()[0], "librdkafka": confluent_kafka.libversion()[0],
            "kafka": KAFKA_VERSION, "cpu_cores": str(os.cpu_count()), "machine": platform.machine()}


def run_bench(cfg: BenchConfig, broker_kind: BrokerKind = "kafka", bootstrap: str | None = None,
              console_print: Any = print) -> dict[str, Any]:
    model_dir = ensure_trained(DEFAULT_MODEL_DIR)
    broker = None if bootstrap else start_broker(broker_kind)
    servers = bootstrap or broker.bootstrap  # type: ignore[union-attr]
    report: dict[str, Any] = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
                              "broker": "given cluster" if bootstrap else broker_kind, "versions": _versions()}
    try:
        bench = Bench(servers, cfg, model_dir)
        report["preproduce_rate"] = bench.prepare()
        drains: list[Drain] = []
        caps = {"naive": cfg.naive_events, "faust": cfg.faust_events}
        for name in cfg.contenders:
            console_print(f"bench: {name} ...")
            drains.append(bench.contender(name, min(cfg.events, caps.get(name, cfg.events))))
        console_print("bench: worker (default settings) ...")
        drains.append(bench.worker_drain("worker-default", []))
        console_print("bench: worker (best settings) ...")
        best = bench.worker_drain("worker-best", BEST_SETTINGS)
        drains.append(best)
        console_print("bench: worker x2 replicas (best settings) ...")
        drains.append(bench.worker_drain("worker-best-x2", BEST_SETTINGS, replicas=2))
        limit = next((d.rate for d in drains if d.name == "passthrough"), None)
        report["drain"] = [{**asdict(d), "rate": d.rate, "ratio_to_limit": (d.rate / limit) if limit else None}
                           for d in drains]
        capacity = next(d.rate for d in drains if d.name == "worker-default")
        report["latency"] = []
        for wait in cfg.waits_ms:
            for load in cfg.loads:
                console_print(f"bench: latency at {load:.0%} load, max_wait_ms={wait:g} ...")
                report["latency"].append(bench.latency(capacity, load, wait))
    finally:
        if broker is not None:
            broker.stop()
    cfg.results.mkdir(parents=True, exist_ok=True)
    (cfg.results / "bench.json").write_text(json.dumps(report, indent=1))
    _plots(report, cfg.results)
    return report


def _plots(report: dict[str, Any], folder: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drains = report["drain"]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar([d["name"] for d in drains], [d["rate"] for d in drains], color="#4878a8")
    ax.set_ylabel("events/s (drain)")
    ax.set_yscale("log")
    ax.set_title(f"drain throughput ({report['versions']['cpu_cores']} cores, {report['broker']})")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    fig.savefig(folder / "throughput.png", dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(8, 4))
    for run in report["latency"]:
        lat = np.sort(np.asarray(run["latencies_ms"]))
        ax.plot(lat, np.arange(1, len(lat) + 1) / len(lat),
                label=f"{run['load']:.0%} load, max_wait {run['max_wait_ms']:g} ms")
    ax.set_xlabel("end-to-end latency (ms, event ts -> broker append of its prediction)")
    ax.set_ylabel("fraction of events")
    ax.set_xscale("log")
    _save(plt, fig, ax, folder / "latency_cdf.png")
    fig, ax = plt.subplots(figsize=(8, 4))
    for run in report["latency"]:
        ax.hist(run["batch_sizes"], bins=40, histtype="step",
                label=f"{run['load']:.0%} load, max_wait {run['max_wait_ms']:g} ms")
    ax.set_xlabel("batch size of each prediction's batch")
    ax.set_ylabel("predictions")
    _save(plt, fig, ax, folder / "batch_sizes.png")


def _save(plt: Any, fig: Any, ax: Any, path: Path) -> None:
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_table(report: dict[str, Any]) -> list[list[str]]:
    rows = [["contender", "events", "seconds", "events/s", "x limit", "peak RSS MiB"]]
    for d in report["drain"]:
        rows.append([d["name"], f"{d['events']:,}", f"{d['seconds']:.2f}", f"{d['rate']:,.0f}",
                     f"{d['ratio_to_limit']:.2f}" if d["ratio_to_limit"] else "-",
                     f"{d['peak_rss_mib']:.0f}" if d["peak_rss_mib"] else "-"])
    return rows


def format_latency(report: dict[str, Any]) -> list[list[str]]:
    rows = [["max_wait_ms", "load", "offered ev/s", "p50 ms", "p99 ms", "p99.9 ms", "mean batch"]]
    for r in report["latency"]:
        rows.append([f"{r['max_wait_ms']:g}", f"{r['load']:.0%}", f"{r['offered_rate']:,.0f}", f"{r['p50_ms']:.1f}",
                     f"{r['p99_ms']:.1f}", f"{r['p999_ms']:.1f}", f"{r['mean_batch_size']:.1f}"])
    return rows
