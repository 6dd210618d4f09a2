"""A real Prometheus (Debian's 2.42) scraping running workers, with the repository's alerting rules: every
dashboard query, every alert's signal and every alert's expression returns series; every rule evaluates
without error.

Two workers serve a model slower than the input (SlowHandler: 0.1 s per batch of at most 64 records, about
1,300 events/s together) while 4,000 events/s arrive, one in 40 of them unreadable: the lag grows and the
dead-letter rate is 2.5 %. A third, in a group of its own, takes 30 s over its first batch with a 2 s stall
timeout: its partitions stall. Killing a worker brings the replica-down condition about. "No commit for 10
minutes" is evaluated 11 minutes ahead of now (Prometheus keeps the last samples for 15 minutes here): what it
would say of these replicas had they stopped now; test_deploy's promtool tests cover every alert's firing
logic, `for` durations included."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from producers.events import generate_events
from stream.codec import SchemaRegistry, encode
from stream.local.broker import free_port
from stream.models.demo import EVENT_SCHEMA
from tests.handlers import bad_values
from tests.integration.harness import Pipeline, wait_for_assignment
from tests.integration.test_deploy import ALERTS, alert_rules, dashboard_queries
from tests.prometheus import LocalPrometheus

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
LIVE_ALERTS = {"StreamConsumerLagGrowing", "StreamDeadLetterRateHigh", "StreamPartitionStalled"}
CUDA_ONLY = "stream_gpu_memory_bytes"


def _offer(bootstrap: str, topic: str, count: int, rate: float, stop: threading.Event) -> None:
    """``count`` demo events at ``rate`` a second, one in 40 followed by an unreadable value (bad magic byte)."""
    event = SchemaRegistry.from_dir().by_name(EVENT_SCHEMA)
    bad = bad_values()["bad-magic"]
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    started = time.monotonic()
    for i, record in enumerate(generate_events(count, seed=71).records()):
        if stop.is_set():
            break
        producer.produce(topic, encode(event, record), str(record["key"]).encode())
        if i % 40 == 0:
            producer.produce(topic, bad, b"bad")
        if i % 200 == 0:
            producer.poll(0)
            time.sleep(max(0.0, started + i / rate - time.monotonic()))
    producer.flush(30)


def test_dashboard_queries_and_alerts_answer_against_running_workers(pipeline: Pipeline) -> None:
    dlq = pipeline.input.replace("-in-", "-dlq-")
    ports = [free_port(), free_port()]
    workers = [pipeline.worker("--metrics-port", str(port), "--dlq-topic", dlq, "--model",
                               "tests.handlers:SlowHandler", "--max-batch-size", "64",
                               env={"STREAM_TEST_BATCH_SLEEP_S": "0.1",
                                    "KAFKA_CONSUMER_STATISTICS_INTERVAL_MS": "1000"})
               for port in ports]
    ports.append(free_port())
    # A third worker in a group of its own, whose batches take 30 s: its partitions stall. It dead-letters the
    # unreadable values too: without a dead-letter topic, a first batch of them alone (no model pass to wait in)
    # stopped it before anything could stall.
    workers.append(pipeline.worker("--metrics-port", str(ports[-1]), "--group-id", f"{pipeline.group}-stalls",
                                   "--dlq-topic", dlq, "--model", "tests.handlers:SlowHandler", "--max-batch-size",
                                   "8", "--stall-timeout-s", "2", env={"STREAM_TEST_BATCH_SLEEP_S": "30"}))
    for worker in workers:
        wait_for_assignment(worker)
    queries = [(title, expr) for title, expr in dashboard_queries() if CUDA_ONLY not in expr]
    assert len(queries) < len(dashboard_queries()), "the GPU panel is left out on CPU, and only it"
    signals = {r["alert"]: r["annotations"]["signal"] for r in alert_rules()}
    expressions = {r["alert"]: " ".join(r["expr"].split()) for r in alert_rules()}
    stop = threading.Event()
    load = threading.Thread(target=_offer, args=(pipeline.bootstrap, pipeline.input, 40_000, 4_000.0, stop),
                            daemon=True)
    with LocalPrometheus([f"127.0.0.1:{p}" for p in ports], [ALERTS],
                         extra_args=("--query.lookback-delta=15m",)) as prometheus:
        load.start()
        try:
            empty = {title: expr for title, expr in queries}
            quiet = dict(signals)
            not_true = set(LIVE_ALERTS)
            deadline = time.monotonic() + 90
            while (empty or quiet or not_true) and time.monotonic() < deadline:
                empty = {t: e for t, e in empty.items() if not prometheus.query(e)}
                quiet = {a: s for a, s in quiet.items() if not prometheus.query(s)}
                not_true = {a for a in not_true if not prometheus.query(expressions[a])}
                time.sleep(1.0)
            assert not empty, f"dashboard queries without series: {empty}"
            assert not quiet, f"alert signals without series: {quiet}"
            for worker in workers:
                assert worker.proc.poll() is None, worker.output()[-3000:]
            assert not not_true, f"alert conditions the load should have brought about: {not_true}"
            for expr in expressions.values():
                prometheus.query(expr)  # parses and evaluates (an error raises)
            later = prometheus.query(expressions["StreamNoCommit"], at=time.time() + 660)
            assert {s["metric"]["instance"] for s in later} >= {f"127.0.0.1:{p}" for p in ports[:2]}, later
            # One replica gone: its scrape fails and the replica-down condition holds, the alert pending.
            workers[1].kill()
            deadline = time.monotonic() + 30
            while not prometheus.query(expressions["StreamReplicaDown"]) and time.monotonic() < deadline:
                time.sleep(0.5)
            down = prometheus.query(expressions["StreamReplicaDown"])
            assert [s["metric"]["instance"] for s in down] == [f"127.0.0.1:{ports[1]}"]
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                alerts = {a["labels"]["alertname"]: a["state"] for a in prometheus.api("alerts")["alerts"]}
                if "StreamReplicaDown" in alerts:
                    break
                time.sleep(0.5)
            assert alerts.get("StreamReplicaDown") == "pending", alerts  # for: 1m
            rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
            assert {r["name"] for r in rules} == set(expressions)
            assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
        finally:
            stop.set()
            load.join(30)
    assert workers[0].proc.poll() is None, workers[0].output()[-3000:]


def test_local_prometheus_reports_a_query_that_does_not_parse(tmp_path: Path) -> None:
    with LocalPrometheus([f"127.0.0.1:{free_port()}"], []) as prometheus:
        with pytest.raises(AssertionError, match="bad_data"):
            prometheus.query("sum(rate(stream_predictions_total[1m])")
        deadline = time.monotonic() + 15
        while not prometheus.query('up{job="stream"} == 0') and time.monotonic() < deadline:
            time.sleep(0.2)
        assert prometheus.query('up{job="stream"} == 0'), "the target is scraped, and down"
