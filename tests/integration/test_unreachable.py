"""A worker whose brokers cannot be reached: a WARNING when that starts and a reminder at most every 30 s (not a
line per reconnect attempt from each client), librdkafka's own lines through the worker's log, not stderr; it
keeps trying, consumes and commits nothing, its /readyz says why it is not ready (its /healthz stays ok: a
restart would not bring the brokers back), and a SIGTERM stops it cleanly."""

from __future__ import annotations

import signal
import time
from datetime import datetime
from pathlib import Path

import pytest

from stream.local.broker import free_port
from stream.local.children import WorkerProcess
from tests.probes import get as probe

pytestmark = pytest.mark.integration
STOP_BOUND_S = 5.0  # a worker stopped while it waits for its brokers exits within it (measured: about 1 s)
WARN_BOUND_S = 5.0  # from its probes' start to the warning that its brokers cannot be reached (measured: 3 ms)


@pytest.mark.parametrize("extra", [[], ["--dlq-topic", "dlq"]], ids=["plain", "creating-its-dlq-topic"])
def test_unreachable_brokers_at_start_up_are_reported_once_and_retried_until_stopped(
        model_dir: Path, tmp_path: Path, extra: list[str]) -> None:
    port = free_port()
    worker = WorkerProcess(["--bootstrap-servers", f"127.0.0.1:{free_port()}", "--input-topic", "in",
                            "--output-topic", "out", "--group-id", "g", "--model-dir", str(model_dir),
                            "--metrics-port", str(port), *extra], tmp_path / "worker.log")
    try:
        deadline = time.monotonic() + 60
        while "cannot reach the Kafka brokers" not in worker.output() and time.monotonic() < deadline:
            assert worker.proc.poll() is None, worker.output()[-3000:]
            time.sleep(0.2)
        time.sleep(5)  # about a hundred reconnect attempts of each client
        assert worker.proc.poll() is None, "still trying"
        status, body = probe(port, "/readyz")
        assert status == 503 and "Kafka brokers unreachable" in body, body
        assert probe(port, "/healthz") == (200, "ok\n")
    finally:
        asked = time.monotonic()
        code = worker.terminate(30)
        took = time.monotonic() - asked
    out = worker.output()
    assert code == 0, out[-3000:]
    # Nothing to finish: it stops at once (it used to wait out the admin request under way, up to 10 s, then make
    # its clients and wait out their first requests too: 15 s measured)
    assert took < STOP_BOUND_S, (took, out[-3000:])
    lines = out.splitlines()
    assert sum("cannot reach the Kafka brokers" in line for line in lines) == 1, out
    # ... said, with librdkafka's reason, as soon as the admin client's first connection is refused (it used to
    # take the admin request's whole timeout, 10 s, and say only that no broker answered)
    warned = _logged_at(lines, "cannot reach the Kafka brokers")
    assert warned - _logged_at(lines, "metrics and probes on") < WARN_BOUND_S, out
    assert "Connection refused" in next(line for line in lines if "cannot reach the Kafka brokers" in line)
    assert not [line for line in lines if line.startswith("%")], "librdkafka's lines go through the log"
    client_lines = [line for line in lines if "stream.librdkafka." in line]
    assert 1 <= len(client_lines) <= 4, client_lines  # each distinct line once per 30 s
    assert len(lines) < 25, out
    assert "consumed=0 predicted=0 dead_lettered=0 committed=0" in out


def test_a_broker_lost_mid_run_is_waited_out_and_nothing_is_lost(model_dir: Path, tmp_path: Path) -> None:
    from stream.kafka.topics import create_topics
    from stream.local.broker import kafka_available, start_kafka_cluster
    from tests.integration.harness import WORKER_ENV, wait_for_assignment
    from tests.verify import OutputReader, check_committed, committed_offsets, end_offsets

    if not kafka_available():
        pytest.skip("needs java and mvn for Apache Kafka")
    with start_kafka_cluster(1) as cluster:  # one node that can be killed and started again on its data
        bootstrap = cluster.bootstrap
        create_topics(bootstrap, ["in", "out"], 4)
        port = free_port()
        worker = WorkerProcess(["--bootstrap-servers", bootstrap, "--input-topic", "in", "--output-topic", "out",
                                "--group-id", "g", "--model-dir", str(model_dir), "--commit-interval-ms", "200",
                                "--metrics-port", str(port)], tmp_path / "worker.log", WORKER_ENV)
        try:
            wait_for_assignment(worker)
            expected = _produce(bootstrap, 2_000, start=0)
            reader = OutputReader(bootstrap, "out")
            assert reader.read_until(expected, 60), worker.output()[-3000:]
            reader.close()
            assert probe(port, "/readyz") == (200, "ok\n")
            node = cluster.nodes[0]
            node.signal(signal.SIGKILL)
            node.proc.wait(30)  # type: ignore[union-attr]
            deadline = time.monotonic() + 60
            while "cannot reach the Kafka brokers" not in worker.output() and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(5)
            assert worker.proc.poll() is None, "a worker outlives its brokers' outage"
            assert worker.output().count("cannot reach the Kafka brokers") == 1, worker.output()[-3000:]
            assert probe(port, "/readyz")[0] == 503
            cluster.restart(1)
            expected |= _produce(bootstrap, 2_000, start=2_000)
            reader = OutputReader(bootstrap, "out")
            assert reader.read_until(expected, 120), worker.output()[-3000:]
            assert reader.missing(expected) == 0
            reader.close()
            deadline = time.monotonic() + 60
            while "the Kafka brokers answer again" not in worker.output() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert "the Kafka brokers answer again" in worker.output()
            assert probe(port, "/readyz") == (200, "ok\n")
        finally:
            code = worker.terminate(60)
        assert code == 0, worker.output()[-3000:]
        assert check_committed(committed_offsets(bootstrap, "g", "in"), end_offsets(bootstrap, "in")) == []


def _logged_at(lines: list[str], text: str) -> float:
    """When the first log line with ``text`` was written (seconds; the log's own timestamp)."""
    line = next(line for line in lines if text in line)
    stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    return stamp.timestamp()


def _produce(bootstrap: str, count: int, start: int) -> set[str]:
    from producers.events import generate_events
    from producers.load import produce_events

    summary = produce_events(bootstrap, "in", count, seed=3, start=start)
    assert summary.failed == 0 and summary.delivered == count, summary.line()
    return set(generate_events(count, seed=3, start=start).event_ids)


def test_a_worker_stopped_while_its_schema_registry_does_not_answer_exits_at_once(model_dir: Path,
                                                                                   tmp_path: Path) -> None:
    """A registry address that takes connections and never answers (a blackhole): the start-up's schema reading
    waits each request's 10 s, with retries; a SIGTERM meanwhile ends it at once, exit 0, nothing consumed. It
    took 43 s, past Kubernetes' 30 s grace, and then exited 2."""
    import socket

    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(16)  # the kernel completes each connection; nobody reads the request
        worker = WorkerProcess(["--bootstrap-servers", f"127.0.0.1:{free_port()}", "--input-topic", "in",
                                "--output-topic", "out", "--group-id", "g", "--model-dir", str(model_dir),
                                "--schema-registry-url", f"http://127.0.0.1:{hole.getsockname()[1]}"],
                               tmp_path / "worker.log")
        try:
            deadline = time.monotonic() + 60
            while "loaded on" not in worker.output() and time.monotonic() < deadline:
                assert worker.proc.poll() is None, worker.output()[-3000:]
                time.sleep(0.1)
            time.sleep(1.0)  # in the registry's first request
            assert worker.proc.poll() is None, worker.output()[-3000:]
        finally:
            asked = time.monotonic()
            code = worker.terminate(60)
            took = time.monotonic() - asked
    out = worker.output()
    assert code == 0 and took < STOP_BOUND_S, (code, took, out[-3000:])
    assert "signal SIGTERM during start-up: stopping before reading the schemas was done, without consuming" in out, out
