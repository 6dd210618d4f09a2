"""The consumer's own statistics (librdkafka's ``statistics.interval.ms``, served on the poll thread) as metrics:
the lag of each assigned input partition and the records fetched ahead of the worker.

Lag is librdkafka's ``consumer_lag``: the partition's end offset (its last stable offset under
``read_committed``) minus the group's committed offset. The worker commits only what the broker acknowledged,
so the lag counts every record whose prediction is not yet safely out. A partition with no committed offset
yet, or none known, is left out rather than shown as 0. Figures older than three statistics intervals are
dropped, so a consumer that stopped reporting shows no lag rather than a stale one (its liveness probe fails
first: the poll loop serves the statistics)."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)


class ConsumerStats(Collector):
    """``stats_cb`` for the consumer; a Prometheus collector of what the last statistics said."""

    def __init__(self, topic: str, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._topic = topic
        self._max_age_s = 3 * interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._at: float | None = None
        self._lag: dict[int, int] = {}
        self._prefetched = 0

    def on_stats(self, raw: str) -> None:
        try:
            stats = json.loads(raw)
            partitions = stats.get("topics", {}).get(self._topic, {}).get("partitions", {})
            lag: dict[int, int] = {}
            prefetched = 0
            for p in partitions.values():
                pid = int(p.get("partition", -1))
                if pid < 0 or p.get("fetch_state") in (None, "none", "stopped", "stopping"):
                    continue  # librdkafka's unassigned placeholder, or a partition this consumer does not fetch
                prefetched += max(0, int(p.get("fetchq_cnt", 0)))
                if int(p.get("consumer_lag", -1)) >= 0:
                    lag[pid] = int(p["consumer_lag"])
        except (ValueError, TypeError, AttributeError) as exc:
            log.debug("unreadable consumer statistics: %s", exc)
            return
        with self._lock:
            self._at, self._lag, self._prefetched = self._clock(), lag, prefetched

    def lag(self) -> dict[int, int] | None:
        """Lag per assigned partition from the latest statistics; None when there are none recent enough."""
        with self._lock:
            if self._at is None or self._clock() - self._at > self._max_age_s:
                return None
            return dict(self._lag)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            fresh = self._at is not None and self._clock() - self._at <= self._max_age_s
            lag, prefetched = dict(self._lag), self._prefetched
        family = GaugeMetricFamily(
            "stream_consumer_lag_records",
            "Records of each assigned input partition past the group's committed offset (end offset, or last "
            "stable offset under read_committed, minus committed), from the consumer's statistics.",
            labels=["topic", "partition"])
        ahead = GaugeMetricFamily("stream_prefetched_records",
                                  "Records the consumer fetched that the worker has not taken yet.")
        if fresh:
            for pid in sorted(lag):
                family.add_metric([self._topic, str(pid)], lag[pid])
            ahead.add_metric([], prefetched)
        yield family
        yield ahead

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("stream_consumer_lag_records", "", labels=["topic", "partition"])
        yield GaugeMetricFamily("stream_prefetched_records", "")
