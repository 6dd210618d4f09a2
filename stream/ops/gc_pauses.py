"""The garbage collector's pauses in this process, by generation, as a Prometheus histogram.

A full collection stops every thread of a Python process for as long as it walks the objects it tracks; in a
process that answers callers each such pause lands on every request waiting through it. `GcPauses` times each
collection through `gc.callbacks` and keeps plain counters (no lock: a callback may run while the thread that
triggered the collection holds one of the metrics' locks), which `collect` hands to a Prometheus registry as
``<prefix>_gc_pause_seconds{generation}`` and `snapshot` to a benchmark.
"""

from __future__ import annotations

import bisect
import gc
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5)
GENERATIONS = (0, 1, 2)


class GcPauses(Collector):
    """Installed on construction, until `close`; a Prometheus collector of ``<prefix>_gc_pause_seconds``."""

    def __init__(self, prefix: str = "stream") -> None:
        self.name = f"{prefix}_gc_pause_seconds"
        # Per generation: the count of pauses at or under each bucket's bound (the last: over the largest), and
        # the sum of seconds.
        self._buckets = {g: [0] * (len(BUCKETS) + 1) for g in GENERATIONS}
        self._sum = dict.fromkeys(GENERATIONS, 0.0)
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        seconds = time.perf_counter() - self._started
        generation = min(int(info.get("generation", 2)), 2)
        self._buckets[generation][bisect.bisect_left(BUCKETS, seconds)] += 1
        self._sum[generation] += seconds

    def close(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Per generation: ``count``, ``seconds`` and ``over`` (bound in ms -> pauses longer than it)."""
        out = {}
        for g in GENERATIONS:
            counts = list(self._buckets[g])
            over = {f"{b * 1000:g}": sum(counts[i + 1:]) for i, b in enumerate(BUCKETS)}
            out[str(g)] = {"count": sum(counts), "seconds": self._sum[g], "over": over}
        return out

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, "The garbage collector's pauses in this process, by generation.",
                                       labels=["generation"])
        for g in GENERATIONS:
            counts = list(self._buckets[g])
            cumulative, running = [], 0
            for bound, n in zip((*(f"{b:g}" for b in BUCKETS), "+Inf"), counts, strict=True):
                running += n
                cumulative.append((bound, running))
            family.add_metric([str(g)], cumulative, self._sum[g])
        yield family


def pauses_between(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Two `GcPauses.snapshot`s (or the same read from a scrape) -> what happened between them, by generation."""
    out: dict[str, Any] = {}
    for g, a in after.items():
        b = before.get(g, {"count": 0, "seconds": 0.0, "over": {}})
        out[g] = {"count": a["count"] - b["count"], "ms": (a["seconds"] - b["seconds"]) * 1000.0,
                  "over": {k: v - b["over"].get(k, 0) for k, v in a["over"].items()}}
    return out


def snapshot_from_samples(samples: dict[str, list[tuple[dict[str, str], float]]],
                          name: str) -> dict[str, dict[str, Any]]:
    """A `GcPauses.snapshot` from a scrape's samples (as `stream.ops.top.Scrape` holds them: sample name ->
    (labels, value) rows) of the histogram ``name``."""
    out: dict[str, dict[str, Any]] = {}
    for suffix in ("_count", "_sum", "_bucket"):
        for labels, value in samples.get(f"{name}{suffix}", []):
            g = labels.get("generation")
            if g is None:
                continue
            entry = out.setdefault(g, {"count": 0, "seconds": 0.0, "over": {}})
            if suffix == "_count":
                entry["count"] = int(value)
            elif suffix == "_sum":
                entry["seconds"] = value
            else:
                entry.setdefault("_le", {})[labels["le"]] = int(value)
    for entry in out.values():
        cumulative = entry.pop("_le", {})
        total = cumulative.get("+Inf", entry["count"])
        entry["over"] = {f"{float(le) * 1000:g}": total - n for le, n in cumulative.items() if le != "+Inf"}
    return out
