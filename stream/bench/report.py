"""The benchmark's results: drains, how each row was measured, the printed tables and the plots."""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BEST_SETTINGS = ["--max-batch-size", "8192", "--max-inflight-batches", "2"]


@dataclass
class Drain:
    name: str
    events: int
    seconds: float
    peak_rss_mib: float | None = None
    rss_samples: list[tuple[float, float]] = field(default_factory=list)  # (consumed, RSS MiB)
    mean_batch_size: float | None = None  # the worker's, from its summaries
    transactions: int | None = None  # the worker's under exactly-once, from its summaries
    stage_busy_s: dict[str, float] | None = None  # the workers' stages' working seconds, from their summaries
    cpu_cores: dict[str, float] | None = None  # mean cores of the workers (together) and the local broker, drain window
    # (seconds since the drain began, records consumed by replica 0) every 0.2 s, for the steady-state rate
    progress: list[tuple[float, float]] = field(default_factory=list)
    ready_s: float | None = None  # replica 0's cold start: process start to /readyz 200 (model loaded, warmed, joined)
    device_busy_s: float | None = None  # CUDA: the workers' device time on records' batches (CUDA events)
    batches: int | None = None
    stage_cpu_s: dict[str, float] | None = None  # the CPU seconds the stages' threads used while they worked
    device_warm_s: float | None = None  # CUDA: the workers' device time on their warm-up batches (since 2026-12-07)

    @property
    def steady_rate(self) -> float | None:
        """Records a second between 20 % and 95 % of the drain (`steady_rate_of` ``progress``): the rate with
        the start (fetching, first batches) and the end (the last batches, the last commit) left out."""
        return steady_rate_of(self.progress, self.events)

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    def rss_growth(self, since: float = 1_000_000) -> tuple[float, float, float] | None:
        """(consumed, RSS) at the first sample at or past ``since`` events (1/5 of the run when shorter) and at
        the last sample: (from MiB, to MiB, growth fraction)."""
        if len(self.rss_samples) < 2:
            return None
        mark = since if self.rss_samples[-1][0] >= 2 * since else self.rss_samples[-1][0] / 5
        start = next(rss for consumed, rss in self.rss_samples if consumed >= mark)
        end = self.rss_samples[-1][1]
        return start, end, end / start - 1.0


def steady_rate_of(progress: list[tuple[float, float]], total: float, low: float = 0.2,
                   high: float = 0.95) -> float | None:
    """The slope of records consumed against time between the moments ``low`` and ``high`` of ``total`` were
    reached (each found by linear interpolation between samples); None with fewer than three samples between
    them (too short a drain to say)."""
    def when(mark: float) -> float | None:
        for (t0, c0), (t1, c1) in itertools.pairwise(progress):
            if c0 < mark <= c1:
                return t0 + (t1 - t0) * (mark - c0) / (c1 - c0)
        return None

    a, b = when(low * total), when(high * total)
    inside = sum(1 for _, c in progress if low * total <= c <= high * total)
    if a is None or b is None or b <= a or inside < 3:
        return None
    return (high - low) * total / (b - a)


def median_drain(drains: list[Drain], name: str) -> Drain:
    """The drain of median rate (the lower of the middle two for an even count), renamed ``name``."""
    middle = sorted(drains, key=lambda d: d.rate)[(len(drains) - 1) // 2]
    return Drain(name, middle.events, middle.seconds, middle.peak_rss_mib, middle.rss_samples, middle.mean_batch_size)


def compare_drains(rev: str, current: list[Drain], before: list[Drain]) -> dict[str, Any]:
    """The ratio of the median rates, and of each round's pair."""
    return {"revision": rev, "rounds": len(current), "current_rates": [d.rate for d in current],
            "before_rates": [d.rate for d in before],
            "pair_ratios": [c.rate / b.rate for c, b in zip(current, before, strict=True)],
            "ratio": statistics.median(d.rate for d in current) / statistics.median(d.rate for d in before)}


def format_before(report: dict[str, Any]) -> str | None:
    """One line on the demo layout's drain against the revision before the field plans, if compared."""
    before = report.get("before")
    if not before:
        return None
    if "skipped" in before:
        return f"demo layout against {before['revision']}: not compared ({before['skipped']})"
    pairs = before["pair_ratios"]
    return (f"demo layout, this checkout / {before['revision']} (before the field plans): median drain ratio "
            f"{before['ratio']:.3f} over {before['rounds']} interleaved round(s) (pairs {min(pairs):.2f}-"
            f"{max(pairs):.2f})")


def write_plots(report: dict[str, Any], folder: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drains = report["drain"]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.bar([d["name"] for d in drains], [d["rate"] for d in drains], color="#4878a8")
    ax.set_ylabel("events/s (drain)")
    ax.set_yscale("log")
    ax.set_title(f"drain throughput ({report['versions']['cpu_cores']} cores, {report['broker']})")
    plt.setp(ax.get_xticklabels(), rotation=20, ha="right")
    fig.tight_layout()
    fig.savefig(folder / "throughput.png", dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(8, 4))
    for run in report["latency"]:
        if run["latencies_ms"]:  # 2,001 quantiles, minimum to maximum: the curve of every point, drawn fast
            fractions = np.linspace(0.0, 1.0, 2001)
            ax.plot(np.quantile(np.asarray(run["latencies_ms"]), fractions), fractions, label=_label(run))
    ax.set_xlabel("pipeline latency (ms, input record's append -> its prediction's append)")
    ax.set_ylabel("fraction of events")
    ax.set_xscale("log")
    _save(plt, fig, ax, folder / "latency_cdf.png")
    fig, ax = plt.subplots(figsize=(8, 4))
    for run in report["latency"]:
        ax.hist(run["batch_sizes"], bins=40, histtype="step", label=_label(run))
    ax.set_xlabel("batch size of each prediction's batch")
    ax.set_ylabel("predictions")
    _save(plt, fig, ax, folder / "batch_sizes.png")


def _label(run: dict[str, Any]) -> str:
    policy = "fixed" if "fixed" in run["settings"] else "adaptive"
    return f"{run['load']:.0%} load, max_wait {run['max_wait_ms']:g} ms, {policy}"


def _save(plt: Any, fig: Any, ax: Any, path: Path) -> None:
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


DRAIN_METHODS = {
    "passthrough": "a per-record Python loop: consume, produce the same bytes, commit (no decode, no model)",
    "jvm-flush": "a JVM kafka-clients loop (stream/bench/jvm/PassThrough.java): poll, send the same bytes, flush, "
                 "commitAsync; no decode, no model",
    "jvm-pipelined": "the same JVM loop without a flush per poll: offsets committed every 100 ms up to each "
                     "partition's first unacknowledged send",
    "kafka-streams": "Kafka Streams stream(in).to(out), at-least-once, one stream thread (StreamsPassThrough.java)",
    "quix-apply": "Quix Streams 3.28.1, sdf.apply per record (decode, one forward pass of one, encode), to_topic",
    "quix-sink": "Quix Streams 3.28.1, a BatchingSink: one forward pass per checkpoint batch of a partition",
    "naive": "a per-record Python loop with fastavro decode/encode and one forward pass per record",
    "faust": "faust-streaming, batches of the worker's default size, one forward pass per batch",
    "handtuned": "a hand-written confluent-kafka loop: consume() batches, numpy decode, one forward pass",
    "worker-default": "the worker at its defaults (the demo layout: 4 fields, 32 floats); with worker-before, "
                      "the median of its rounds",
    "worker-before": "the worker at the revision before the field plans (see the line below the table), built in "
                     "a worktree, at its defaults: the median of rounds interleaved with worker-default's",
    "worker-best": "the worker with " + " ".join(BEST_SETTINGS),
    "worker-best-x2": "two worker replicas in one group with " + " ".join(BEST_SETTINGS),
    "worker-generic": "the worker at its defaults on stream.bench.generic (12 named scalars, two strings, a "
                      "nullable long; two fields copied)",
    "worker-live": "the worker at its defaults while the load generator publishes as fast as it can",
}


def format_methods(report: dict[str, Any]) -> list[str]:
    """How each drain row was measured (every row drains the same pre-produced demo events to the end, except
    worker-generic's own and worker-live's live ones)."""
    return [f"{d['name']}: {DRAIN_METHODS.get(d['name'], '')}" for d in report["drain"]]


def references(report: dict[str, Any]) -> dict[str, float]:
    """The rates the drain table divides by: the pass-through limit (the faster JVM loop), Quix's best variant,
    and the broker's consume and produce limits (Kafka's own tools), where measured."""
    rates = {d["name"]: d["rate"] for d in report["drain"]}
    out: dict[str, float] = {}
    limit = report.get("limit") or rates.get("passthrough")
    if limit:
        out["limit"] = limit
    quix = [rates[n] for n in ("quix-apply", "quix-sink") if n in rates]
    if quix:
        out["quix"] = max(quix)
    alone = report.get("broker_alone") or {}
    if alone:
        out["consume"] = alone["consume"]["fetch_records_per_s"]
        out["produce"] = alone["produce"]["records_per_s"]
    return out


def format_table(report: dict[str, Any]) -> list[list[str]]:
    refs = references(report)
    rows = [["contender", "events", "seconds", "events/s", "x limit", "x Quix best", "x broker consume",
             "x broker produce", "peak RSS MiB", "RSS growth"]]
    for d in report["drain"]:
        growth = d.get("rss_growth")
        rows.append([d["name"], f"{d['events']:,}", f"{d['seconds']:.2f}", f"{d['rate']:,.0f}",
                     *(f"{d['rate'] / refs[k]:.2f}" if k in refs else "-" for k in ("limit", "quix", "consume",
                                                                                     "produce")),
                     f"{d['peak_rss_mib']:.0f}" if d["peak_rss_mib"] else "-",
                     f"{growth[0]:.0f}->{growth[1]:.0f} MiB ({growth[2]:+.1%})" if growth else "-"])
    return rows


def format_broker_alone(report: dict[str, Any]) -> str | None:
    """One line on the broker's own limits, measured in the same run."""
    alone = report.get("broker_alone")
    if not alone:
        return None
    c, p, e = alone["consume"], alone["produce"], alone["end_to_end"]
    return (f"the broker alone (Kafka's tools, same run): ConsumerPerformance {c['fetch_records_per_s']:,.0f} "
            f"records/s ({c['records_per_s']:,.0f} with its group join); ProducerPerformance "
            f"{p['records_per_s']:,.0f} records/s of {alone['record_size']} bytes (acks=all, lz4, 5 ms linger; "
            f"p99 {p['p99_ms']:.0f} ms); EndToEndLatency (one record at a time, acks=all) p50 {e['p50_ms']:.0f} ms, "
            f"p99 {e['p99_ms']:.0f} ms, p99.9 {e['p999_ms']:.0f} ms")


def format_gc(gc: dict[str, Any] | None) -> str:
    if gc is None:
        return "-"
    return f"{gc['pauses']} (max {gc['max_ms']:.0f} ms)" if gc["pauses"] else "0"


def format_latency(report: dict[str, Any]) -> list[list[str]]:
    rows = [["max_wait_ms", "batches", "load", "offered ev/s", "p50 ms", "p99 ms", "p99.9 ms", "from event p50",
             "from event p99", "broker floor p99", "p99 - floor - wait", "mean batch", "CPU worker/broker/generator",
             "broker GC pauses"]]
    floors = {(f["load"], f["max_wait_ms"]): f for f in report.get("floor", [])}
    for r in report["latency"]:
        policy = "fixed" if "fixed" in r["settings"] else "adaptive"
        cpu = r.get("cpu_cores") or {}
        floor = floors.get((r["load"], r["max_wait_ms"])) if policy == "adaptive" else None
        rows.append([f"{r['max_wait_ms']:g}", policy, f"{r['load']:.0%}", f"{r['offered_rate']:,.0f}",
                     f"{r['p50_ms']:.1f}", f"{r['p99_ms']:.1f}", f"{r['p999_ms']:.1f}", f"{r['from_event_p50_ms']:.1f}",
                     f"{r['from_event_p99_ms']:.1f}", f"{floor['p99_ms']:.1f}" if floor else "-",
                     f"{r['p99_ms'] - floor['p99_ms'] - r['max_wait_ms']:+.1f}" if floor else "-",
                     f"{r['mean_batch_size']:.1f}",
                     " / ".join(f"{cpu[k]:.2f}" if k in cpu else "-" for k in ("worker", "broker", "generator")),
                     format_gc(r.get("broker_gc"))])
    return rows
