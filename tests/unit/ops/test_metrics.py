"""The worker's Prometheus metrics: the array histogram's buckets against prometheus_client's own, and the names a
scrape shows (served with the probes: test_health)."""

from __future__ import annotations

import numpy as np
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from stream.ops.metrics import BulkHistogram, StreamMetrics


def samples(registry: CollectorRegistry, name: str) -> dict[tuple[str, str], float]:
    out = {}
    for family in registry.collect():
        for s in family.samples:
            if s.name.startswith(name):
                out[(s.name.removeprefix(name), s.labels.get("le", ""))] = s.value
    return out


def test_bulk_histogram_counts_as_prometheus_clients_histogram() -> None:
    """le semantics (a value on a bound counts in that bucket), +Inf, count and sum, for arrays and single values."""
    bounds = (0.5, 1.0, 2.0)
    values = np.asarray([0.0, 0.5, 0.7, 1.0, 1.5, 2.0, 9.0], dtype=np.float64)
    mine, theirs = CollectorRegistry(), CollectorRegistry()
    bulk = BulkHistogram("h", "doc", bounds, mine)
    bulk.observe_many(values[:4])
    bulk.observe_many(np.zeros(0))
    for v in values[4:]:
        bulk.observe(float(v))
    reference = Histogram("h", "doc", buckets=bounds, registry=theirs)
    for v in values:
        reference.observe(float(v))
    got, want = samples(mine, "h"), samples(theirs, "h")
    assert {k: v for k, v in got.items() if k[0] != "_created"} == {
        k: v for k, v in want.items() if k[0] != "_created"}
    assert got[("_bucket", "0.5")] == 2 and got[("_bucket", "+Inf")] == 7 and got[("_sum", "")] == values.sum()


def test_every_metric_is_exported_under_its_documented_name() -> None:
    metrics = StreamMetrics()
    metrics.dead_letters.labels("decode", "bad-magic").inc()
    metrics.rebalances.labels("assigned").inc()
    metrics.commit_seconds.labels("sync").observe(0.003)
    text = generate_latest(metrics.registry).decode()
    for name in ("stream_records_consumed_total", "stream_predictions_total", "stream_offsets_committed_total",
                 "stream_batches_total", "stream_dead_letters_total", "stream_model_retries_total",
                 "stream_transactions_aborted_total", "stream_commit_failures_total",
                 "stream_schema_registry_retries_total", "stream_assigned_partitions", "stream_paused_partitions",
                 "stream_stalled_partitions", "stream_records_in_flight", "stream_open_batch_records",
                 "stream_queued_batches", "stream_last_commit_timestamp_seconds", "stream_batch_size_records_bucket",
                 "stream_inference_seconds_bucket", "stream_end_to_end_latency_seconds_bucket"):
        assert f"\n{name}" in text, name
    assert 'stream_dead_letters_total{reason="bad-magic",stage="decode"} 1.0' in text
    assert 'stream_rebalances_total{kind="assigned"} 1.0' in text
    assert 'stream_commit_seconds_bucket{le="0.005",mode="sync"} 1.0' in text
