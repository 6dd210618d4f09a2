"""Prometheus metrics for the worker, built against an injected registry (no global state).

Histograms that are fed a whole batch at a time use `BulkHistogram`, which bins a numpy array in
one call instead of one Python call per record.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
                     0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
INFERENCE_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                       1.0, 2.5, 5.0, 10.0)
BATCH_SIZE_BUCKETS = tuple(float(2**i) for i in range(17))
COMMIT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


# From 0: Prometheus's histograms carry no _sum (and so no mean) when a bucket bound is negative; a negative
# value counts in the first bucket.
VALUE_BUCKETS = (0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99,
                 1.0, 10.0, 100.0, 1000.0)


class BulkHistogram(Collector):
    """A histogram that accepts arrays: ``observe_many`` costs one numpy call per batch."""

    def __init__(self, name: str, documentation: str, buckets: Sequence[float],
                 registry: CollectorRegistry) -> None:
        self._name = name
        self._doc = documentation
        self._bounds = np.asarray(sorted(buckets), dtype=np.float64)
        self._counts = np.zeros(len(self._bounds) + 1, dtype=np.int64)  # last slot: +Inf
        self._sum = 0.0
        self._lock = threading.Lock()
        registry.register(self)

    def observe(self, value: float) -> None:
        self.observe_many(np.asarray([value], dtype=np.float64))

    def observe_many(self, values: np.ndarray) -> None:
        if len(values) == 0:
            return
        # Bucket i counts values <= bounds[i] (Prometheus "le" semantics).
        slots = np.searchsorted(self._bounds, values, side="left")
        binned = np.bincount(slots, minlength=len(self._counts))
        total = float(np.sum(values))
        with self._lock:
            self._counts += binned
            self._sum += total

    def snapshot(self) -> tuple[np.ndarray, float]:
        with self._lock:
            return self._counts.copy(), self._sum

    def collect(self) -> Iterator[HistogramMetricFamily]:
        counts, total = self.snapshot()
        cumulative = np.cumsum(counts)
        buckets: list[tuple[str, Any]] = [
            (_le(b), int(c)) for b, c in zip(self._bounds.tolist(), cumulative[:-1].tolist(), strict=True)
        ]
        buckets.append(("+Inf", int(cumulative[-1])))
        family = HistogramMetricFamily(self._name, self._doc, buckets=buckets, sum_value=total)
        yield family

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self._name, self._doc)


def _le(bound: float) -> str:
    return repr(float(bound))


class StreamMetrics:
    """Every metric the worker exports. Names use base units and ``_total`` for counters."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.consumed = Counter("stream_records_consumed", "Input records returned by the consumer.",
                                registry=r)
        self.predicted = Counter("stream_predictions", "Predictions acknowledged by the broker.", registry=r)
        self.committed = Counter(
            "stream_offsets_committed",
            "Input offsets covered by successful commits (sum of commit-position advances).", registry=r)
        self.batches = Counter("stream_batches", "Micro-batches dispatched to the model.", registry=r)
        self.dead_letters = Counter("stream_dead_letters", "Records sent to the dead-letter topic.",
                                    ["stage", "reason"], registry=r)
        self.replies = Counter(
            "stream_replies", "Reply copies for callers that wait (the gateway), by outcome: sent (handed to the "
            "producer; acknowledged before its input offset commits) or refused (an address naming a topic not "
            "in --reply-topics, a partition the topic lacks, or malformed).", ["outcome"], registry=r)
        self.transactions_aborted = Counter("stream_transactions_aborted", "Exactly-once: aborted transactions.",
                                            registry=r)
        self.transaction_batches = Histogram(
            "stream_transaction_batches", "Exactly-once: micro-batches per committed transaction.",
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64), registry=r)
        self.model_retries = Counter("stream_model_retries", "Batch retries after a model error.", registry=r)
        self.oom_splits = Counter("stream_model_oom_splits",
                                  "Batches split in two after the device ran out of memory on them.", registry=r)
        self.inputs_truncated = Counter("stream_inputs_truncated",
                                        "Inputs the model cut to fit (texts over --max-tokens).", registry=r)
        self.model_info = Info("stream_model", "The model this worker serves (name, version, device) and the "
                               "schemas it reads and writes.", registry=r)
        self.registry_retries = Counter(
            "stream_schema_registry_retries",
            "Decodes of a batch retried because the schema registry could not be reached.", registry=r)
        self.commit_failures = Counter("stream_commit_failures", "Offset commits the broker rejected.",
                                       registry=r)
        self.assigned_partitions = Gauge("stream_assigned_partitions", "Input partitions assigned now.",
                                         registry=r)
        self.paused_partitions = Gauge("stream_paused_partitions",
                                       "Input partitions paused because the model's queue is full.", registry=r)
        self.stalled_partitions = Gauge(
            "stream_stalled_partitions",
            "Assigned input partitions with records waiting and no committed progress for --stall-timeout-s.",
            registry=r)
        self.stopped_on_purpose = Gauge(
            "stream_stopped_on_purpose_partitions",
            "Assigned input partitions where the group's last run stopped on purpose (the dead-letter breaker, a bad "
            "record and no dead-letter topic) and this worker has not committed past that position yet.", registry=r)
        self.in_flight = Gauge("stream_records_in_flight", "Records dispatched and not yet acknowledged.",
                               registry=r)
        self.open_batch = Gauge("stream_open_batch_records", "Records in the micro-batch being filled.", registry=r)
        self.queued_batches = Gauge("stream_queued_batches",
                                    "Closed micro-batches waiting for a prepare thread (the first stage).", registry=r)
        self.stage_busy_seconds = Counter(
            "stream_stage_busy_seconds", "Seconds each stage's threads spent working on batches: prepare (decode, "
            "the model's host-side prepare), device (collate, copy, submit; on the CPU the forward pass), finish "
            "(outputs, encode, publish, delivery reports; not its waits for the device). Over "
            "stream_stage_threads, the share of the stage's capacity in use: the stage nearest 1 binds.",
            ["stage"], registry=r)
        self.stage_cpu_seconds = Counter(
            "stream_stage_cpu_seconds", "CPU seconds each stage's own threads used over the spans counted in "
            "stream_stage_busy_seconds. Busy minus CPU is time a working thread waited: for the GIL, which another "
            "of the worker's threads held, or for a core, or for threads it handed work to (torch's intra-op threads "
            "on the CPU: their time is not counted here).", ["stage"], registry=r)
        self.stage_threads = Gauge("stream_stage_threads", "Threads of each stage (prepare: --prepare-threads).",
                                   ["stage"], registry=r)
        self.stage_queue_batches = Gauge(
            "stream_stage_queue_batches", "Batches waiting for each stage: for a prepare thread, prepared and "
            "waiting for the device thread, submitted and waiting for the finish thread.", ["stage"], registry=r)
        self.rebalances = Counter("stream_rebalances", "Rebalance callbacks by kind: partitions assigned, revoked "
                                  "(handed over in order) or lost (taken away, the session expired).", ["kind"],
                                  registry=r)
        self.commit_seconds = Histogram(
            "stream_commit_seconds", "Offset commits, request to the broker's answer: async and sync commits, or "
            "exactly-once's transaction commit (offsets and outputs).", ["mode"], buckets=COMMIT_BUCKETS_S,
            registry=r)
        self.last_commit = Gauge("stream_last_commit_timestamp_seconds",
                                 "Unix time of the last commit that advanced a position (the worker's start "
                                 "until one does).", registry=r)
        self.last_commit.set_to_current_time()
        self.batch_size = BulkHistogram("stream_batch_size_records", "Records per micro-batch.",
                                        BATCH_SIZE_BUCKETS, r)
        self.inference_seconds = BulkHistogram("stream_inference_seconds",
                                               "Model time per micro-batch: submit (collate + forward) to the end of "
                                               "the forward pass; on CUDA it includes waiting behind the batches "
                                               "ahead on the device.",
                                               INFERENCE_BUCKETS_S, r)
        self.queue_wait_seconds = BulkHistogram(
            "stream_queue_wait_seconds",
            "How long a closed micro-batch waited for a prepare thread (the stages busy with earlier ones).",
            INFERENCE_BUCKETS_S, r)
        self.e2e_latency_seconds = BulkHistogram(
            "stream_end_to_end_latency_seconds",
            "Event ts_ms (producer time) to the broker's acknowledgement of its prediction.",
            LATENCY_BUCKETS_S, r)

        self.prediction_values = PredictionValues(r)

    def watch_cuda_memory(self, device: Any) -> None:
        """``stream_gpu_memory_bytes{kind}`` for a CUDA device: what torch's allocator holds for tensors
        (allocated), what it has reserved from the driver (reserved) and the device's total, read at scrape."""
        import torch

        gauge = Gauge("stream_gpu_memory_bytes", "CUDA memory of the model's device: allocated by tensors, "
                      "reserved by torch's caching allocator, and the device's total.", ["kind"],
                      registry=self.registry)
        gauge.labels("allocated").set_function(lambda: torch.cuda.memory_allocated(device))
        gauge.labels("reserved").set_function(lambda: torch.cuda.memory_reserved(device))
        gauge.labels("total").set(torch.cuda.get_device_properties(device).total_memory)


class PredictionValues(Collector):
    """``stream_prediction_value{output}``: the distribution of each scalar output the worker publishes (a score,
    a flag as 0/1), so that two model versions can be compared side by side: its mean is ``_sum / _count``, its
    quantiles ``histogram_quantile``. Fed a batch's column at a time."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._bounds = np.asarray(VALUE_BUCKETS, dtype=np.float64)
        self._by_output: dict[str, tuple[np.ndarray, list[float]]] = {}  # output -> (counts, [sum])
        self._lock = threading.Lock()
        registry.register(self)

    def observe_many(self, output: str, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.float64)
        values = values[np.isfinite(values)]
        if not len(values):
            return
        binned = np.bincount(np.searchsorted(self._bounds, values, side="left"), minlength=len(self._bounds) + 1)
        total = float(values.sum())
        with self._lock:
            counts, sums = self._by_output.setdefault(output, (np.zeros(len(self._bounds) + 1, np.int64), [0.0]))
            counts += binned
            sums[0] += total

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily("stream_prediction_value", "Each scalar model output's published values "
                                       "(booleans as 0/1), for comparing model versions.", labels=["output"])
        with self._lock:
            snapshot = [(o, c.copy(), s[0]) for o, (c, s) in self._by_output.items()]
        for output, counts, total in sorted(snapshot):
            cumulative = np.cumsum(counts)
            buckets: list[tuple[str, Any]] = [(_le(b), int(c)) for b, c in
                                              zip(self._bounds.tolist(), cumulative[:-1].tolist(), strict=True)]
            buckets.append(("+Inf", int(cumulative[-1])))
            family.add_metric([output], buckets, total)
        yield family
