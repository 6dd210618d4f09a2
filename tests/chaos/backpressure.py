"""Backpressure: input offered 10x faster than the model can serve it; the worker's RSS must stay bounded.

``python -m tests.chaos.backpressure [--seconds 40]`` prints the RSS series and one line of figures. The model
sleeps 50 ms per batch of 256 (about 5,000 events/s); the producer offers 50,000 events/s. The input topic's
backlog grows; the worker's memory must not (bounded queues, paused partitions, librdkafka's prefetch cap)."""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from producers.load import produce_events
from stream.kafka.topics import create_topics
from stream.local.children import WorkerProcess


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise RuntimeError("no VmRSS")


@dataclass
class BackpressureResult:
    samples: list[tuple[float, float]]  # (seconds since start, RSS MiB)
    produced: int
    predicted: int

    def rss_at(self, fraction: float) -> float:
        t_end = self.samples[-1][0]
        return next(r for t, r in self.samples if t >= fraction * t_end)

    @property
    def peak(self) -> float:
        return max(r for _, r in self.samples)

    def line(self) -> str:
        return (f"backpressure: produced={self.produced} predicted={self.predicted} "
                f"rss_mib at 25%={self.rss_at(0.25):.0f} 50%={self.rss_at(0.5):.0f} end={self.samples[-1][1]:.0f} "
                f"peak={self.peak:.0f} growth_after_25%={self.samples[-1][1] - self.rss_at(0.25):+.0f}")


def measure(bootstrap: str, model_dir: Path, seconds: float = 40.0, offered_rate: float = 50_000.0,
            workdir: Path | None = None) -> BackpressureResult:
    workdir = workdir or Path(tempfile.mkdtemp(prefix="stream-backpressure-"))
    stamp = time.monotonic_ns() % 10**8
    topics = [f"bp-in-{stamp}", f"bp-out-{stamp}"]
    create_topics(bootstrap, topics, 4)
    worker = WorkerProcess(["--bootstrap-servers", bootstrap, "--input-topic", topics[0], "--output-topic",
                            topics[1], "--group-id", f"bp-{stamp}", "--model-dir", str(model_dir),
                            # 256 records per 50 ms batch: ~5,000 events/s served, a tenth of the offered rate
                            # (the model's cost is per batch, so the batch size sets how slow it is).
                            "--model", "tests.handlers:SlowHandler", "--max-batch-size", "256"],
                           workdir / "worker.log", {"STREAM_TEST_BATCH_SLEEP_S": "0.05",
                                                    "KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "6000"})
    try:
        count = int(offered_rate * seconds)
        result: dict[str, int] = {}
        producer = threading.Thread(target=lambda: result.update(
            n=produce_events(bootstrap, topics[0], count, seed=3, rate=offered_rate).delivered), daemon=True)
        while " assigned " not in worker.output():
            if worker.proc.poll() is not None:
                raise RuntimeError(worker.output()[-2000:])
            time.sleep(0.1)
        producer.start()
        started = time.monotonic()
        samples = []
        while time.monotonic() - started < seconds:
            samples.append((time.monotonic() - started, rss_mb(worker.pid)))
            time.sleep(1.0)
        code = worker.terminate()
        if code != 0:
            raise RuntimeError(f"worker exit {code}: {worker.output()[-2000:]}")
        summary = worker.summary() or {}
        producer.join(timeout=1)
        return BackpressureResult(samples, result.get("n", 0), summary.get("predicted", 0))
    finally:
        worker.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.backpressure", description=__doc__)
    parser.add_argument("--bootstrap-servers", default=None, help="default: start a local Apache Kafka")
    parser.add_argument("--seconds", type=float, default=40.0)
    args = parser.parse_args(argv)
    from stream.local.broker import start_kafka
    from stream.models.train_demo import ensure_trained

    model_dir = ensure_trained(Path(tempfile.mkdtemp(prefix="bp-model-")))
    broker = None if args.bootstrap_servers else start_kafka()
    try:
        result = measure(args.bootstrap_servers or broker.bootstrap, model_dir, args.seconds)  # type: ignore[union-attr]
    finally:
        if broker is not None:
            broker.stop()
    for t, r in result.samples:
        print(f"  t={t:5.1f}s rss={r:7.1f} MiB", file=sys.stderr)
    print(result.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
