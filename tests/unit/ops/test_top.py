"""``stream top``'s figures from two scrapes: endpoints, rates, the windowed p99, states (its screen against
running workers: tests/integration/test_top.py)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from rich.console import Console

from stream.ops.metrics import LATENCY_BUCKETS_S, StreamMetrics
from stream.ops.top import Scrape, endpoint, quantile, row, table


def scrape_of(metrics: StreamMetrics, at: float, ready: tuple[int, str] = (200, "ok\n"),
              health: tuple[int, str] = (200, "ok\n")) -> Scrape:
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for s in family.samples:
            samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return Scrape(at, samples, health=health, ready=ready)


@pytest.mark.parametrize(("target", "url"), [
    ("9100", "http://127.0.0.1:9100"), ("worker-1:9100", "http://worker-1:9100"),
    ("http://10.0.0.5:9100/metrics", "http://10.0.0.5:9100"), ("https://w:443/", "https://w:443")])
def test_endpoints(target: str, url: str) -> None:
    assert endpoint(target) == url


def test_the_windowed_quantile_interpolates_as_prometheus_does() -> None:
    registry = CollectorRegistry()
    h = Histogram("x", "", buckets=(0.01, 0.02, 0.05), registry=registry)
    for v in [0.005] * 50 + [0.015] * 40 + [0.03] * 10:
        h.observe(v)
    now = {float(s.labels["le"]): s.value for s in next(iter(registry.collect())).samples if s.name == "x_bucket"}
    # 99th of 100: the 99th observation, in (0.02, 0.05] which holds 10 (91st..100th): 0.02 + 0.03 * 9/10
    assert quantile(0.99, {}, now) == pytest.approx(0.047)
    assert quantile(0.5, {}, now) == pytest.approx(0.01)
    assert quantile(0.99, now, now) is None, "no observations in the window"
    over = {**now, float("inf"): now[float("inf")] + 100}
    assert quantile(0.99, now, over) == 0.05, "beyond the last bound: the last finite bound"


def test_a_row_from_two_scrapes() -> None:
    m = StreamMetrics()
    m.assigned_partitions.set(4)
    before = scrape_of(m, 10.0)
    m.consumed.inc(3000)
    m.predicted.inc(2000)
    m.batch_size.observe_many(np.asarray([100.0, 300.0]))
    for _ in range(100):
        m.e2e_latency_seconds.observe(0.012)
    m.dead_letters.labels("decode", "bad-magic").inc(3)
    r = row("w1:9100", before, scrape_of(m, 12.0))
    assert (r.state, r.in_rate, r.out_rate, r.batch, r.dead, r.partitions) == ("ready", 1500, 1000, 200, 3, "4")
    assert r.p99_s is not None and 0.01 < r.p99_s <= 0.015 and 0.015 in LATENCY_BUCKETS_S
    first = row("w1:9100", None, before)
    assert first.in_rate is None and first.p99_s is None, "rates need two scrapes"
    text = io.StringIO()
    Console(file=text, width=160).print(table([r, first]))
    assert "w1:9100" in text.getvalue() and "1,500" in text.getvalue()


def test_the_binding_stage_is_the_one_whose_threads_were_busiest() -> None:
    m = StreamMetrics()
    for stage, threads in (("prepare", 2), ("device", 1), ("finish", 1)):
        m.stage_threads.labels(stage).set(threads)
        m.stage_busy_seconds.labels(stage).inc(1.0)
        m.stage_cpu_seconds.labels(stage).inc(0.5)
    before = scrape_of(m, 10.0)
    m.stage_busy_seconds.labels("prepare").inc(3.0)  # 3 s of 2 threads' 4 s: 75 %
    m.stage_busy_seconds.labels("device").inc(1.6)  # 80 % of its one thread: it binds
    m.stage_busy_seconds.labels("finish").inc(0.4)
    m.stage_cpu_seconds.labels("device").inc(0.4)  # a quarter of its busy time on a CPU, the rest waiting
    r = row("w", before, scrape_of(m, 12.0))
    assert r.binds == "device 80% (CPU 25%)"
    assert row("w", before, before).binds == "", "no time passed: no rates"
    older = StreamMetrics()  # a replica of a version that exports no CPU seconds
    older.stage_threads.labels("device").set(1)
    older.stage_busy_seconds.labels("device").inc(1.0)
    was = scrape_of(older, 10.0)
    older.stage_busy_seconds.labels("device").inc(1.0)
    assert row("w", was, scrape_of(older, 12.0)).binds == "device 50%"
    assert row("w", scrape_of(StreamMetrics(), 1.0), scrape_of(StreamMetrics(), 2.0)).binds == "", "no stages"
    text = io.StringIO()
    Console(file=text, width=200).print(table([r]))
    assert "device 80% (CPU 25%)" in text.getvalue()


def test_states_from_the_probes_and_a_replica_that_does_not_answer() -> None:
    m = StreamMetrics()
    assert row("w", None, Scrape(1.0, error="Connection refused")).state == "down: Connection refused"
    assert row("w", None, scrape_of(m, 1.0, ready=(503, "Kafka brokers unreachable\n"))).state == (
        "not ready: Kafka brokers unreachable")
    failed = row("w", None, scrape_of(m, 1.0, health=(503, "failed: KafkaClientError: boom\n"),
                                      ready=(503, "failed: KafkaClientError: boom\n")))
    assert failed.state == "failed: KafkaClientError: boom"


def test_replicas_of_two_model_versions_get_a_row_per_version_side_by_side() -> None:
    from stream.ops.top import version_rows

    replicas = []
    for version, score in (("A", 0.2), ("A", 0.4), ("B", 0.9)):
        m = StreamMetrics()
        m.model_info.info({"name": "m", "version": version, "device": "cpu"})
        m.assigned_partitions.set(2)
        before = scrape_of(m, 10.0)
        m.predicted.inc(100)
        m.prediction_values.observe_many("score", np.full(100, score))
        replicas.append((before, scrape_of(m, 11.0)))
    rows = [row(f"w{i}", b, n) for i, (b, n) in enumerate(replicas)]
    assert [r.version for r in rows] == ["m:A", "m:A", "m:B"] and rows[0].mean_output == "score 0.200"
    a, b = version_rows(rows, [b for b, _ in replicas], [n for _, n in replicas])
    assert (a.replica, a.out_rate, a.partitions, a.mean_output) == ("m:A (2)", 200, "4", "score 0.300")
    assert (b.replica, b.out_rate, b.partitions, b.mean_output) == ("m:B (1)", 100, "2", "score 0.900")
    assert version_rows(rows[:2], [b for b, _ in replicas[:2]], [n for _, n in replicas[:2]]) == [], \
        "one version: no extra rows"
