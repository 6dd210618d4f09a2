"""The benchmark's readings of Kafka's own tools, its reference rates and the guarantees comparison."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from stream.bench.guarantees import ratios
from stream.bench.jvm import parse_consumer_performance, parse_end_to_end_latency, parse_producer_performance
from stream.bench.probes import visible_latencies
from stream.bench.report import Drain, format_broker_alone, format_table, references
from stream.bench.runner import pass_through_limit

CONSUMER_OUT = (
    "start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, nMsg.sec, rebalance.time.ms, "
    "fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec\n"
    "2026-11-25 15:30:01:120, 2026-11-25 15:30:05:670, 151.6342, 33.3262, 1000000, 219780.2198, 3010, 1540, "
    "98.4638, 649350.6494\n")
PRODUCER_OUT = (
    "499809 records sent, 99961.8 records/sec (15.15 MB/sec), 40.1 ms avg latency, 220.0 ms max latency.\n"
    "1000000 records sent, 140845.070423 records/sec (21.36 MB/sec), 35.12 ms avg latency, 230.00 ms max "
    "latency, 31 ms 50th, 70 ms 95th, 95 ms 99th, 160 ms 99.9th.\n")
E2E_OUT = """0\t35.2
1000\t1.1
Avg latency: 1.4561 ms
Percentiles: 50th = 1, 99th = 12, 99.9th = 60
"""


def test_kafkas_tools_are_read_from_their_printed_summaries() -> None:
    assert parse_consumer_performance(CONSUMER_OUT) == {
        "records": 1_000_000.0, "records_per_s": 219780.2198, "fetch_records_per_s": 649350.6494, "mb_per_s": 33.3262}
    produced = parse_producer_performance(PRODUCER_OUT)
    assert produced["records"] == 1_000_000 and produced["records_per_s"] == pytest.approx(140845.07)
    assert (produced["p50_ms"], produced["p99_ms"], produced["p999_ms"]) == (31, 95, 160)
    assert parse_end_to_end_latency(E2E_OUT) == {"avg_ms": 1.4561, "p50_ms": 1, "p99_ms": 12, "p999_ms": 60}
    with pytest.raises(RuntimeError, match="no ProducerPerformance summary"):
        parse_producer_performance("nothing")
    with pytest.raises(RuntimeError, match="no EndToEndLatency summary"):
        parse_end_to_end_latency("Avg latency: 1 ms")


def test_the_table_divides_by_the_faster_jvm_loop_quixs_best_and_the_brokers_own_limits() -> None:
    drains = [Drain("passthrough", 100, 1.0), Drain("jvm-flush", 200, 1.0), Drain("jvm-pipelined", 250, 1.0),
              Drain("quix-apply", 5, 1.0), Drain("quix-sink", 20, 1.0), Drain("worker-default", 500, 1.0)]
    assert pass_through_limit(drains) == 250
    assert pass_through_limit(drains[:1]) == 100, "the Python loop where no JVM one ran"
    report = {"limit": 250.0, "drain": [{"name": d.name, "rate": d.rate, "events": d.events, "seconds": d.seconds,
                                         "peak_rss_mib": None} for d in drains],
              "broker_alone": {"record_size": 159, "consume": parse_consumer_performance(CONSUMER_OUT),
                               "produce": parse_producer_performance(PRODUCER_OUT),
                               "end_to_end": parse_end_to_end_latency(E2E_OUT)}}
    assert references(report) == {"limit": 250.0, "quix": 20.0, "consume": 649350.6494, "produce": 140845.070423}
    worker = format_table(report)[-1]
    assert worker[:8] == ["worker-default", "500", "1.00", "500", "2.00", "25.00", "0.00", "0.00"]
    line = format_broker_alone(report) or ""
    assert "ConsumerPerformance 649,351 records/s" in line and "p99 12 ms" in line
    assert format_broker_alone({"drain": []}) is None


def test_the_guarantees_ratio_is_taken_per_round_and_over_the_medians() -> None:
    drains = [{"round": r, "contender": "worker", "guarantee": g, "rate": rate}
              for r, g, rate in ((0, "at-least-once", 400.0), (0, "exactly-once", 320.0),
                                 (1, "exactly-once", 360.0), (1, "at-least-once", 450.0))]
    result = ratios(drains, "worker")
    assert result["pair_ratios"] == [0.8, 0.8]
    assert result["medians"] == {"at-least-once": 425.0, "exactly-once": 340.0}
    assert result["ratio"] == 340.0 / 425.0


def test_a_readers_receipts_are_joined_to_predictions_by_output_partition_and_offset() -> None:
    # read_latencies rows: (event ts, pipeline, from event, batch size, input append ms, out partition, offset)
    rows = np.array([[0, 0, 0, 1, 1000.0, 0, 5], [0, 0, 0, 1, 1002.0, 1, 5], [0, 0, 0, 1, 1004.0, 0, 6]])
    receipts = np.array([[1, 5, 1050.0], [0, 6, 1010.0], [0, 5, 1003.0], [2, 0, 1.0]])  # any order, extras
    assert visible_latencies(rows, receipts).tolist() == [3.0, 48.0, 6.0]
    with pytest.raises(RuntimeError, match="did not receive 1 of 3"):
        visible_latencies(rows, receipts[1:])
    with pytest.raises(RuntimeError, match="did not receive 3 of 3"):
        visible_latencies(rows, np.empty((0, 3)))


def test_the_host_ceilings_cpu_is_split_per_text_between_worker_and_broker() -> None:
    from stream.bench.stages import format_host_cpu, host_cpu

    def rnd(rate: float, worker: float, broker: float | None) -> dict[str, Any]:
        cores = {"workers": worker, **({"broker": broker} if broker is not None else {})}
        return {"host": {"rate": rate, "cpu_cores": cores}}

    report = {"tokenize_alone_one_thread": 1_000_000.0, "library_tokenize_alone_one_thread": 25_000.0,
              "rounds": [rnd(20_000.0, 1.2, 0.6), rnd(25_000.0, 1.25, 0.5), rnd(10_000.0, 1.0, None),
                         {"host": {"rate": 1.0, "cpu_cores": None}}]}
    for r, (rate, cores) in zip(report["rounds"], ((8_000.0, 0.8), (10_000.0, 0.9), (5_000.0, 0.5), (1.0, None)),
                                strict=True):
        r["host_library"] = {"rate": rate, "cpu_cores": {"workers": cores} if cores else None}
    cpu = host_cpu(report)
    assert cpu is not None
    assert cpu["worker_cores"] == 1.2  # the median of 1.2, 1.25 and 1.0; the drain without samples is left out
    assert cpu["worker_us_per_text"] == pytest.approx(60.0)  # 1.2/20,000, 1.25/25,000, 1.0/10,000 s
    assert cpu["tokenize_us_per_text"] == pytest.approx(1.0)
    assert cpu["library_tokenize_us_per_text"] == pytest.approx(40.0)
    assert cpu["library_worker_us_per_text"] == pytest.approx(100.0)  # 0.8/8,000, 0.9/10,000, 0.5/5,000 s
    assert cpu["broker_cores"] == pytest.approx(0.55)
    assert cpu["broker_us_per_text"] == pytest.approx(25.0)  # 30 and 20
    line = format_host_cpu({"summary": {"host_cpu": cpu}})
    assert line is not None and "60 µs of CPU a text" in line and "broker 0.55 cores" in line
    assert "library tokenizer the worker 100 µs a text" in line
    assert host_cpu({"tokenize_alone_one_thread": 1.0, "rounds": [{"host": {"rate": 1.0}}]}) is None
    assert format_host_cpu({"summary": {"host_cpu": None}}) is None
