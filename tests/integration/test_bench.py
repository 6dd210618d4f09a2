"""The benchmark runs in CI in quick mode so it cannot rot. No speed is asserted here; the worker's figures are checked
against its output topics, read by the tests' own verifier."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from stream.bench.bench_config import BenchConfig
from stream.bench.report import format_before, format_broker_alone, format_latency, format_methods, format_table
from stream.bench.revisions import ROOT, checkout_revision
from stream.bench.runner import run_bench
from stream.bench.stages import format_stages_table
from stream.bench.summarize import markdown
from stream.bench.text import format_text_table, quick_text_config
from tests.conftest import BrokerInfo
from tests.verify import CommitWatch, record_times

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_quick_bench_produces_every_figure_and_plot(broker: BrokerInfo, tmp_path: Path) -> None:
    cfg = BenchConfig(events=5_000, naive_events=100, faust_events=1_000, latency_seconds=1.0, warmup_seconds=0.5,
                      loads=(0.1, 0.5), fixed_policy_loads=(0.1,), waits_ms=(5.0,), results=tmp_path / "results",
                      generic_events=2_000, before="HEAD", before_rounds=2, text=quick_text_config(),
                      end_to_end_records=200)
    worktrees = _worktrees()
    # A worker's output topic bench-worker-current-R-out-RUN: its group bench-worker-current-R-RUN reads bench-in-RUN.
    with CommitWatch(broker.bootstrap, "bench-worker-current-", lambda out: out.replace("-out-", "-"),
                     lambda out: "bench-in-" + out.rsplit("-", 1)[1], until=cfg.events) as watch:
        report = run_bench(cfg, bootstrap=broker.bootstrap, console_print=lambda *_: None)
    names = [d["name"] for d in report["drain"]]
    assert names == ["passthrough", "jvm-flush", "jvm-pipelined", "kafka-streams", "naive", "faust", "handtuned",
                     "quix-apply", "quix-sink", "worker-default", "worker-before", "worker-best", "worker-best-x2",
                     "worker-generic", "worker-live"]
    rates = {d["name"]: d["rate"] for d in report["drain"]}
    # The pass-through limit is the faster JVM loop; every row is divided by it, Quix's best and the broker's own.
    assert report["limit"] == max(rates["jvm-flush"], rates["jvm-pipelined"])
    alone = report["broker_alone"]
    assert alone["consume"]["records"] >= 5_000 and alone["consume"]["fetch_records_per_s"] > 0
    assert alone["produce"]["records"] == 5_000 and alone["produce"]["records_per_s"] > 0
    assert alone["record_size"] > 100 and alone["end_to_end"]["p50_ms"] <= alone["end_to_end"]["p99_ms"]
    assert "ConsumerPerformance" in (format_broker_alone(report) or "")
    row = format_table(report)[names.index("worker-default") + 1]
    assert row[4:8] == [f"{rates['worker-default'] / ref:.2f}" for ref in (
        report["limit"], max(rates["quix-apply"], rates["quix-sink"]), alone["consume"]["fetch_records_per_s"],
        alone["produce"]["records_per_s"])]
    # The broker's latency floor beside the adaptive steps at 10 % and 50 % load.
    assert [(f["load"], f["max_wait_ms"]) for f in report["floor"]] == [(0.1, 5.0), (0.5, 5.0)]
    assert all(f["events"] > 0 and f["p50_ms"] <= f["p99_ms"] for f in report["floor"])
    # The demo layout against a revision's worker (here HEAD's, built in a worktree that is gone afterwards).
    before = report["before"]
    assert before["rounds"] == 2 and len(before["current_rates"]) == len(before["before_rates"]) == 2
    assert rates["worker-default"] == min(before["current_rates"])  # the lower middle of two
    assert rates["worker-before"] == min(before["before_rates"])
    assert before["pair_ratios"] == [c / b for c, b in zip(before["current_rates"], before["before_rates"],
                                                                   strict=True)]
    assert "median drain ratio" in (format_before(report) or "")
    # This checkout's rounds against what the tests' own verifier saw: one prediction per event on each output
    # topic, and a window (first record consumed to last commit) no shorter than from its first prediction's
    # timestamp to the last look that found the group's commit still short of the events (the commit came after).
    for r, rate in enumerate(before["current_rates"]):
        (group,) = [g for g in watch.looks if g.startswith(f"bench-worker-current-{r}-")]
        out = watch.topics[group]
        times = record_times(broker.bootstrap, out)
        assert len(times) == cfg.events, (out, len(times))
        short = watch.last_short_of(group, cfg.events)
        assert short is not None, (group, watch.looks[group][:3], watch.errors[:3])
        print(f"{group}: window {cfg.events / rate:.3f} s, first prediction to the last look short of the commit "
              f"{short - min(times):.3f} s, {len(watch.looks[group])} looks")
        assert cfg.events / rate >= short - min(times) - 0.002, (group, cfg.events / rate, short - min(times))
    assert _worktrees() == worktrees
    # The latency steps' loads are fractions of the smaller of the drain and the live (generator running) rate.
    assert report["capacity_drain"] == rates["worker-default"] and report["capacity_live"] == rates["worker-live"]
    assert report["capacity"] == min(rates["worker-default"], rates["worker-live"])
    assert {r["offered_rate"] for r in report["latency"]} == {report["capacity"] * 0.1, report["capacity"] * 0.5}
    expected = {"naive": 100, "faust": 1_000, "worker-generic": 2_000}
    for d in report["drain"]:
        assert d["events"] >= expected.get(d["name"], 5_000), d
        assert d["seconds"] > 0 and d["rate"] > 0
    # The model-bound section: the worker and the model alone on the same texts and batch size, bucketing's gain.
    text = report["text"]
    cpu = text["devices"][0]
    assert cpu["device"] == "cpu" and text["cuda"]
    assert cpu["texts"] == 160 and [b["batch"] for b in cpu["batches"]] == [32]
    row = cpu["batches"][0]
    assert row["worker"]["events"] == 160 and row["worker"]["rate"] > 0 and row["model_alone"]["rate"] > 0
    # recorded so a run shows its batches were full (the first may close early while the model is idle)
    assert 0 < row["worker"]["mean_batch_size"] <= 32
    assert row["worker_over_model"] == row["worker"]["rate"] / row["model_alone"]["rate"]
    # the broker's own pass-through of the same texts with embedding-sized values: the worker's other bound
    ceiling = cpu["broker_ceiling"]
    assert ceiling["events"] == 160 and ceiling["rate"] > 0 and ceiling["value_bytes"] == 4 * 384 + 64
    assert row["worker_over_bound"] == row["worker"]["rate"] / min(row["model_alone"]["rate"], ceiling["rate"])
    assert row["plain_padding"]["padding_ratio"] > row["bucketed_same_texts_as_plain"]["padding_ratio"] >= 1.0
    assert row["sentence_transformers"]["texts"] == 160 and row["sentence_transformers"]["rate"] > 0
    assert row["model_over_sentence_transformers"] == row["model_alone"]["rate"] / row["sentence_transformers"]["rate"]
    assert set(row["worker"]["stage_busy_s"]) == set(row["worker"]["stage_cpu_s"]) == {"prepare", "device", "finish"}
    assert len(format_text_table(text)) == 1 + len(text["devices"])
    # The stages against a simulated device: the host ceiling, then devices at about H/2 and H, per round.
    stages = text["stages"]
    assert stages["tokenize_alone"] > 0 and stages["padded_tokens_per_text"] >= 1
    [round_] = stages["rounds"]
    assert round_["host"]["events"] == 1_024 and round_["host"]["stage_busy_s"]["prepare"] > 0
    for name, fraction in (("half", 0.5), ("full", 1.0)):
        figures = round_[name]
        assert figures["worker"]["events"] == 1_024
        assert figures["ns_per_token"] == pytest.approx(1e9 / (round_["host"]["rate"] * fraction
                                                                * stages["padded_tokens_per_text"]))
        assert figures["over_device"] == figures["worker"]["rate"] / figures["device_alone"]
    assert set(stages["summary"]) == {"half", "full", "host", "library_host", "gain", "broker", "host_cpu"}
    assert round_["broker_ceiling"]["events"] == 1_024 and round_["broker_ceiling"]["value_bytes"] == 4 * 384 + 64
    assert round_["host_over_broker"] == round_["host"]["rate"] / round_["broker_ceiling"]["rate"]
    assert stages["library_tokenize_alone"] > 0 and round_["host_library"]["events"] == round_["host"]["events"]
    assert len(format_stages_table(stages)) == 3
    drains = ("worker-default", "worker-before", "worker-best", "worker-best-x2", "worker-generic")
    assert all(d["peak_rss_mib"] for d in report["drain"] if d["name"] in drains)
    assert [(r["load"], r["max_wait_ms"], r["settings"]) for r in report["latency"]] == [
        (0.1, 5.0, "defaults"), (0.5, 5.0, "defaults"), (0.1, 5.0, "--batch-policy fixed")]
    for r in report["latency"]:
        assert len(r["latencies_ms"]) == r["events"] > 0 and r["p50_ms"] <= r["p99_ms"] <= r["p999_ms"]
        assert r["events"] + r["warmup_events"] == max(int(r["offered_rate"] * 1.5), 1)
        assert r["from_event_p50_ms"] >= 0 and r["achieved_rate"]
        # CPU over the counted window: no broker process of its own here (the suite's broker is a given cluster).
        cpu = r["cpu_cores"]
        assert set(cpu) == {"worker", "generator"} and min(cpu.values()) >= 0 and sum(cpu.values()) > 0, cpu
        assert r["broker_gc"] is None  # nor its collection log
        if broker.kind == "kafka":
            assert r["timestamps"] == "LogAppendTime"
            assert r["p50_ms"] >= 0, "an input record is appended before its prediction"
    warm = report["latency_warmup"]  # run first, kept apart from the table
    assert (warm["load"], warm["max_wait_ms"]) == (0.5, 5.0) and warm["events"] > 0 and "latencies_ms" not in warm
    for name in ("bench.json", "summary.json", "throughput.png", "latency_cdf.png", "batch_sizes.png"):
        assert (cfg.results / name).stat().st_size > 0
    assert len(format_table(report)) == 1 + len(names) and len(format_latency(report)) == 4
    assert all(line.split(": ", 1)[1] for line in format_methods(report)), "every row says how it was measured"
    # The committed summary prints as the Markdown that docs/performance.md quotes.
    text = markdown(json.loads((cfg.results / "summary.json").read_text()))
    assert [line.split(" | ")[0] for line in text.splitlines() if line.startswith("| worker")] == [
        f"| {name}" for name in names if name.startswith("worker")]
    assert "median drain ratio" in text and sum(line.startswith("| --- |") for line in text.splitlines()) == 2


def _worktrees() -> str:
    return subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def test_guarantees_compares_drains_and_what_read_committed_readers_wait(broker: BrokerInfo,
                                                                         tmp_path: Path) -> None:
    from stream.bench.guarantees import main as guarantees

    if broker.kind != "kafka":
        pytest.skip("exactly-once needs Apache Kafka")
    out = tmp_path / "guarantees.json"
    assert guarantees(["--bootstrap-servers", broker.bootstrap, "--events", "3000", "--rounds", "1",
                       "--latency-loads", "0.1", "--latency-seconds", "1", "--capacity", "20000",
                       "--results", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [(d["guarantee"], d["events"]) for d in report["drains"]] == [("at-least-once", 3000),
                                                                        ("exactly-once", 3000)]
    steps = report["visibility"]["steps"]
    assert [(s["guarantee"], s["load"], s["offered_rate"]) for s in steps] == [
        ("at-least-once", 0.1, 2000.0), ("exactly-once", 0.1, 2000.0)]
    for s in steps:
        assert s["visible_isolation"] == "read_committed" and s["events"] > 0
        # A reader receives a prediction after it was appended (append times are whole ms).
        assert s["visible_p50_ms"] >= s["p50_ms"] - 1 and s["visible_p50_ms"] <= s["visible_p99_ms"]
    assert "transactions" not in steps[0] and steps[1]["transactions"] >= 1
    assert report["visibility"]["added_visible_p99_ms"] == {
        "0.1": steps[1]["visible_p99_ms"] - steps[0]["visible_p99_ms"]}


def test_large_values_drains_each_variant_and_reports_the_worker_s_peak(broker: BrokerInfo, tmp_path: Path) -> None:
    from stream.bench.large_values import main as large_values

    out = tmp_path / "large.json"
    assert large_values(["--bootstrap-servers", broker.bootstrap, "--records", "60", "--size", "600000",
                         "--header-records", "20", "--variants", "small,default,many-headers",
                         "--results", str(out)]) == 0
    report = json.loads(out.read_text())
    small, default = report["variants"]["small"], report["variants"]["default"]
    many = report["variants"]["many-headers"]
    assert many["predicted"] == many["records"] == 20 and many["headers"]["count"] == 100_000
    assert small["predicted"] == default["predicted"] == 60 and small["value_bytes"] < 300
    assert 600_000 < default["value_bytes"] < 700_000 and default["compression"] == "lz4"
    # 36 MB of values in batches of at most 32 MiB each
    assert default["batches"] >= 2 and default["mean_batch_size"] <= 55
    assert small["peak_rss_mib"] > 50 and default["peak_rss_mib"] > 50


def test_a_revision_this_clone_lacks_is_not_compared(tmp_path: Path) -> None:
    assert checkout_revision("0" * 40, tmp_path / "tree") is None
    assert not (tmp_path / "tree").exists()
    line = format_before({"before": {"revision": "abc1234", "skipped": "this clone does not have that revision"}})
    assert line == "demo layout against abc1234: not compared (this clone does not have that revision)"


def test_broker_floor_times_every_record_after_the_warm_up(broker: BrokerInfo) -> None:
    from stream.bench.floor import measure_floor

    result = measure_floor(broker.bootstrap, rate=2_000, seconds=1.0, warmup_s=0.5, max_wait_ms=5.0)
    # 3,000 events over 1.5 s: those stamped in the first 0.5 s are the warm-up.
    assert 1_000 <= result["events"] < 3_000 and "delivered=3000/3000" in result["generator"]
    assert 0 <= result["p50_ms"] <= result["p99_ms"] <= result["p999_ms"]
    with pytest.raises(ValueError, match="rate and seconds"):
        measure_floor(broker.bootstrap, rate=0)


def test_benchmark_broker_heap_reaches_the_jvm() -> None:
    from stream.local.broker import kafka_available, start_kafka
    from stream.local.kafka_node import KafkaHeap

    if not kafka_available():
        pytest.skip("Apache Kafka unavailable (needs java and mvn)")
    heap = KafkaHeap(heap_mib=512, young_mib=256, pretouch=True, region_mib=4)
    with start_kafka(heap=heap) as local:
        cmdline = Path(f"/proc/{local.pid}/cmdline").read_bytes().split(b"\0")
        assert [a.decode() for a in cmdline if a.startswith((b"-Xm", b"-XX:G1HeapRegion", b"-XX:+AlwaysPre"))] == \
            heap.jvm_args()
        rss_kib = next(int(line.split()[1]) for line in Path(f"/proc/{local.pid}/status").read_text().splitlines()
                       if line.startswith("VmRSS:"))
        assert rss_kib > 512 * 1024  # every heap page touched at start
        # Its collection log is stamped with wall-clock ms, the clock the benchmark's steps are timed on.
        assert local.gc_log is not None
        first = local.gc_log.read_text().splitlines()[0]
        assert abs(int(first[1:first.index("ms]")]) / 1000.0 - time.time()) < 120, first
