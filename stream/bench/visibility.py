"""When a downstream reader sees each prediction: ``python -m stream.bench.visibility``.

Runs beside a latency step as a separate process, like a real downstream consumer: reads every partition of the
output topic from the beginning with the given ``isolation.level`` and writes one row per record, (partition,
offset, wall-clock ms at which ``consume()`` returned it), to ``--out`` as a NumPy array. Under exactly-once a
``read_committed`` reader gets a transaction's records only once its commit marker is written, so the time from
the input record's append to this receipt is the latency such a reader pays, transaction commit included.

Receipt times are stamped when ``consume()`` returns, which waits at most ``--poll-ms`` (2 ms) for more records:
that is the bound on the stamping error. Prints ``ready`` once it is assigned and fetching.
Exits 0 when ``--count`` records were read, 1 when the deadline passed first (the rows read are written anyway).
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from stream.kafka.topics import partitions_of


def read_receipts(bootstrap: str, topic: str, count: int, isolation: str, fetch_wait_ms: int, poll_ms: float,
                  timeout_s: float) -> np.ndarray:
    """Rows of (partition, offset, receipt ms since the epoch), at most ``count``, in arrival order. Prints
    ``ready`` once it is assigned and fetching."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-visibility-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "isolation.level": isolation,
                         "fetch.wait.max.ms": fetch_wait_ms})
    # Per consume() call: its messages' partitions and offsets as lists, and one receipt time (a Python loop
    # writing rows per message cost the reader a core at 300,000 records/s on 2 cores, and it fell behind).
    partitions: list[int | None] = []
    offsets: list[int | None] = []
    times: list[float] = []
    sizes: list[int] = []
    n = 0
    deadline = time.monotonic() + timeout_s
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions_of(bootstrap, topic)])
        first = consumer.consume(min(count, 100_000), 0.5)  # connects and starts fetching before the load begins
        print("ready", flush=True)
        batch = first
        while True:
            now_ms = time.time() * 1000.0
            if batch:
                good = [m for m in batch if m.error() is None][:count - n]
                partitions += [m.partition() for m in good]
                offsets += [m.offset() for m in good]
                times.append(now_ms)
                sizes.append(len(good))
                n += len(good)
            if n >= count or time.monotonic() >= deadline:
                break
            batch = consumer.consume(min(count - n, 100_000), poll_ms / 1000.0)
    finally:
        consumer.close()
    rows = np.empty((n, 3), dtype=np.float64)
    rows[:, 0] = partitions
    rows[:, 1] = offsets
    rows[:, 2] = np.repeat(np.asarray(times, dtype=np.float64), sizes)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stream.bench.visibility", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--count", type=int, required=True, help="records to read")
    parser.add_argument("--isolation", choices=["read_committed", "read_uncommitted"], default="read_committed")
    parser.add_argument("--fetch-wait-ms", type=int, default=5, help="fetch.wait.max.ms (5)")
    parser.add_argument("--poll-ms", type=float, default=2.0, help="the most consume() waits for more records (2)")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="give up after this long (600)")
    parser.add_argument("--out", type=Path, required=True, help="write the rows here (.npy)")
    args = parser.parse_args(argv)
    if args.count < 1 or args.poll_ms <= 0 or args.fetch_wait_ms < 0:
        parser.error("--count and --poll-ms must be positive and --fetch-wait-ms not negative")
    rows = read_receipts(args.bootstrap_servers, args.topic, args.count, args.isolation, args.fetch_wait_ms,
                         args.poll_ms, args.timeout_s)
    np.save(args.out, rows)
    if len(rows) < args.count:
        print(f"only {len(rows)} of {args.count} records arrived on {args.topic} within {args.timeout_s:g} s",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
