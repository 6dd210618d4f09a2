"""What a worker holds in memory when a producer writes large records: ``python -m stream.bench.large_values``.

A buggy or hostile producer can write valid events whose values are nearly a broker's limit (1 MiB): the demo's
``event_id`` is a string of any length, which the prediction echoes; or small events with large keys or headers,
or a great many headers. Each variant pre-produces ``--records`` such events (``--size`` bytes of one repeated
character, so that lz4 packs them about 250 to 1) to a topic of ``--partitions`` partitions, drains them with
one worker (``--stop-at-end``, the demo model) and reads its peak RSS (``VmHWM``); the same worker on the same
number of small events gives the floor. Variants, in one run on one local Apache Kafka:

* ``small``: events of 100-byte ids, the worker at its defaults (the floor);
* ``unbounded``: ``--max-batch-bytes 1073741824`` (batches bounded by their count alone, as before the flag);
* ``default``: the worker at its defaults (``--max-batch-bytes`` 32 MiB);
* ``fetch-1mib``: the defaults with ``KAFKA_CONSUMER_FETCH_MAX_BYTES=1048576`` (librdkafka holds a fetch response
  decompressed whole: at its 50 MiB default, one response of several partitions);
* ``uncompressed``: the defaults, the events produced without compression;
* ``zstd``: the defaults, the events produced with zstd (which packs 900 KB of one character into 46 bytes, where
  lz4 stops near 250 to 1);
* ``zstd-partition-fetch-64kib``: the same with ``KAFKA_CONSUMER_FETCH_MAX_BYTES=1048576`` and
  ``KAFKA_CONSUMER_MAX_PARTITION_FETCH_BYTES=65536`` (librdkafka holds a fetch response decompressed whole);
* ``zstd-topic-lz4``: zstd from the producer into a topic whose ``compression.type`` is ``lz4`` (the broker
  recompresses each batch), the worker at its defaults;
* ``many-headers``: ``--header-records`` small events, each carrying 100,000 empty headers (the most librdkafka
  parses in a record; some 300 KB, packed about 250 to 1), the worker at its defaults;
* ``large-header``: small events, each carrying a ``traceparent`` header of ``--size`` bytes (a header the worker
  keeps and carries onto the prediction), the worker at its defaults;
* ``large-header-queue-1000``, ``large-header-queue-100``: the same with ``KAFKA_CONSUMER_QUEUED_MIN_MESSAGES`` at
  1000 and 100, where the worker sets 200 (librdkafka counts a record's value alone toward its 16 MiB prefetch
  bound, not its headers or key: records of small values stop its prefetch only at this count);
* ``large-key``: small events keyed by ``--size`` bytes, the worker at its defaults;
* ``many-headers-confluent``, ``large-header-confluent``, ``large-key-confluent``: the same three with
  ``--no-native-consumer`` (confluent-kafka's ``consume``, the path of a worker whose C extension is not built).
* ``unreadable``: small events, and before them on each partition one zstd batch of 200,000 values of 550 bytes
  (110 MB decompressed: past librdkafka's ``receive.message.max.bytes``, so the consumer
  cannot decompress it, `stream.kafka.unreadable`), the worker at its defaults; ``unreadable-confluent``: the same
  with ``--no-native-consumer``.

Writes the figures to ``--results`` as JSON and prints one line per variant.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from stream.bench.probes import rss_mib

VARIANTS: dict[str, dict[str, Any]] = {
    "small": {"size": 100},
    "unbounded": {"args": ["--max-batch-bytes", str(1 << 30)]},
    "default": {},
    "fetch-1mib": {"env": {"KAFKA_CONSUMER_FETCH_MAX_BYTES": "1048576"}},
    "uncompressed": {"compression": "none"},
    "zstd": {"compression": "zstd"},
    "zstd-partition-fetch-64kib": {"compression": "zstd", "env": {"KAFKA_CONSUMER_FETCH_MAX_BYTES": "1048576",
                                                                  "KAFKA_CONSUMER_MAX_PARTITION_FETCH_BYTES": "65536"}},
    "zstd-topic-lz4": {"compression": "zstd", "topic_config": {"compression.type": "lz4"}},
    "many-headers": {"size": 100, "headers": ("x", 0, 100_000), "records": "header_records"},
    "large-header": {"size": 100, "headers": ("traceparent", "size", 1)},
    "large-header-queue-1000": {"size": 100, "headers": ("traceparent", "size", 1),
                                "env": {"KAFKA_CONSUMER_QUEUED_MIN_MESSAGES": "1000"}},
    "large-header-queue-100": {"size": 100, "headers": ("traceparent", "size", 1),
                               "env": {"KAFKA_CONSUMER_QUEUED_MIN_MESSAGES": "100"}},
    "large-key": {"size": 100, "key": True},
    "many-headers-confluent": {"size": 100, "headers": ("x", 0, 100_000), "records": "header_records",
                               "args": ["--no-native-consumer"]},
    "large-header-confluent": {"size": 100, "headers": ("traceparent", "size", 1), "args": ["--no-native-consumer"]},
    "large-key-confluent": {"size": 100, "key": True, "args": ["--no-native-consumer"]},
    "unreadable": {"size": 100, "unreadable": (200_000, 550)},
    "unreadable-confluent": {"size": 100, "unreadable": (200_000, 550), "args": ["--no-native-consumer"]},
}


def produce_unreadable(bootstrap: str, topic: str, partition: int, records: int = 120, size: int = 900_000) -> None:
    """One zstd batch of ``records`` values of ``size`` bytes of one character (at the defaults a few KB on the
    wire, under the broker's max.message.bytes, and 108 MB decompressed, past librdkafka's
    receive.message.max.bytes): what a producer, buggy or hostile, sends with the settings below (or a Java
    producer's size estimate, librdkafka #3935)."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "zstd", "linger.ms": 60_000,
                         "message.max.bytes": 1_000_000_000, "batch.size": 2**31 - 1, "batch.num.messages": 1_000_000,
                         "queue.buffering.max.kbytes": 2**31 - 1, "queue.buffering.max.messages": 2**31 - 1})
    failed: list[str] = []
    value = b"u" * size
    for _ in range(records):
        producer.produce(topic, value, b"unreadable", partition=partition,
                         on_delivery=lambda err, _msg: failed.append(str(err)) if err else None)
    if producer.flush(120) or failed:
        raise RuntimeError(f"{topic}[{partition}]: the unreadable batch was not written: {failed[:1]}")


def produce(bootstrap: str, topic: str, records: int, size: int, compression: str,
            headers: list[tuple[str, str | bytes | None]] | None = None, key_bytes: int = 0) -> int:
    """``records`` FraudEvents with an ``event_id`` of ``size`` bytes, each with ``headers`` and a key of
    ``key_bytes`` bytes past its number; returns one value's bytes."""
    import io
    import struct

    import fastavro
    from confluent_kafka import Producer

    schema = fastavro.parse_schema(json.loads((Path(__file__).parents[2] / "schemas/fraud_event.avsc").read_text()))
    header_bytes = sum(len(k) + len(v or b"") + 4 for k, v in headers or [])
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "compression.type": compression,
                         "message.max.bytes": size + header_bytes + key_bytes + 100_000})
    value = b""
    for i in range(records):
        buf = io.BytesIO()
        buf.write(b"\0" + struct.pack(">I", 1))
        fastavro.schemaless_writer(buf, schema, {"event_id": f"{i:08d}" + "x" * size, "key": f"k{i}",
                                                 "ts_ms": int(time.time() * 1000), "features": [0.5] * 32})
        value = buf.getvalue()
        while True:
            try:
                producer.produce(topic, value, key=f"k{i}".encode() + b"0" * key_bytes, headers=headers)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    if producer.flush(300):
        raise RuntimeError(f"{topic}: records left unacknowledged")
    return len(value)


def drain(bootstrap: str, topic: str, name: str, args: list[str], env: dict[str, str], logs: Path,
          timeout_s: float) -> dict[str, Any]:
    """One worker draining ``topic`` to its end; its peak RSS and what it says it did."""
    summary = logs / f"{name}.json"
    cmd = [sys.executable, "-m", "stream", "worker", "--bootstrap-servers", bootstrap, "--input-topic", topic,
           "--output-topic", f"{topic}-out", "--dlq-topic", f"{topic}-dlq", "--group-id", f"{topic}-g",
           "--stop-at-end", "--metrics-port", "0", "--summary-json", str(summary), *args]
    started = time.monotonic()
    with open(logs / f"{name}.log", "wb") as out:
        worker = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env})
        peak = 0.0
        try:
            while worker.poll() is None:
                peak = max(peak, rss_mib(worker.pid, "VmHWM") or 0.0)
                if time.monotonic() - started > timeout_s:
                    raise RuntimeError(f"{name}: the worker did not drain {topic} within {timeout_s:.0f} s")
                time.sleep(0.05)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    if worker.returncode != 0:
        raise RuntimeError(f"{name}: the worker exited {worker.returncode} (log: {logs / f'{name}.log'})")
    said = json.loads(summary.read_text())
    measured = re.findall(r"measured in ([0-9.]+) s", (logs / f"{name}.log").read_text(errors="replace"))
    return {"peak_rss_mib": round(peak), "seconds": round(time.monotonic() - started, 1),
            "predicted": said["predicted"], "dead_lettered": said["dead_lettered"],
            "unreadable_measured_s": [float(s) for s in measured] or None, "batches": said["batches"],
            "mean_batch_size": round(said["batched_records"] / max(said["batches"], 1), 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stream.bench.large_values", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=6000, help="events per variant (6000)")
    parser.add_argument("--size", type=int, default=900_000,
                        help="bytes of each large event's id, large header or large key (900000)")
    parser.add_argument("--header-records", type=int, default=1000,
                        help="events of many-headers, each taking librdkafka some 6 MB to parse (1000)")
    parser.add_argument("--partitions", type=int, default=4, help="of each input topic (4)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per drain (600)")
    parser.add_argument("--bootstrap-servers", default=None, help="default: start a local Apache Kafka")
    parser.add_argument("--results", type=Path, default=None, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variant(s) {', '.join(sorted(unknown))}")
    from confluent_kafka import libversion
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    from stream.local.broker import start_broker

    broker = start_broker("kafka") if args.bootstrap_servers is None else None
    bootstrap: str = args.bootstrap_servers if broker is None else broker.bootstrap
    run = time.strftime("%H%M%S")  # topics of their own on a cluster used before
    rows: dict[str, Any] = {}
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        logs = Path(tempfile.mkdtemp(prefix="large-values-"))  # kept when a drain fails: its log is there
        for name in args.variants.split(","):
            variant = VARIANTS[name]
            topic = f"large-{name}-{run}"
            names = (topic, f"{topic}-out", f"{topic}-dlq")
            configs = {topic: variant.get("topic_config", {})}  # the input topic's
            for future in admin.create_topics([NewTopic(t, args.partitions, 1, config=configs.get(t, {}))
                                               for t in names]).values():
                future.result()
            size = variant.get("size", args.size)
            records = getattr(args, variant.get("records", "records"))
            headers = None
            if "headers" in variant:
                header, length, count = variant["headers"]
                headers = [(header, b"0" * (args.size if length == "size" else length))] * count
            key_bytes = args.size if variant.get("key") else 0
            unreadable: tuple[int, int] | None = variant.get("unreadable")
            if unreadable is not None:  # one batch at the head of each partition
                for partition in range(args.partitions):
                    produce_unreadable(bootstrap, topic, partition, *unreadable)
            value_bytes = produce(bootstrap, topic, records, size, variant.get("compression", "lz4"), headers,
                                  key_bytes)
            row = drain(bootstrap, topic, name, variant.get("args", []), variant.get("env", {}),
                        logs, args.timeout_s)
            rows[name] = {"records": records, "value_bytes": value_bytes, "key_bytes": key_bytes or None,
                          "headers": None if headers is None else {"count": len(headers),
                                                                   "bytes": sum(len(k) + len(v or b"")
                                                                                for k, v in headers)},
                          "compression": variant.get("compression", "lz4"),
                          "topic_config": variant.get("topic_config") or None,
                          "worker_args": variant.get("args", []), "env": variant.get("env", {}),
                          "unreadable_batches": None if unreadable is None else {
                              "per_partition": 1, "records": unreadable[0], "value_bytes": unreadable[1]}, **row}
            carrying = "" if headers is None else (f" carrying {len(headers):,} header(s) of "
                                                   f"{rows[name]['headers']['bytes']:,} B")
            carrying += f" keyed by {key_bytes:,} B" if key_bytes else ""
            if unreadable is not None:
                carrying += (f" behind {args.partitions} unreadable batches of {unreadable[0]:,} (dead-lettered: "
                             f"{row['dead_lettered']:,}, each measured in {row['unreadable_measured_s']} s)")
            print(f"{name}: {records} values of {value_bytes:,} B{carrying} ({rows[name]['compression']}): peak RSS "
                  f"{row['peak_rss_mib']:,} MiB, {row['batches']} batches of {row['mean_batch_size']} on "
                  f"average, {row['seconds']} s", flush=True)
    finally:
        if broker is not None:
            broker.stop()
    shutil.rmtree(logs)
    report = {"what": "one worker's peak RSS draining large records (stream.bench.large_values)",
              "revision": _revision(), "records": args.records, "partitions": args.partitions, "variants": rows,
              "machine": f"{os.cpu_count()} cores, Python {platform.python_version()}, librdkafka {libversion()[0]}"}
    if args.results is not None:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        args.results.write_text(json.dumps(report, indent=1) + "\n")
    return 0


def _revision() -> str:
    """The worker code's commit (this tree's), with "+changes" where its stream/ (but this bench) differs from it."""
    root = Path(__file__).parents[2]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "stream", ":(exclude)stream/bench"],
                               cwd=root, capture_output=True).returncode != 0
    except OSError:  # no git
        return "unknown"
    return head.stdout.strip() + ("+changes" if dirty else "") if head.returncode == 0 else "unknown"


if __name__ == "__main__":
    sys.exit(main())
