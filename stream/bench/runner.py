"""``python -m stream bench``: one broker, one pre-produced data set, the same demo model for every contender.

Prints a table and writes ``bench.json`` and PNG plots under ``results/bench-<time>/`` (not committed).

Why one module of about 590 lines: `Bench` holds what every contender shares in one run (the broker, the topics,
the pre-produced events, the results folder, the console) and runs each of them on it; `run_bench` orders the
sections. The contenders' own code is elsewhere (`contenders`, `quix`, `generic`, `jvm`, `floor`, `text`); split
by contender, this file would pass that shared state between modules and read no easier."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from producers.load import produce_events
from stream.bench.bench_config import BenchConfig
from stream.bench.floor import measure_floor
from stream.bench.latency_step import latency_step
from stream.bench.probes import (
    CpuSampler,
    ready,
    rss_mib,
    scrape,
    wait_assigned,
)
from stream.bench.processes import drain_of, mean_event_bytes, versions
from stream.bench.report import BEST_SETTINGS, Drain, compare_drains, median_drain, write_plots
from stream.bench.revisions import checkout_revision, remove_checkout, short_rev
from stream.bench.text import TextBenchConfig, run_text_bench
from stream.config import WorkerSettings
from stream.kafka.topics import create_topics
from stream.local.broker import BrokerKind, free_port, start_broker
from stream.local.children import WorkerProcess, die_with_parent
from stream.local.kafka_node import KafkaHeap
from stream.models.demo import DEFAULT_MODEL_DIR
from stream.models.train_demo import ensure_trained

PARTITIONS = 8
DRAIN_BOUND_S = 900.0  # a drain whose workers have not all exited by then is stopped and reported
# Peers batch like the worker's defaults: take/consume up to max_batch_size within max_wait_ms.
PEER_BATCH = WorkerSettings.model_fields["max_batch_size"].default
PEER_WAIT_MS = WorkerSettings.model_fields["max_wait_ms"].default


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

    def topic(self, stem: str, log_append_time: bool = False, partitions: int = PARTITIONS) -> str:
        name = f"bench-{stem}-{self.run}"
        create_topics(self.bootstrap, [name], partitions,
                      config={"message.timestamp.type": "LogAppendTime"} if log_append_time else None)
        return name

    # ------------------------------------------------------------------ drain throughput
    def prepare(self) -> float:
        create_topics(self.bootstrap, [self.input], PARTITIONS)
        summary = produce_events(self.bootstrap, self.input, self.cfg.events, seed=2026)
        if summary.failed:
            raise RuntimeError(f"pre-produce failed: {summary.line()}")
        return summary.rate

    def contender(self, name: str, events: int, input_topic: str | None = None, tag: str = "",
                  extra: tuple[str, ...] = ()) -> Drain:
        """A `stream.bench.contenders` process draining ``events`` of ``input_topic`` (the events' by default)."""
        out = self.topic(f"{name}{tag}-out")
        cmd = [sys.executable, "-m", "stream.bench.contenders", name, "--bootstrap", self.bootstrap, "--input",
               input_topic or self.input, "--output", out, "--group", f"bench-{name}{tag}-{self.run}",
               "--events", str(events), "--model-dir", str(self.model_dir), "--batch", str(PEER_BATCH),
               "--wait-ms", str(PEER_WAIT_MS), "--data-dir", str(self.work / f"{name}{tag}-data"), *extra]
        return drain_of(name, subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False))

    def quix_contender(self, name: str, events: int) -> Drain:
        """A Quix Streams contender (`stream.bench.quix`, in its own venv) draining ``events``."""
        from stream.bench import quix

        out = self.topic(f"{name}-out")
        cmd, env = quix.command(name, ["--bootstrap", self.bootstrap, "--input", self.input, "--output", out,
                                       "--group", f"bench-{name}-{self.run}", "--events", str(events),
                                       "--model-dir", str(self.model_dir)])
        return drain_of(name, subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env=env,
                                              check=False))

    def broker_alone(self) -> dict[str, Any]:
        """Kafka's own tools on this broker: consume the pre-produced topic, produce as many records of the demo
        events' mean size, and the one-record-at-a-time end-to-end latency."""
        from stream.bench import jvm

        size = mean_event_bytes()
        return {
            "record_size": size,
            "consume": jvm.consumer_performance(self.bootstrap, self.input, self.cfg.events,
                                                f"bench-consumer-perf-{self.run}"),
            "produce": jvm.producer_performance(self.bootstrap, self.topic("producer-perf"), self.cfg.events, size),
            "end_to_end": jvm.end_to_end_latency(self.bootstrap, self.topic("e2e", partitions=1),
                                                 self.cfg.end_to_end_records, size)}

    def jvm_contender(self, name: str, main_class: str, *args: str) -> Drain:
        """A JVM contender (`stream.bench.jvm`) draining the pre-produced events into its own output topic."""
        from stream.bench.jvm import run_contender

        out = self.topic(f"{name}-out")
        result = run_contender(main_class, ["--bootstrap", self.bootstrap, "--input", self.input, "--output", out,
                                            "--group", f"bench-{name}-{self.run}", "--events", str(self.cfg.events),
                                            *args])
        return Drain(name, int(result["events"]), float(result["last_ts"]) - float(result["first_ts"]))

    def worker_drain(self, name: str, extra: list[str], replicas: int = 1,
                     env: dict[str, str] | None = None, cwd: Path | None = None, input_topic: str | None = None,
                     model_dir: bool = True, on_ready: Callable[[int], None] | None = None) -> Drain:
        """Replicas drain the pre-produced topic (``--stop-at-end``); the first one's RSS is sampled against
        its consumed count (from its /metrics) for the growth figure. ``model_dir``: pass the demo model's.
        ``on_ready(pid)``: called with the first replica's PID once it answers ``/readyz`` (a profiler attaching
        to the drain alone)."""
        out = self.topic(f"{name}-out")
        group = f"bench-{name}-{self.run}"
        port = free_port()
        procs = []
        for i in range(replicas):
            summary = self.work / f"{name}-{i}.json"
            metrics = ["--metrics-port", str(port), "--metrics-host", "127.0.0.1"] if i == 0 else []
            procs.append((WorkerProcess(
                ["--bootstrap-servers", self.bootstrap, "--input-topic", input_topic or self.input,
                 "--output-topic", out, "--group-id", group,
                 *(["--model-dir", str(self.model_dir)] if model_dir else []), "--stop-at-end",
                 "--summary-json", str(summary), "--log-level", "WARNING", *metrics, *extra],
                self.work / f"{name}-{i}.log", {"KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "6000", **(env or {})}, cwd),
                summary))
        peak = 0.0
        samples: list[tuple[float, float]] = []  # (consumed by replica 0, its RSS MiB)
        progress: list[tuple[float, float]] = []  # (seconds since start, consumed by replica 0)
        started = next_sample = next_progress = time.monotonic()
        ready_s: float | None = None
        with CpuSampler(every_s=0.1) as sampler:
            for i, (p, _) in enumerate(procs):
                sampler.watch(f"worker-{i}", p.pid)
            sampler.watch("broker", self.broker_pid)
            while any(p.proc.poll() is None for p, _ in procs):
                for p, _ in procs:
                    peak = max(peak, rss_mib(p.pid, "VmHWM") or 0.0)
                now = time.monotonic()
                if ready_s is None and ready(port):
                    ready_s = now - started
                    if on_ready is not None:
                        on_ready(procs[0][0].pid)
                if now >= next_progress:
                    next_progress += 0.2
                    consumed = scrape(port, "stream_records_consumed_total")
                    if consumed is not None:
                        progress.append((now - started, consumed))
                    if now >= next_sample:
                        next_sample += 0.5
                        rss = rss_mib(procs[0][0].pid)
                        if consumed and rss:
                            samples.append((consumed, rss))
                if now - started > DRAIN_BOUND_S:
                    for p, _ in procs:
                        p.kill()
                    raise RuntimeError(f"worker {name}: its replicas had not all exited {DRAIN_BOUND_S:.0f} s after "
                                       f"they started (logs in {self.work}; stopped)")
                time.sleep(0.05)
        summaries = []
        for p, path in procs:
            if p.proc.returncode != 0:
                raise RuntimeError(f"worker {name} exit {p.proc.returncode}: {p.output()[-3000:]}")
            p.kill()
            summaries.append(json.loads(path.read_text()))
        first = min(s["first_consumed_at"] for s in summaries if s["first_consumed_at"])
        last = max(s["last_committed_at"] for s in summaries if s["last_committed_at"])
        batches = sum(s["batches"] for s in summaries)
        busy, cpu_s = ({stage: sum(s.get(key, {}).get(stage, 0.0) for s in summaries)
                        for stage in summaries[0].get(key, {})} for key in ("stage_busy_s", "stage_cpu_s"))
        # The cores over the drain's own window (first record consumed to last offset committed), interpolated
        # between samples at its ends.
        cores = sampler.cores(first, last)
        cpu = {"workers": sum(v for k, v in cores.items() if k.startswith("worker-")),
               **({"broker": cores["broker"]} if "broker" in cores else {})} if cores else None
        device = [s["device_busy_s"] for s in summaries if s.get("device_busy_s") is not None]
        warm = [s["device_warm_s"] for s in summaries if s.get("device_warm_s") is not None]
        return Drain(name, sum(s["consumed"] for s in summaries), last - first, peak, samples,
                     sum(s["batched_records"] for s in summaries) / batches if batches else None,
                     sum(s.get("transactions", 0) for s in summaries) or None, busy or None, cpu,
                     progress if replicas == 1 else [], ready_s, sum(device) if device else None, batches,
                     cpu_s or None, sum(warm) if warm else None)

    def interleaved_drains(self, before: Path, rounds: int, extra: list[str] | None = None,
                           on_drain: Any = None, input_topic: str | None = None,
                           model_dir: bool = True) -> tuple[list[Drain], list[Drain]]:
        """``rounds`` drains each of this checkout's worker and of the one in ``before`` (a built checkout of
        another revision), interleaved (before, current, current, before, ...) so that the machine's drift
        between rounds falls on both; ``on_drain(round, which, drain)`` after each. ``input_topic`` and
        ``model_dir`` as `worker_drain`'s. (current, before)."""
        current: list[Drain] = []
        baseline: list[Drain] = []
        for r in range(rounds):
            order: list[tuple[str, Path | None]] = [("before", before), ("current", None)]
            for which, cwd in (order if r % 2 == 0 else order[::-1]):
                drain = self.worker_drain(f"worker-{which}-{r}", list(extra or []), cwd=cwd,
                                          input_topic=input_topic, model_dir=model_dir)
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
            wait_assigned(worker)
            generator = subprocess.run(
                [sys.executable, "-m", "producers", "--bootstrap-servers", self.bootstrap, "--topic", inp,
                 "--count", str(events), "--seed", "11", "--pregenerate"],
                capture_output=True, text=True, timeout=1800, preexec_fn=die_with_parent, check=False)
            if generator.returncode != 0:
                raise RuntimeError(f"load generator failed: {generator.stdout[-1000:]}{generator.stderr[-2000:]}")
            deadline = time.monotonic() + 300
            while (scrape(port, "stream_offsets_committed_total") or 0) < events:
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
                label: str = "", reader: str | None = None) -> dict[str, Any]:
        """`stream.bench.latency_step.latency_step`: the worker under ``load`` x ``capacity``."""
        return latency_step(self, capacity, load, wait_ms, extra, label, reader)


JVM_CONTENDERS = {  # name -> (class in stream/bench/jvm, its arguments)
    "jvm-flush": ("PassThrough", "--mode", "flush"),
    "jvm-pipelined": ("PassThrough", "--mode", "pipelined"),
    "kafka-streams": ("StreamsPassThrough", "--guarantee", "at-least-once"),
}


def pass_through_limit(drains: list[Drain]) -> float | None:
    """The faster JVM pass-through's rate (the Python one's where neither ran)."""
    jvm = [d.rate for d in drains if d.name in ("jvm-flush", "jvm-pipelined")]
    return max(jvm) if jvm else next((d.rate for d in drains if d.name == "passthrough"), None)


def run_bench(cfg: BenchConfig, broker_kind: BrokerKind = "kafka", bootstrap: str | None = None,
              console_print: Any = print) -> dict[str, Any]:
    model_dir = ensure_trained(DEFAULT_MODEL_DIR)
    heap = KafkaHeap.for_benchmark() if broker_kind == "kafka" and not bootstrap else None
    broker = None if bootstrap else start_broker(broker_kind, kafka_heap=heap)
    servers = bootstrap or broker.bootstrap  # type: ignore[union-attr]
    broker_name = "given cluster" if bootstrap else broker_kind
    report: dict[str, Any] = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
                              "broker": broker_name, "versions": versions(broker_name)}
    if heap is not None:
        report["broker_heap"] = " ".join(heap.jvm_args())
    bench: Bench | None = None
    try:
        bench = Bench(servers, cfg, model_dir, broker.pid if broker is not None else None,
                      broker.gc_log if broker is not None else None)
        report["preproduce_rate"] = bench.prepare()
        drains: list[Drain] = []
        jdk = all(shutil.which(tool) for tool in ("java", "javac", "mvn"))
        if not jdk:
            report["skipped"] = "the JVM contenders and Kafka's tools: no java, javac and mvn on PATH"
            console_print(f"bench: skipping {report['skipped']}")
        caps = {"naive": cfg.naive_events, "faust": cfg.faust_events, "quix-apply": cfg.quix_apply_events}
        for name in cfg.contenders:
            if name in JVM_CONTENDERS and not jdk:
                continue
            console_print(f"bench: {name} ...")
            events = min(cfg.events, caps.get(name, cfg.events))
            if name in JVM_CONTENDERS:
                drains.append(bench.jvm_contender(name, *JVM_CONTENDERS[name]))
            elif name.startswith("quix-"):
                drains.append(bench.quix_contender(name, events))
            else:
                drains.append(bench.contender(name, events))
        if cfg.broker_tools and jdk:
            console_print("bench: the broker alone (ConsumerPerformance, ProducerPerformance, EndToEndLatency) ...")
            report["broker_alone"] = bench.broker_alone()
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
        if cfg.text is not None:
            report["text"] = run_text_bench(bench, cfg.text, console_print)
        limit = pass_through_limit(drains)
        report["limit"] = limit
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
                    if policy == "adaptive" and load in cfg.floor_loads:
                        console_print(f"bench: the broker's own latency floor at {load:.0%} load ...")
                        floor = measure_floor(servers, capacity * load, cfg.latency_seconds, cfg.warmup_seconds,
                                              wait)
                        report.setdefault("floor", []).append({**floor, "load": load})
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
    write_plots(report, cfg.results)
    return report




def run_text_only(cfg: TextBenchConfig, results: Path, broker_kind: BrokerKind = "kafka",
                  bootstrap: str | None = None, console_print: Any = print) -> dict[str, Any]:
    """``python -m stream bench-text``: the model-bound section alone, on its own broker; writes
    ``bench-text.json`` under ``results``."""
    broker = None if bootstrap else start_broker(broker_kind)
    servers = bootstrap or broker.bootstrap  # type: ignore[union-attr]
    broker_name = "given cluster" if bootstrap else broker_kind
    bench = Bench(servers, BenchConfig(events=0), DEFAULT_MODEL_DIR, broker.pid if broker is not None else None)
    results.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"broker": broker_name, "versions": versions(broker_name)}

    def partial(section: dict[str, Any]) -> None:  # what a run cut short (a device lent for minutes) still leaves
        (results / "bench-text.partial.json").write_text(json.dumps({**report, "text": section}, indent=1) + "\n")

    try:
        report["text"] = run_text_bench(bench, cfg, console_print, on_entry=partial)
    except BaseException:
        console_print(f"bench-text: worker logs kept in {bench.work}")
        raise
    finally:
        if broker is not None:
            broker.stop()
    shutil.rmtree(bench.work, ignore_errors=True)
    (results / "bench-text.json").write_text(json.dumps(report, indent=1) + "\n")
    (results / "bench-text.partial.json").unlink(missing_ok=True)
    return report
