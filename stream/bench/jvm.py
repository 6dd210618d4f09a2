"""The benchmark's JVM contenders and the broker's own tools: kafka-clients pass-throughs and a Kafka Streams
topology (Java sources in ``stream/bench/jvm/``, compiled here with the JDK), and Kafka's ``ConsumerPerformance``,
``ProducerPerformance`` and ``EndToEndLatency`` (kafka-tools). Their jars come from Maven Central into the cache,
like the broker's; the compiled classes are cached by a hash of the sources."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from stream.local.broker import KAFKA_VERSION, SLF4J_VERSION
from stream.local.cache import cache_dir
from stream.local.maven import compiled, copy_dependencies, pom

log = logging.getLogger(__name__)
SOURCES = Path(__file__).resolve().parent / "jvm"
def bench_libs_dir() -> Path:
    return cache_dir() / f"kafka-{KAFKA_VERSION}" / "bench-libs"


def ensure_bench_jars() -> Path:
    """kafka-streams and kafka-tools (with their dependencies) from Maven Central, once; returns the folder."""
    libs = bench_libs_dir()
    deps = [("org.apache.kafka", "kafka-streams", KAFKA_VERSION), ("org.apache.kafka", "kafka-tools", KAFKA_VERSION),
            ("org.slf4j", "slf4j-nop", SLF4J_VERSION)]
    return copy_dependencies(libs, libs.parent / "bench-pom", pom("kafka-bench-runtime", deps),
                             what=f"kafka-streams and kafka-tools {KAFKA_VERSION}", needs="the JVM contenders need",
                             marker=KAFKA_VERSION)


def ensure_compiled() -> Path:
    """The contenders' classes, compiled with ``javac`` against the benchmark's jars (once per source hash)."""
    return compiled(SOURCES.glob("*.java"), ensure_bench_jars(), bench_libs_dir().parent, "bench-classes",
                    needs="the JVM contenders need")


def java_command(main_class: str, *args: str, heap_mib: int = 1024) -> list[str]:
    """``java`` with the benchmark's jars and classes on the class path, running ``main_class``."""
    java = shutil.which("java") or "java"
    classpath = f"{ensure_compiled()}:{ensure_bench_jars()}/*"
    return [java, f"-Xms{heap_mib}m", f"-Xmx{heap_mib}m", "-XX:+UseG1GC", "-cp", classpath, main_class, *args]


def run_contender(main_class: str, args: list[str], timeout_s: float = 3600.0) -> dict[str, Any]:
    """Run a JVM contender; its JSON result line (``events``, ``first_ts``, ``last_ts``)."""
    proc = subprocess.run(java_command(main_class, *args), capture_output=True, text=True, timeout=timeout_s,
                          check=False)
    found = [ln for ln in proc.stdout.splitlines() if ln.startswith('{"events"')]
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"{main_class} failed ({proc.returncode}): {proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return dict(json.loads(found[-1]))


# ---------------------------------------------------------------------------------------- the broker's own tools
def _tool(main_class: str, args: list[str], timeout_s: float) -> str:
    proc = subprocess.run(java_command(f"org.apache.kafka.tools.{main_class}", *args, heap_mib=512),
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{main_class} failed ({proc.returncode}): {proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    return proc.stdout


def consumer_performance(bootstrap: str, topic: str, records: int, group: str,
                         timeout_s: float = 1800.0) -> dict[str, float]:
    """Kafka's ``ConsumerPerformance``: ``records`` consumed from ``topic`` by one consumer; its records/s over
    the fetch time (``fetch.nMsg.sec``, without the group join) and over the whole run (``nMsg.sec``)."""
    out = _tool("ConsumerPerformance", ["--bootstrap-server", bootstrap, "--topic", topic, "--num-records",
                                        str(records), "--group", group, "--timeout", "60000"], timeout_s)
    return parse_consumer_performance(out)


def parse_consumer_performance(out: str) -> dict[str, float]:
    lines = [ln.strip() for ln in out.splitlines() if ln.strip()]
    header = next(i for i, ln in enumerate(lines) if ln.startswith("start.time"))
    names = [n.strip() for n in lines[header].split(",")]
    values = [v.strip() for v in lines[header + 1].split(",")]
    row = dict(zip(names, values, strict=True))
    return {"records": float(row["data.consumed.in.nMsg"]), "records_per_s": float(row["nMsg.sec"]),
            "fetch_records_per_s": float(row["fetch.nMsg.sec"]), "mb_per_s": float(row["MB.sec"])}


def producer_performance(bootstrap: str, topic: str, records: int, record_size: int,
                         timeout_s: float = 1800.0) -> dict[str, float]:
    """Kafka's ``ProducerPerformance``: ``records`` of ``record_size`` bytes as fast as the broker takes them,
    with the worker's producer settings (acks=all, idempotent, lz4, 5 ms linger)."""
    out = _tool("ProducerPerformance", [
        "--topic", topic, "--num-records", str(records), "--record-size", str(record_size), "--throughput", "-1",
        "--producer-props", f"bootstrap.servers={bootstrap}", "acks=all", "enable.idempotence=true",
        "compression.type=lz4", "linger.ms=5"], timeout_s)
    return parse_producer_performance(out)


_PRODUCED = re.compile(r"(\d+) records sent, ([\d.]+) records/sec \(([\d.]+) MB/sec\), ([\d.]+) ms avg latency, "
                       r"([\d.]+) ms max latency, (\d+) ms 50th, (\d+) ms 95th, (\d+) ms 99th, (\d+) ms 99.9th")


def parse_producer_performance(out: str) -> dict[str, float]:
    found = [m for m in (_PRODUCED.search(ln) for ln in out.splitlines()) if m]
    if not found:
        raise RuntimeError(f"no ProducerPerformance summary in: {out[-1000:]}")
    m = found[-1]
    return {"records": float(m[1]), "records_per_s": float(m[2]), "mb_per_s": float(m[3]),
            "avg_latency_ms": float(m[4]), "p50_ms": float(m[6]), "p99_ms": float(m[8]), "p999_ms": float(m[9])}


def end_to_end_latency(bootstrap: str, topic: str, records: int, record_size: int,
                       timeout_s: float = 900.0) -> dict[str, float]:
    """Kafka's ``EndToEndLatency``: one record at a time, sent with acks=all and waited for, then consumed;
    p50/p99/p99.9 in whole milliseconds, as the tool prints them."""
    out = _tool("EndToEndLatency", ["--bootstrap-server", bootstrap, "--topic", topic, "--num-records",
                                    str(records), "--producer-acks", "all", "--record-size", str(record_size)],
                timeout_s)
    return parse_end_to_end_latency(out)


_E2E_AVG = re.compile(r"Avg latency: ([\d.]+) ms")
_E2E_PCT = re.compile(r"Percentiles: 50th = (\d+), 99th = (\d+), 99.9th = (\d+)")


def parse_end_to_end_latency(out: str) -> dict[str, float]:
    avg, pct = _E2E_AVG.search(out), _E2E_PCT.search(out)
    if avg is None or pct is None:
        raise RuntimeError(f"no EndToEndLatency summary in: {out[-1000:]}")
    return {"avg_ms": float(avg[1]), "p50_ms": float(pct[1]), "p99_ms": float(pct[2]), "p999_ms": float(pct[3])}
