"""The poll thread's and the delivery reports' side of a batch: records taken become the open batch, the open batch
becomes one span per partition handed to the stages, and a span whose records were all acknowledged is counted.

- `Spans.accept`: drops records of partitions no longer assigned (taken as their partition was being revoked:
  the next owner has them) and records taken a second time in one assignment (the consumer can hand a range over
  twice after a seek), then adds the rest to the open batch;
- `Spans.close_batch`: takes the open batch (at most ``max_batch_size`` records; the rest stays open), registers
  its per-partition spans with the offset tracker and the committer, and returns the `Dispatched` batch;
- `Delivered.done`: a span's delivery report (every prediction or dead letter of it acknowledged), into the summary
  and the metrics (it exists before the publisher, whose ``on_span_done`` it is).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from stream.kafka.delivery import SpanDelivery
from stream.kafka.offsets import OffsetTracker, fmt_partitions
from stream.kafka.publish import Headers, Publisher
from stream.kafka.records import Records
from stream.kafka.replies import record_times
from stream.ops.metrics import StreamMetrics
from stream.ops.summary import WorkerSummary
from stream.ops.tracing import BatchTraces
from stream.pipeline import faults
from stream.pipeline.batching import MicroBatcher
from stream.pipeline.committer import CommitLedger
from stream.pipeline.processing import Begun, DeadRecord, Dispatched
from stream.pipeline.transactions import Transactions

log = logging.getLogger(__name__)


class Spans:
    def __init__(self, topic: str, consumer: Any, publisher: Publisher, batcher: MicroBatcher[Records],
                 tracker: OffsetTracker, ledger: CommitLedger, transactions: Transactions, summary: WorkerSummary,
                 metrics: StreamMetrics, *, exactly_once: bool, tokens: Callable[[Records], np.ndarray] | None = None,
                 traces: BatchTraces | None = None) -> None:
        """``tokens``: each record's most tokens, when the batcher closes batches on a token budget; ``traces``:
        tracing's side (`stream.ops.tracing`), when it is on."""
        self.topic = topic
        self.consumer, self.publisher = consumer, publisher
        self._batcher, self._tracker, self._ledger = batcher, tracker, ledger
        self._transactions, self._summary, self._metrics = transactions, summary, metrics
        self._exactly_once = exactly_once
        self._tokens = tokens
        self.traces = traces

    def accept(self, records: Records) -> None:
        topic = self.topic
        foreign = [p for p in np.unique(records.partitions).tolist() if not self._tracker.is_assigned((topic, p))]
        if foreign:
            records = records.without_partitions(foreign)
            log.info("dropped records of partitions no longer assigned: %s",
                     fmt_partitions([(topic, p) for p in foreign]))
        keep = self._tracker.admit(topic, records.partitions, records.offsets)
        if keep is not None:
            twice = records.select(np.flatnonzero(~keep))
            records = records.select(np.flatnonzero(keep))
            log.warning("dropped %d records taken a second time from the consumer (partitions %s, offsets %d..%d): "
                        "already taken in this assignment", len(twice), sorted(set(twice.partitions.tolist())),
                        int(twice.offsets.min()), int(twice.offsets.max()))
        if not len(records):
            return
        if self._summary.first_consumed_at is None:
            self._summary.first_consumed_at = time.time()
        self._summary.consumed += len(records)
        self._metrics.consumed.inc(len(records))
        self._batcher.add([records])

    def close_batch(self) -> Dispatched:
        held = self._batcher.bytes  # the records' bytes (`Records.nbytes`), counted as they were added
        records = Records.concat(self._batcher.take())
        # At most max_batch_size (records can slip in while paused), the records within max_batch_bytes (their
        # values, keys and watched headers' values: `Records.sizes`) and, with a token budget, the texts within it
        # (at least one record: a token budget is at least one text's most); the rest, in order, opens the next
        # batch. Each part gets a buffer of its own where the one they share would keep much more alive than it
        # holds (`Records.compact`).
        fit = self._batcher.max_batch_size
        max_bytes = self._batcher.max_bytes
        if max_bytes is not None and held > max_bytes:
            within = int(np.searchsorted(np.cumsum(records.sizes()), max_bytes, side="right"))
            fit = min(fit, max(within, 1))
        budget = self._batcher.max_weight
        if budget is not None and self._tokens is not None:
            within = int(np.searchsorted(np.cumsum(self._tokens(records)), budget, side="right"))
            fit = min(fit, max(within, 1))
        if len(records) > fit:
            records, rest = records.split(fit)
            records = records.compact()
            self._batcher.add([rest.compact()])
        partitions, offsets = records.partitions, records.offsets
        deliveries = {}
        for p in np.unique(partitions).tolist():
            rows = np.flatnonzero(partitions == p)
            first, last = int(offsets[rows[0]]), int(offsets[rows[-1]])
            self._ledger.start_at((self.topic, p), first)
            deliveries[p] = SpanDelivery(self.publisher, self._tracker.dispatch((self.topic, p), first, last,
                                                                                len(rows)))
        self._summary.batches += 1
        self._summary.batched_records += len(records)
        self._metrics.batches.inc()
        self._metrics.batch_size.observe(len(records))
        metadata = self.consumer.consumer_group_metadata() if self._exactly_once else None
        return Dispatched(records, partitions, offsets, deliveries, self._transactions.epoch, metadata,
                          closed_ns=time.time_ns())

    def trace(self, begun: Begun, carried: dict[int, Headers], dead: list[DeadRecord]) -> None:
        """The tracing spans of the batch's records that carry a trace context (``carried``: row -> its carried
        headers), each handed to its span's delivery, which `done` ends once acknowledged."""
        assert self.traces is not None
        batch = begun.batch
        watched = batch.records.replies or {}
        traces = self.traces.start(
            carried, {row: record_times(watched[row]) for row in carried if row in watched},
            batch.partitions.tolist(), batch.offsets.tolist(), batch_size=len(batch.records),
            closed_ns=batch.closed_ns or time.time_ns(), submitted_ns=begun.submitted_ns,
            inferred_ns=time.time_ns(), dead={d.index: d.stage for d in dead})
        for row, trace in traces.items():
            delivery = batch.deliveries[int(batch.partitions[row])]
            if delivery.traced is None:
                delivery.traced = []
            delivery.traced.append(trace)


class Delivered:
    def __init__(self, summary: WorkerSummary, metrics: StreamMetrics, traces: BatchTraces | None = None) -> None:
        self._summary, self._metrics, self.traces = summary, metrics, traces

    def done(self, delivery: SpanDelivery) -> None:
        faults.reach("after-delivery")
        n = delivery.span.count - delivery.dead
        if delivery.traced and self.traces is not None:
            self.traces.published(delivery.traced)
        self._summary.predicted += n
        self._summary.dead_lettered += delivery.dead
        self._metrics.predicted.inc(n)
        if delivery.ts_ms is not None and len(delivery.ts_ms):
            now_ms = time.time() * 1000.0
            self._metrics.e2e_latency_seconds.observe_many((now_ms - delivery.ts_ms) / 1000.0)
