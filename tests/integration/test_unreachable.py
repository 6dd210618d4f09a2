"""A worker whose brokers cannot be reached: a WARNING when that starts and a reminder at most every 30 s (not a
line per reconnect attempt from each client), librdkafka's own lines through the worker's log, not stderr; it
keeps trying, consumes and commits nothing, and a SIGTERM stops it cleanly."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from stream.broker import free_port
from stream.children import WorkerProcess

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("extra", [[], ["--dlq-topic", "dlq"]], ids=["plain", "creating-its-dlq-topic"])
def test_unreachable_brokers_at_start_up_are_reported_once_and_retried_until_stopped(
        model_dir: Path, tmp_path: Path, extra: list[str]) -> None:
    worker = WorkerProcess(["--bootstrap-servers", f"127.0.0.1:{free_port()}", "--input-topic", "in",
                            "--output-topic", "out", "--group-id", "g", "--model-dir", str(model_dir), *extra],
                           tmp_path / "worker.log")
    try:
        deadline = time.monotonic() + 60
        while "cannot reach the Kafka brokers" not in worker.output() and time.monotonic() < deadline:
            assert worker.proc.poll() is None, worker.output()[-3000:]
            time.sleep(0.2)
        time.sleep(5)  # about a hundred reconnect attempts of each client
        assert worker.proc.poll() is None, "still trying"
    finally:
        code = worker.terminate(30)
    out = worker.output()
    assert code == 0, out[-3000:]
    lines = out.splitlines()
    assert sum("cannot reach the Kafka brokers" in line for line in lines) == 1, out
    assert not [line for line in lines if line.startswith("%")], "librdkafka's lines go through the log"
    client_lines = [line for line in lines if "stream.librdkafka." in line]
    assert 1 <= len(client_lines) <= 4, client_lines  # each distinct line once per 30 s
    assert len(lines) < 25, out
    assert "consumed=0 predicted=0 dead_lettered=0 committed=0" in out
