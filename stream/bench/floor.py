"""``python -m stream.bench.floor``: the broker's own latency floor under the benchmark's load, no worker.

The load generator of the latency runs (``python -m producers --rate R``) publishes to a fresh topic; a plain
consumer with the worker's fetch settings (``fetch.wait.max.ms`` = ``max_wait_ms``, as `WorkerSettings` sets it)
reads it and times each record from its producer timestamp (CreateTime: stamped by the generator's client as
the event is handed over, within a millisecond of the event's ``ts_ms``) to the moment ``consume()`` returns it.
Nothing is batched, run or published. Read the worker's *from event* latency against it: what is left is the
worker's batching, model and publishing (and the output topic's append, which this does not include).

Used to tell a slow broker from a slow worker: the embedded Tansu broker answers fetches far later than
Kafka does (see docs/performance.md)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
import uuid
from array import array
from typing import Any

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from stream.config import WorkerSettings
from stream.kafka.topics import create_topics, partitions_of
from stream.local.broker import BrokerKind, start_broker
from stream.local.children import die_with_parent
from stream.local.kafka_node import KafkaHeap

PARTITIONS = 8  # as the benchmark's topics


def measure_floor(bootstrap: str, rate: float, seconds: float = 10.0, warmup_s: float = 3.0,
                  max_wait_ms: float = 5.0) -> dict[str, Any]:
    """Latency (ms) from each record's CreateTime to its consumption, for the records produced after
    ``warmup_s``; the generator runs ``warmup_s + seconds`` at ``rate`` events/s."""
    if rate <= 0 or seconds <= 0 or warmup_s < 0:
        raise ValueError("rate and seconds must be > 0, warmup_s >= 0")
    topic = f"floor-{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, [topic], PARTITIONS)
    count = max(int(rate * (seconds + warmup_s)), 1)
    settings = WorkerSettings(bootstrap_servers=bootstrap, input_topic=topic, output_topic=f"{topic}-unused",
                              group_id=f"floor-{topic}", max_wait_ms=max_wait_ms)
    consumer = Consumer({**settings.consumer_config(), "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions_of(bootstrap, topic)])
    created = array("d")
    received = array("d")
    done = threading.Event()

    def read() -> None:
        while not done.is_set() and len(created) < count:
            # consume(n, t) returns only once it has n records or t is over: wait for one, take what is there.
            batch = consumer.consume(1, 0.1)
            if batch:
                batch += consumer.consume(10_000, 0)
            now = time.time() * 1000.0
            for m in batch:
                if m.error() is None:
                    created.append(m.timestamp()[1])
                    received.append(now)

    reader = threading.Thread(target=read, name="floor-reader", daemon=True)
    reader.start()
    try:
        generator = subprocess.run(
            [sys.executable, "-m", "producers", "--bootstrap-servers", bootstrap, "--topic", topic, "--count",
             str(count), "--rate", f"{rate:.3f}", "--seed", "7", "--pregenerate"],
            capture_output=True, text=True, timeout=seconds + warmup_s + 300, check=False,
            preexec_fn=die_with_parent)
        if generator.returncode != 0:
            raise RuntimeError(f"load generator failed: {generator.stdout[-1000:]}{generator.stderr[-2000:]}")
        reader.join(timeout=120)
    finally:
        done.set()
        reader.join(timeout=5)
        consumer.close()
    if len(created) < count:
        raise RuntimeError(f"only {len(created)} of {count} records were consumed from {topic}")
    ts = np.frombuffer(created, dtype=np.float64)
    lat = (np.frombuffer(received, dtype=np.float64) - ts)[ts >= ts.min() + warmup_s * 1000.0]
    return {"rate": rate, "max_wait_ms": max_wait_ms, "events": len(lat),
            "generator": generator.stdout.strip(),
            **{f"{name}_ms": float(np.percentile(lat, q)) for name, q in (("p50", 50), ("p99", 99), ("p999", 99.9))}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stream.bench.floor", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--broker", choices=["kafka", "tansu"], default="kafka")
    parser.add_argument("--bootstrap-servers", default=None, help="use this cluster instead of starting a broker")
    parser.add_argument("--rate", type=float, action="append", required=True,
                        help="events/s offered (repeat for several runs on one broker)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per run (after warm-up)")
    parser.add_argument("--warmup-seconds", type=float, default=3.0)
    parser.add_argument("--max-wait-ms", type=float, default=5.0, help="sets fetch.wait.max.ms as the worker does")
    args = parser.parse_args(argv)
    kind: BrokerKind = args.broker
    broker = None if args.bootstrap_servers else start_broker(kind, kafka_heap=KafkaHeap.for_benchmark())
    try:
        bootstrap = args.bootstrap_servers or broker.bootstrap  # type: ignore[union-attr]
        for rate in args.rate:
            result = measure_floor(bootstrap, rate, args.seconds, args.warmup_seconds, args.max_wait_ms)
            print(json.dumps({"broker": args.bootstrap_servers or kind, **result}), flush=True)
    finally:
        if broker is not None:
            broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
