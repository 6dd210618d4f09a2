"""What the benchmark measures with: CPU and RSS of processes from /proc, metrics scraped from a worker, the
broker's collection log, and latencies read back from the output topic."""

from __future__ import annotations

import http.client
import os
import re
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, TIMESTAMP_LOG_APPEND_TIME, Consumer, Message, TopicPartition

from stream.codec import SchemaRegistry, decode
from stream.kafka.topics import partitions_of
from stream.local.children import WorkerProcess
from stream.ops.verify import headers_of, input_source


class CpuSampler:
    """CPU seconds (user + system, from ``/proc/<pid>/stat``) of named processes, sampled on a thread every
    ``every_s`` and once more on exit, so that the cores each used over a window of wall-clock time can be read
    afterwards. Where ``/proc`` is missing, or a process is gone, it simply has no samples."""

    def __init__(self, every_s: float = 0.25) -> None:
        self.every_s = every_s
        self.samples: list[tuple[float, dict[str, float]]] = []  # (time.time(), {name: CPU seconds})
        self._pids: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def watch(self, name: str, pid: int | None) -> None:
        if pid is not None:
            self._pids = {**self._pids, name: pid}

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        now = time.time()
        self.samples.append((now, {name: c for name, pid in self._pids.items() if (c := cpu_seconds(pid)) is not None}))

    def _run(self) -> None:
        self._sample()
        while not self._stop.wait(self.every_s):
            self._sample()
        self._sample()  # the window's end may fall after the last tick

    def cores(self, start: float, end: float) -> dict[str, float]:
        """Mean cores each process used between wall-clock times ``start`` and ``end`` (epoch seconds). Each
        process's CPU seconds are interpolated linearly between its samples at the window's ends, so a window
        shorter than the sampling step (or a sampler thread held up on a busy machine) still reads: a window
        between two samples gets their slope. A window reaching past a process's samples (it started late or
        exited early) is cut to them; a process with fewer than two samples, or none spanning any of the window,
        is left out."""
        out = {}
        for name in self._pids:
            mine = [(t, cpu[name]) for t, cpu in self.samples if name in cpu]
            rate = _mean_slope(mine, start, end)
            if rate is not None:
                out[name] = rate
        return out


def _mean_slope(points: list[tuple[float, float]], start: float, end: float) -> float | None:
    """The mean slope of the piecewise-linear curve through ``points`` (time-ordered) over ``[start, end]`` cut to
    the points' span; at a single instant, the slope of the segment holding it. None: fewer than two points, or
    no overlap."""
    if len(points) < 2 or points[-1][0] <= points[0][0]:
        return None
    ts = np.array([t for t, _ in points])
    cs = np.array([c for _, c in points])
    lo, hi = max(start, ts[0]), min(end, ts[-1])
    if hi < lo:
        return None
    if hi > lo:
        return float((np.interp(hi, ts, cs) - np.interp(lo, ts, cs)) / (hi - lo))
    j = min(max(int(np.searchsorted(ts, lo, side="right")), 1), len(ts) - 1)
    while j < len(ts) - 1 and ts[j] <= ts[j - 1]:
        j += 1
    return float((cs[j] - cs[j - 1]) / (ts[j] - ts[j - 1])) if ts[j] > ts[j - 1] else None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process so far, or None (no ``/proc``, or no such process)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def wait_assigned(worker: WorkerProcess, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while " assigned " not in worker.output():
        if worker.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the worker was never assigned its partitions: {worker.output()[-3000:]}")
        time.sleep(0.05)


def generator_rate(line: str) -> float | None:
    found = re.search(r"rate=([\d,]+) rec/s", line)
    return float(found.group(1).replace(",", "")) if found else None


def rss_mib(pid: int, field: str = "VmRSS") -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def scrape(port: int, name: str) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as response:
            return metric(response.read().decode(), name)
    except (OSError, http.client.HTTPException):  # not up yet, or exiting (a response cut short)
        return None


def ready(port: int) -> bool:
    """Whether the worker on ``port`` answers ``/readyz`` 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def read_all(bootstrap: str, topic: str, count: int, deadline: float) -> list[Message]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-reader-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions_of(bootstrap, topic)])
    found: list[Message] = []
    try:
        while len(found) < count and time.monotonic() < deadline:
            found += [m for m in consumer.consume(10_000, 0.2) if m.error() is None]
    finally:
        consumer.close()
    if len(found) < count:
        raise RuntimeError(f"only {len(found)} of {count} records arrived on {topic}")
    return found


def read_latencies(bootstrap: str, input_topic: str, output_topic: str, count: int,
                    timeout_s: float = 180.0) -> tuple[np.ndarray, bool]:
    """Rows of (event ts_ms, pipeline ms, from-event ms, batch size, input append ms, output partition, output
    offset), one per prediction, and whether every timestamp was the broker's append time (a broker that ignores
    LogAppendTime gives producers' CreateTime).

    Pipeline latency joins each prediction to its input record through the input partition and offset that
    the prediction carries."""
    deadline = time.monotonic() + timeout_s
    appended = {}
    log_append = True
    for m in read_all(bootstrap, input_topic, count, deadline):
        ts_type, ts = m.timestamp()
        log_append = log_append and ts_type == TIMESTAMP_LOG_APPEND_TIME
        appended[(m.partition(), m.offset())] = ts
    registry = SchemaRegistry.from_dir()
    rows = np.empty((count, 7), dtype=np.float64)
    for i, m in enumerate(read_all(bootstrap, output_topic, count, deadline)):
        ts_type, ts = m.timestamp()
        log_append = log_append and ts_type == TIMESTAMP_LOG_APPEND_TIME
        record = decode(registry, m.value())[1]
        source = input_source(record, headers_of(m))[1:]
        rows[i] = (record["event_ts_ms"], ts - appended[source], ts - record["event_ts_ms"], record["batch_size"],
                   appended[source], m.partition(), m.offset())
    return rows, log_append


def visible_latencies(rows: np.ndarray, receipts: np.ndarray) -> np.ndarray:
    """For each row of :func:`read_latencies`, ms from its input record's append to a reader's receipt of its
    prediction (``receipts``: rows of (partition, offset, receipt ms) from ``stream.bench.visibility``). A
    prediction the reader never got raises: the reader is given the same count and must have read them all."""
    def key(partition: np.ndarray, offset: np.ndarray) -> np.ndarray:
        return partition.astype(np.int64) * (1 << 40) + offset.astype(np.int64)

    want = key(rows[:, 5], rows[:, 6])
    if len(receipts) == 0:
        raise RuntimeError(f"the reader did not receive {len(want)} of {len(want)} predictions")
    keys = key(receipts[:, 0], receipts[:, 1])
    order = np.argsort(keys)
    got = keys[order]
    at = np.minimum(np.searchsorted(got, want), len(got) - 1)
    missing = int(np.sum(got[at] != want))
    if missing:
        raise RuntimeError(f"the reader did not receive {missing} of {len(want)} predictions")
    visible: np.ndarray = receipts[order[at], 2] - rows[:, 4]
    return visible


_GC_PAUSE = re.compile(r"^\[(\d+)ms\].*\bGC\(\d+\) Pause .* (\d+(?:\.\d+)?)ms$")


def gc_pauses(log: Path, start: float, end: float) -> dict[str, Any]:
    """The JVM's stop-the-world pauses (``-Xlog:gc`` lines decorated with wall-clock ms first) that overlap the
    wall-clock window [``start``, ``end``] (epoch seconds): how many, their total and the longest, ms. A line is
    written as its pause ends; rotated files (``gc.log.0``, ...) are read too; no log reads as no pause."""
    durations: list[float] = []
    for path in sorted(log.parent.glob(log.name + "*")):
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            found = _GC_PAUSE.match(line.rstrip())
            if found:
                ended_s, ms = int(found.group(1)) / 1000.0, float(found.group(2))
                if ended_s >= start and ended_s - ms / 1000.0 <= end:
                    durations.append(ms)
    return {"pauses": len(durations), "total_ms": float(sum(durations)), "max_ms": max(durations, default=0.0)}


PERCENTILES = (("p50", 50), ("p99", 99), ("p999", 99.9))
