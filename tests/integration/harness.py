"""The integration harness: topics, worker processes and readers for one test, on the session broker."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from producers.events import generate_events
from producers.load import produce_events
from stream.kafka.topics import create_topics
from stream.local.children import WorkerProcess
from tests.conftest import BrokerInfo
from tests.verify import OutputReader, check_committed, committed_offsets, end_offsets

PARTITIONS = 4
# Tansu answers a new group's first join after ~half the session timeout: keep it short everywhere.
WORKER_ENV = {"KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "6000"}


class Pipeline:
    def __init__(self, broker: BrokerInfo, name: Callable[[str], str], model_dir: Path, tmp: Path) -> None:
        self.bootstrap = broker.bootstrap
        self.input, self.output, self.group = name("in"), name("out"), name("group")
        self.model_dir = model_dir
        self.tmp = tmp
        self.workers: list[WorkerProcess] = []
        create_topics(self.bootstrap, [self.input, self.output], PARTITIONS)

    def worker(self, *extra: str, env: dict[str, str] | None = None) -> WorkerProcess:
        args = ["--bootstrap-servers", self.bootstrap, "--input-topic", self.input, "--output-topic", self.output,
                "--group-id", self.group, "--model-dir", str(self.model_dir), "--commit-interval-ms", "200",
                *extra]
        proc = WorkerProcess(args, self.tmp / f"worker-{len(self.workers)}.log", {**WORKER_ENV, **(env or {})})
        self.workers.append(proc)
        return proc

    def produce(self, count: int, *, seed: int, start: int = 0, native: bool = False) -> set[str]:
        summary = produce_events(self.bootstrap, self.input, count, seed=seed, start=start, native=native)
        assert summary.failed == 0 and summary.delivered == count, summary.line()
        return set(generate_events(count, seed=seed, start=start).event_ids)

    def reader(self) -> OutputReader:
        return OutputReader(self.bootstrap, self.output)

    def committed_problems(self) -> list[str]:
        return check_committed(committed_offsets(self.bootstrap, self.group, self.input),
                               end_offsets(self.bootstrap, self.input))

    def cleanup(self) -> None:
        for w in self.workers:
            w.kill()


def wait_for_assignment(worker: WorkerProcess, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if " assigned " in worker.output():
            return
        assert worker.proc.poll() is None, worker.output()[-3000:]
        time.sleep(0.05)
    raise AssertionError(f"no assignment within {timeout_s}s:\n{worker.output()[-3000:]}")
