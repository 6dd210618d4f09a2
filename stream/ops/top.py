"""``python -m stream top``: a live view of running replicas, from their metrics endpoints (``/metrics``, and
``/healthz`` and ``/readyz`` for their state). One row per replica, refreshed every second: events in and out
per second, consumer lag, mean batch size and end-to-end p99 since the last refresh, the stage that binds (its
share of its threads' time in use), dead letters, partitions, the model version and the mean of its first scalar
output. With replicas of more than one model version (a canary), one more row per version sums them, side by
side. Ctrl-C ends it."""

from __future__ import annotations

import math
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import FrameType

from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.live import Live
from rich.table import Table

_TIMEOUT_S = 2.0


def endpoint(target: str) -> str:
    """``PORT``, ``HOST:PORT`` or a URL -> the endpoint's base URL (no trailing ``/metrics``)."""
    target = target.strip()
    if target.isdigit():
        target = f"127.0.0.1:{target}"
    if "://" not in target:
        target = f"http://{target}"
    return target.rstrip("/").removesuffix("/metrics")


@dataclass
class Scrape:
    """One replica's metrics at one moment, or why there are none."""

    at: float
    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)
    error: str | None = None
    health: tuple[int, str] = (0, "")
    ready: tuple[int, str] = (0, "")

    def total(self, name: str, **match: str) -> float | None:
        rows = [v for labels, v in self.samples.get(name, []) if all(labels.get(k) == w for k, w in match.items())]
        return sum(rows) if rows else None

    def buckets(self, name: str) -> dict[float, float]:
        """Cumulative counts by upper bound of histogram ``name`` (summed over its other labels)."""
        out: dict[float, float] = {}
        for labels, value in self.samples.get(f"{name}_bucket", []):
            bound = float(labels["le"])
            out[bound] = out.get(bound, 0.0) + value
        return out


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as reply:
            return reply.status, reply.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def scrape(base: str, clock: Callable[[], float] = time.monotonic) -> Scrape:
    at = clock()
    try:
        status, text = _get(f"{base}/metrics")
        if status != 200:
            return Scrape(at, error=f"/metrics answered {status}")
        samples: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
        return Scrape(at, samples, health=_get(f"{base}/healthz"), ready=_get(f"{base}/readyz"))
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)  # URLError wraps the socket's error
        return Scrape(at, error=getattr(reason, "strerror", None) or str(reason))


def quantile(q: float, before: dict[float, float], now: dict[float, float]) -> float | None:
    """The ``q`` quantile of the observations between two scrapes of a histogram, interpolated within its bucket
    as Prometheus's ``histogram_quantile`` does; None without observations."""
    bounds = sorted(now)
    counts = [now[b] - before.get(b, 0.0) for b in bounds]
    if not bounds or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    lower, below = 0.0, 0.0
    for bound, cumulative in zip(bounds, counts, strict=True):
        if cumulative >= rank:
            if math.isinf(bound):
                return lower
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = bound, cumulative
    return lower


@dataclass
class Row:
    replica: str
    state: str
    in_rate: float | None = None
    out_rate: float | None = None
    lag: float | None = None
    batch: float | None = None
    p99_s: float | None = None
    binds: str = ""  # the stage whose threads were busiest, and how busy: "prepare 93%"
    dead: float | None = None
    partitions: str = ""
    assigned: int = 0  # the partitions it holds (summed by version_rows)
    version: str = ""  # the model's name:version (stream_model_info)
    mean_output: str = ""  # the mean of its first scalar output over the interval: "fraud_score 0.127"


def row(replica: str, before: Scrape | None, now: Scrape) -> Row:
    """What one replica did between two scrapes (rates and windowed figures need both)."""
    if now.error is not None:
        return Row(replica, f"down: {now.error}")
    if now.health[0] != 200:  # /healthz and /readyz answer 503 with their reasons, one per line
        state = _first_line(now.health[1]) or f"unhealthy ({now.health[0]})"
    elif now.ready[0] != 200:
        state = f"not ready: {_first_line(now.ready[1]) or now.ready[0]}"
    else:
        state = "ready"
    lag = now.total("stream_consumer_lag_records")
    assigned, paused = now.total("stream_assigned_partitions"), now.total("stream_paused_partitions")
    out = Row(replica, state, lag=lag, dead=now.total("stream_dead_letters_total") or 0.0,
              partitions=f"{assigned or 0:.0f}" + (f" ({paused:.0f} paused)" if paused else ""),
              assigned=int(assigned or 0), version=model_version(now))
    if before is None or before.error is not None or now.at <= before.at:
        return out
    dt = now.at - before.at

    def delta(name: str) -> float | None:
        a, b = before.total(name), now.total(name)
        return None if a is None or b is None else max(0.0, b - a)

    consumed, predicted = delta("stream_records_consumed_total"), delta("stream_predictions_total")
    out.in_rate = consumed / dt if consumed is not None else None
    out.out_rate = predicted / dt if predicted is not None else None
    batches, records = delta("stream_batch_size_records_count"), delta("stream_batch_size_records_sum")
    out.batch = records / batches if batches and records is not None else None
    out.p99_s = quantile(0.99, before.buckets("stream_end_to_end_latency_seconds"),
                         now.buckets("stream_end_to_end_latency_seconds"))
    out.binds = binding_stage(before, now, dt)
    out.mean_output = mean_output([before], [now])
    return out


def model_version(scrape: Scrape) -> str:
    """``name:version`` of the model a replica serves, from stream_model_info."""
    for labels, _ in scrape.samples.get("stream_model_info", []):
        return f"{labels.get('name', '?')}:{labels.get('version', '?')}"
    return ""


def mean_output(befores: list[Scrape | None], nows: list[Scrape]) -> str:
    """The mean of the first scalar output (stream_prediction_value) over the interval, summed over replicas."""
    outputs = sorted({labels.get("output", "") for now in nows
                      for labels, _ in now.samples.get("stream_prediction_value_count", [])})
    if not outputs:
        return ""
    total = count = 0.0
    for before, now in zip(befores, nows, strict=True):
        b_sum = before.total("stream_prediction_value_sum", output=outputs[0]) if before else None
        b_count = before.total("stream_prediction_value_count", output=outputs[0]) if before else None
        n_sum = now.total("stream_prediction_value_sum", output=outputs[0])
        n_count = now.total("stream_prediction_value_count", output=outputs[0])
        if n_sum is not None and n_count is not None:
            total += n_sum - (b_sum or 0.0)
            count += n_count - (b_count or 0.0)
    return f"{outputs[0]} {total / count:.3f}" if count > 0 else ""


def version_rows(rows: list[Row], befores: list[Scrape | None], nows: list[Scrape]) -> list[Row]:
    """With replicas of more than one model version (a canary), one row per version: its replicas' rates, lag,
    dead letters and partitions summed, its p99 and mean output over all of them, side by side."""
    versions = sorted({r.version for r in rows if r.version})
    if len(versions) < 2:
        return []
    out = []
    for version in versions:
        members = [i for i, r in enumerate(rows) if r.version == version]
        picked = [rows[i] for i in members]
        held = sum(r.assigned for r in picked)
        before_buckets: dict[float, float] = {}
        now_buckets: dict[float, float] = {}
        for i in members:
            before = befores[i]
            if before is not None and before.error is None and nows[i].error is None:
                for bound, c in before.buckets("stream_end_to_end_latency_seconds").items():
                    before_buckets[bound] = before_buckets.get(bound, 0.0) + c
                for bound, c in nows[i].buckets("stream_end_to_end_latency_seconds").items():
                    now_buckets[bound] = now_buckets.get(bound, 0.0) + c

        def summed(values: list[float | None]) -> float | None:
            known = [v for v in values if v is not None]
            return sum(known) if known else None

        out.append(Row(f"{version} ({len(picked)})", "version", summed([r.in_rate for r in picked]),
                       summed([r.out_rate for r in picked]), summed([r.lag for r in picked]), None,
                       quantile(0.99, before_buckets, now_buckets), "", summed([r.dead for r in picked]),
                       str(held), held, version,
                       mean_output([befores[i] for i in members], [nows[i] for i in members])))
    return out


def binding_stage(before: Scrape, now: Scrape, dt: float) -> str:
    """The stage whose threads spent the largest share of ``dt`` working (stream_stage_busy_seconds_total over
    stream_stage_threads), as "prepare 93%", and the share of it they ran on a CPU (stream_stage_cpu_seconds_total,
    when exported), as "prepare 93% (CPU 41%)": the rest they waited for the GIL or for a core, which more threads
    do not cure (or, on the CPU, for torch's intra-op threads); "" when the replica exports no stages or nothing
    was busy."""
    def share(metric: str, stage: str, threads: float) -> float | None:
        a, b = before.total(metric, stage=stage), now.total(metric, stage=stage)
        return None if a is None or b is None else max(0.0, b - a) / dt / threads

    shares = []
    for labels, _ in now.samples.get("stream_stage_threads", []):
        stage = labels.get("stage", "")
        threads = now.total("stream_stage_threads", stage=stage)
        if threads and (busy := share("stream_stage_busy_seconds_total", stage, threads)) is not None:
            shares.append((busy, stage, threads))
    if not shares or max(shares)[0] <= 0:
        return ""
    busy, stage, threads = max(shares)
    cpu = share("stream_stage_cpu_seconds_total", stage, threads)
    return f"{stage} {min(busy, 1.0):.0%}" + (f" (CPU {min(cpu / busy, 1.0):.0%})" if cpu is not None else "")


def _first_line(text: str, width: int = 48) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0][:width] if lines else ""


def _num(value: float | None, fmt: str = "{:,.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def table(rows: Iterable[Row]) -> Table:
    t = Table(title="stream top", title_justify="left", expand=False)
    for name, justify in (("replica", "left"), ("state", "left"), ("model", "left"), ("in/s", "right"),
                          ("out/s", "right"), ("lag", "right"), ("batch", "right"), ("p99 e2e", "right"),
                          ("binds", "right"), ("dead letters", "right"), ("partitions", "right"),
                          ("mean output", "right")):
        t.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in rows:
        style = ("green" if r.state == "ready" else "cyan" if r.state == "version"
                 else "red" if r.state.startswith(("down", "failed")) else "yellow")
        t.add_row(r.replica, f"[{style}]{r.state}[/]", r.version or "-", _num(r.in_rate), _num(r.out_rate),
                  _num(r.lag), _num(r.batch, "{:,.1f}"),
                  _num(None if r.p99_s is None else r.p99_s * 1000, "{:,.1f} ms"), r.binds or "-", _num(r.dead),
                  r.partitions, r.mean_output or "-")
    return t


def run(targets: list[str], interval_s: float = 1.0, once: bool = False, console: Console | None = None) -> int:
    """Refresh every ``interval_s`` until Ctrl-C (or SIGTERM); ``once``: print one table after two scrapes."""
    bases = [endpoint(t) for t in targets]
    names = [b.removeprefix("http://") for b in bases]
    console = console or Console()
    stop = False

    def on_term(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    previous: list[Scrape | None] = [None] * len(bases)
    with ThreadPoolExecutor(max_workers=min(16, len(bases))) as pool:
        def refresh() -> Table:
            nonlocal previous
            scrapes = list(pool.map(scrape, bases))
            rows = [row(n, b, s) for n, b, s in zip(names, previous, scrapes, strict=True)]
            rows += version_rows(rows, previous, scrapes)
            previous = list(scrapes)
            return table(rows)

        if once:
            refresh()
            time.sleep(interval_s)
            console.print(refresh())
            return 0
        try:
            with Live(refresh(), console=console, auto_refresh=False, screen=False) as live:
                while not stop:
                    deadline = time.monotonic() + interval_s
                    while not stop and time.monotonic() < deadline:
                        time.sleep(0.05)
                    if not stop:
                        live.update(refresh(), refresh=True)
        except KeyboardInterrupt:
            pass
    return 0
