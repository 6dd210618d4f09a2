"""What carrying a trace context and tracing costs the worker: ``python -m stream.bench.trace``.

The same pre-produced demo events twice on one local broker: as produced (no headers) and copied with a W3C
``traceparent`` and ``tracestate`` on every record. One worker at its defaults drains each with ``--stop-at-end``,
a fresh consumer group each time, in interleaved rounds of four kinds:

* ``untraced``: no record has a trace context; tracing off (the worker as it is without them);
* ``traced``: every record has one, tracing off: the context is carried onto each prediction, so the batch takes
  the per-record publishing path instead of the one-buffer one;
* ``untraced-otel``: no record has one, OpenTelemetry on (``OTEL_EXPORTER_OTLP_ENDPOINT`` at a receiver in this
  process, `stream.bench.otlp`): 0 % traced, which should cost nothing;
* ``traced-otel``: every record has one, OpenTelemetry on: 100 % traced, five spans a record and one a batch,
  exported with the SDK's defaults (a queue of 2,048 spans: what it cannot send in time it drops, and the spans
  the receiver got are counted);
* ``unsampled-otel``: every record has one whose sampled flag is off (what an upstream that samples sends for the
  records it does not sample), OpenTelemetry on: no span is made.

Prints each drain, the medians and their ratios to ``untraced``, and writes them to ``--results`` as JSON. The
untraced drain is the worker as it is with no traced record: compare it with another revision's with
``python -m stream.bench.ab``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from stream.bench.bench_config import BenchConfig
from stream.bench.otlp import OtlpReceiver
from stream.bench.revisions import ROOT
from stream.bench.runner import PARTITIONS, Bench
from stream.kafka.topics import create_topics, end_offsets

KINDS = ("untraced", "traced", "untraced-otel", "traced-otel", "unsampled-otel")


def copy_traced(bootstrap: str, source: str, target: str, count: int, sampled: bool = True) -> None:
    """Every record of ``source`` (``count`` of them) into ``target``, same partition, key and value, with a trace
    context of its own (its sampled flag set or not)."""
    create_topics(bootstrap, [target], PARTITIONS)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"copy-{secrets.token_hex(4)}",
                         "enable.auto.commit": False})
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 1_000_000})
    ends = end_offsets(bootstrap, source)
    consumer.assign([TopicPartition(source, p, OFFSET_BEGINNING) for p in ends])
    copied = 0
    deadline = time.monotonic() + 600
    try:
        while copied < count and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, 0.5):
                if msg.error() is not None:
                    continue
                parent = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-{'01' if sampled else '00'}".encode()
                while True:
                    try:
                        producer.produce(target, msg.value(), msg.key(), partition=msg.partition() or 0,
                                         headers=[("traceparent", parent), ("tracestate", b"bench=1")])
                        break
                    except BufferError:
                        producer.poll(0.1)
                copied += 1
            producer.poll(0)
        if producer.flush(120) != 0 or copied < count:
            raise RuntimeError(f"copied {copied} of {count} records to {target}")
    finally:
        consumer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stream.bench.trace", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=3, help="drains of each, interleaved (3)")
    parser.add_argument("--results", type=Path, default=None, help="write the drains here as JSON")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"which drains, comma-separated ({','.join(KINDS)})")
    args = parser.parse_args(argv)
    order = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not order or any(k not in KINDS for k in order) or "untraced" not in order:
        parser.error(f"--kinds: some of {', '.join(KINDS)}, untraced among them (the ratios' base)")
    from stream.local.broker import start_kafka
    from stream.models.train_demo import ensure_trained

    work = Path(tempfile.mkdtemp(prefix="stream-trace-"))
    rev = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.strip()
    broker = start_kafka()
    receiver = OtlpReceiver(keep=False)
    endpoint = receiver.start()
    try:
        model_dir = ensure_trained(work / "model")
        bench = Bench(broker.bootstrap, BenchConfig(events=args.events), model_dir, broker.pid)
        bench.prepare()
        topics = {"traced": f"{bench.input}-traced", "unsampled": f"{bench.input}-unsampled"}
        if any(k.startswith("traced") for k in order):
            copy_traced(broker.bootstrap, bench.input, topics["traced"], args.events)
        if "unsampled-otel" in order:
            copy_traced(broker.bootstrap, bench.input, topics["unsampled"], args.events, sampled=False)
        drains: list[dict[str, Any]] = []
        for r in range(args.rounds):
            for kind in order if r % 2 == 0 else order[::-1]:
                before = receiver.count
                otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint} if kind.endswith("-otel") else {}
                drain = bench.worker_drain(f"{kind}-{r}", [], env=otel,
                                           input_topic=topics.get(kind.split("-")[0]))
                cores = (drain.cpu_cores or {}).get("workers")
                drains.append({"kind": kind, "round": r, "events": drain.events, "seconds": drain.seconds,
                               "rate": drain.rate, "steady_rate": drain.steady_rate, "worker_cores": cores,
                               "worker_cpu_us_per_event": (cores * drain.seconds / drain.events * 1e6
                                                           if cores and drain.events else None),
                               "spans_received": receiver.count - before})
                d = drains[-1]
                print(f"round {r} {kind}: {d['events']:,} events in {d['seconds']:.2f} s, {d['rate']:,.0f} "
                      f"events/s" + (f", {d['worker_cpu_us_per_event']:.2f} µs of worker CPU an event"
                                     if d["worker_cpu_us_per_event"] else "")
                      + (f", {d['spans_received']:,} spans received" if otel else ""), flush=True)
        medians = {kind: statistics.median(d["rate"] for d in drains if d["kind"] == kind) for kind in order}
        cpu = {kind: statistics.median(d["worker_cpu_us_per_event"] for d in drains
                                       if d["kind"] == kind and d["worker_cpu_us_per_event"] is not None)
               if any(d["worker_cpu_us_per_event"] for d in drains if d["kind"] == kind) else None
               for kind in order}
        ratios = {kind: medians[kind] / medians["untraced"] for kind in order if kind != "untraced"}
        spread = {kind: (min(d["rate"] for d in drains if d["kind"] == kind),
                         max(d["rate"] for d in drains if d["kind"] == kind)) for kind in order}
        print("median drain: " + ", ".join(
            f"{kind} {medians[kind]:,.0f} events/s ({spread[kind][0]:,.0f}-{spread[kind][1]:,.0f})"
            + (f" = {ratios[kind]:.3f}x untraced" if kind in ratios else "") for kind in order), flush=True)
        if args.results is not None:
            args.results.parent.mkdir(parents=True, exist_ok=True)
            args.results.write_text(json.dumps({
                "method": f"{args.rounds} interleaved rounds of --stop-at-end drains of {args.events:,} demo "
                          "events, one worker at defaults, a fresh group each: as produced, and copied with a "
                          "traceparent (sampled, or not: unsampled) and tracestate on every record; each with "
                          "OpenTelemetry off, and on "
                          "(-otel: OTEL_EXPORTER_OTLP_ENDPOINT at an OTLP/HTTP receiver in the benchmark's "
                          "process, the SDK's other settings at their defaults)",
                "rev": rev, "cpus": os.cpu_count(), "medians": medians, "spread": spread, "ratios": ratios,
                "worker_cpu_us_per_event": cpu, "drains": drains,
                "at": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=2) + "\n")
        return 0
    finally:
        receiver.stop()
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
