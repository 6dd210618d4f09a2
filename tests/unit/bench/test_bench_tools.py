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


def test_the_text_benchs_cuda_variants_and_drains_are_chosen_by_its_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from stream.bench import text
    from stream.cli import build_parser

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cfg = text.TextBenchConfig(torch_threads=(8,), cuda_dtypes=("float32", "bfloat16"))
    runs = [(r.device.type, r.dtype, r.variant) for r in text._runs(cfg)]
    # every variant in every precision but packed graphs in float32 (no flash kernel there)
    assert runs == [("cpu", "float32", "padded"), ("cuda", "float32", "padded"), ("cuda", "bfloat16", "padded"),
                    ("cuda", "float32", "packed"), ("cuda", "bfloat16", "packed"), ("cuda", "float32", "graphs"),
                    ("cuda", "bfloat16", "graphs"), ("cuda", "bfloat16", "packed-graphs")]
    args = build_parser().parse_args(["bench-text", "--cuda-variants", "padded,packed-graphs", "--cuda-drains",
                                      "packed-graphs", "--cuda-drain-texts", "1200000", "--no-host-ceiling"])
    assert args.cuda_variants == ("padded", "packed-graphs") and args.cuda_drains == ("packed-graphs",)
    assert args.cuda_drain_texts == 1_200_000 and args.no_host_ceiling
    cfg.cpu = False  # --no-cpu: CUDA's runs only
    assert [r.device.type for r in text._runs(cfg)] == ["cuda"] * 7
    with pytest.raises(SystemExit):  # an unknown variant is refused by the parser, naming the known ones
        build_parser().parse_args(["bench-text", "--cuda-variants", "packed,fused"])
    with pytest.raises(ValueError, match="fused: the variants are padded, packed, graphs, packed-graphs"):
        text.parse_variants("packed,fused")


def test_the_text_benchs_cuda_rows_drain_what_they_name_and_leave_partial_results(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA branch without a device: every heavy step replaced, what runs where (and with which flags) kept."""
    import torch

    from stream.bench import text

    class Handler:
        truncated = 0
        outputs = (type("Out", (), {"size": 384})(),)

        def __init__(self, **kw: Any) -> None:
            pass

        def load(self, device: Any) -> None:
            pass

        def tokenize(self, texts: list[str]) -> list[list[int]]:
            return [[1] * (5 + i % 7) for i in range(len(texts))]

    produced: list[int] = []
    drains: list[tuple[str, list[str]]] = []
    free: list[int] = []
    partials: list[int] = []

    class Bench:
        bootstrap = "127.0.0.1:1"

        def topic(self, name: str) -> str:
            return name

        def worker_drain(self, name: str, args: list[str], **kw: Any) -> Drain:
            drains.append((name, args))
            return Drain(name, 1_000, 10.0, progress=[(0.1 * i, 10.0 * i) for i in range(101)], ready_s=3.0,
                         device_busy_s=2.0, batches=40)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda _i: "a simulated card")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr("stream.models.minilm.MiniLMHandler", Handler)
    monkeypatch.setattr(text, "model_alone", lambda h, ids, batch, device, bucketing=None: {"rate": 2_000.0})
    monkeypatch.setattr(text, "reference_encode", lambda texts, batch, device, dtype: {"rate": 100.0})
    monkeypatch.setattr(text, "produce_texts_in_parallel", lambda b, t, n, seed, processes: produced.append(n) or n)
    monkeypatch.setattr(text, "broker_ceiling", lambda *a: {"rate": 5_000.0})
    monkeypatch.setattr(text, "simulated_drain",
                        lambda b, name, ns, topic, batch: free.append(batch) or Drain(name, 1_000, 2.0))
    cfg = text.TextBenchConfig(cpu=False, cuda_texts=64, cuda_drain_texts=1_000, cuda_batches=(16, 32),
                               cuda_dtypes=("bfloat16",), cuda_variants=("padded", "packed-graphs"),
                               cuda_drains=("packed-graphs",), worker_rounds=3, stages=None)
    report = text.run_text_bench(Bench(), cfg, lambda *_: None, on_entry=lambda r: partials.append(len(r["devices"])))
    assert produced == [1_000] and free == [16, 32] and partials == [1, 2]
    padded, graphs = report["devices"]
    # the padded row: the model alone and sentence-transformers, no drain; the packed graphs' rows: three rounds
    # each, every setting named on the worker's command line, the free model's drain beside them
    assert all("worker" not in b and b["model_over_sentence_transformers"] == 20.0 for b in padded["batches"])
    assert [name.rsplit("-", 2)[-2:] for name, _ in drains] == [["16", "0"], ["16", "1"], ["16", "2"],
                                                               ["32", "0"], ["32", "1"], ["32", "2"]]
    assert all(a[a.index("--dtype") + 1] == "bfloat16" and "--packing" in a and "--cuda-graphs" in a
               for _, a in drains)
    row = graphs["batches"][0]
    assert row["host_ceiling"]["rate"] == 500.0 and row["worker"]["ready_s"] == 3.0
    assert row["worker"]["device_ms_per_batch"] == 50.0 and len(row["worker_rounds"]) == 3
    assert row["worker_steady_over_model"] == pytest.approx(0.05) and graphs["drain_texts"] == 1_000


def test_the_ab_benchs_text_workers_take_the_workers_own_flags_and_bad_counts_are_refused(
        tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from stream.bench import ab
    from stream.bench.simulated import write_spec
    from stream.bench.stages import free_model, text_worker_args
    from stream.cli import build_parser
    from stream.pipeline.malloc import MODEL_BOUND_MMAP_THRESHOLD, mmap_threshold

    spec = write_spec(tmp_path / "free.json", 0.0)
    for model, name in ((free_model(spec), "stream.bench.simulated:SimulatedDevice"),
                        (["--model", "minilm"], "minilm")):
        args = build_parser().parse_args(["worker", "--bootstrap-servers", "127.0.0.1:1", "--input-topic", "in",
                                          "--output-topic", "out", *text_worker_args(model, 64)])
        assert (args.model, args.max_batch_size, args.torch_threads, args.device) == (name, 64, 1, "cpu")
        # the free model runs MiniLM's host path with MiniLM's allocator setting
        assert mmap_threshold(args.model, args.malloc_mmap_threshold_kib) == MODEL_BOUND_MMAP_THRESHOLD
    for bad in (["--events", "0"], ["--model", "free-text", "--batch", "0"]):
        with pytest.raises(SystemExit) as exc:
            ab.main(["--baseline", "HEAD", *bad])
        assert exc.value.code == 2
        assert "--events and --batch must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ab.main(["--baseline", "HEAD", "--model", "gpt"])
    assert "invalid choice: 'gpt'" in capsys.readouterr().err


def test_a_scrape_of_a_worker_that_exits_mid_response_reads_nothing_instead_of_failing_the_drain() -> None:
    """A drain scrapes its worker every 0.2 s until the worker exits: a response cut short by the exit (a
    ``Content-Length`` of 200 and 10 bytes sent) is no reading, as a refused connection is."""
    import socket
    import threading

    from stream.bench.probes import scrape

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer_short() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 200\r\n\r\nstream_rec")

    thread = threading.Thread(target=answer_short, daemon=True)
    thread.start()
    try:
        assert scrape(port, "stream_records_consumed_total") is None
    finally:
        thread.join(5)
        server.close()
    assert scrape(port, "stream_records_consumed_total") is None  # nothing listening
