"""The orchestrator: one poll thread owns the consumer; a processing thread runs decode -> model ->
encode -> produce; the delivery reports it serves turn acknowledgements into commit positions.

    poll thread:  consume (Records: in C where built) -> MicroBatcher -> dispatch (spans in OffsetTracker)
                  -> bounded queue
                  commits (async on a timer, sync on revoke and shutdown); pauses input when the queue is full
    processor:    decode batch -> one forward pass -> encode batch -> produce (keys kept)
                  then, and while idle, serves delivery reports: SpanDelivery acks -> commit positions advance
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import torch
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from stream import faults, native
from stream.batching import MicroBatcher
from stream.codec.decoder import ColumnDecoder
from stream.codec.encoder import OutputEncoder, derive_schema, parse_copy_fields
from stream.codec.plan import ColumnSpec
from stream.codec.registry import (
    FolderRegistry,
    RegistryUnavailable,
    SchemaSource,
    WriterSchema,
    full_name,
    open_source,
    reader_schema,
    subject_name,
)
from stream.config import WorkerSettings
from stream.errors import ConfigError, KafkaClientError, StreamError, TransactionError
from stream.inference import InferenceEngine, ModelHandler, create_handler, select_device
from stream.inputs import InputBinder, input_side, parse_input_map
from stream.metrics import StreamMetrics
from stream.offsets import OffsetTracker
from stream.processing import Abandoned, BatchProcessor, Begun, Dispatched, ProcessingPolicy
from stream.publish import Publisher, SpanDelivery
from stream.records import Records
from stream.stalls import StallDetector
from stream.topics import create_topics, end_offsets, partitions_of

log = logging.getLogger(__name__)
_IDLE_POLL_S = 0.1
_STALL_STEP_S = 0.05
_REBALANCE_ERRORS = frozenset({KafkaError.ILLEGAL_GENERATION, KafkaError.REBALANCE_IN_PROGRESS,
                               KafkaError.UNKNOWN_MEMBER_ID})
_NOT_FETCHING = frozenset({KafkaError._STATE, KafkaError._PREV_IN_PROGRESS})  # what seek() says of such a partition
_PAUSE_AFTER_S = 1.0
_GC_THRESHOLD = 50_000  # young-generation threshold of the cycle collector while the worker runs (see run)
_ASYNC_COMMIT_PATIENCE_S = 30.0  # then send the next asynchronous commit even if the last one got no answer
_GAUGE_EVERY_S = 0.1
_SERVE_EVERY_S = 0.002  # an idle processor serves delivery reports this often
_SEND_WINDOW_S = 0.001  # how long a processor that runs out of work flushes the batch it just produced
_IDLE_CHECK_S = 0.001  # adaptive batching: how often a waiting poll thread checks whether the model went idle
_SERVE_CONSUMER_S = 0.1  # native input: the consumer's own queue is served at least this often (and when it has ops)
_STALL_QUERY_TIMEOUT_S = 2.0  # stall check: longest wait for the end and committed offsets of idle partitions
_REWIND_QUERY_TIMEOUT_S = 2.0  # exactly-once rewind: longest wait for committed offsets before trying again


@dataclass
class WorkerSummary:
    consumed: int = 0
    predicted: int = 0
    dead_lettered: int = 0
    committed: int = 0
    batches: int = 0
    batched_records: int = 0
    error: str | None = None
    exit_code: int = 0
    first_consumed_at: float | None = None  # wall-clock seconds
    last_committed_at: float | None = None  # wall-clock seconds, last commit that advanced a position

    @property
    def mean_batch_size(self) -> float:
        return self.batched_records / self.batches if self.batches else 0.0

    def line(self) -> str:
        return (f"consumed={self.consumed} predicted={self.predicted} dead_lettered={self.dead_lettered} "
                f"committed={self.committed} "
                f"batches={self.batches} mean_batch_size={self.mean_batch_size:.1f}"
                + (f" error={self.error!r}" if self.error else ""))


def build_codecs(settings: WorkerSettings, handler: ModelHandler,
                 ) -> tuple[ColumnDecoder, InputBinder, OutputEncoder, str | None]:
    """Both schemas, checked against the model at start-up (ConfigError, one line per mismatch; a registry that
    cannot be reached, too): the input decoder and binder, the prediction encoder (its schema registered under the
    output subject), and the input field holding each event's time (the one copied as ``event_ts_ms``), if any."""
    source = open_source(settings.schema_registry_url, settings.schemas_dir)
    try:
        default = f"{settings.input_topic}-value" if settings.schema_registry_url else getattr(
            handler, "input_schema", None)
        reader = reader_schema(source, settings.input_schema, default)
        copies = (parse_copy_fields(settings.copy_fields) if settings.copy_fields is not None
                  else list(getattr(handler, "copy_fields", ())))
        decoder, binder = input_side(handler, source, reader, parse_input_map(settings.input_map), copies)
        by_path = {c.path: c for c in decoder.columns}
        copied = [(name, by_path[path]) for name, path in copies]
        writer = _output_schema(settings, handler, source, copied)
    except RegistryUnavailable as exc:
        raise ConfigError(f"the schema registry cannot be reached at start-up: {exc}") from None
    encoder = OutputEncoder(writer, copied, handler.outputs)
    log.info("writing predictions as %s (id %d) to %s", writer.name, writer.schema_id, settings.output_topic)
    return decoder, binder, encoder, dict(copies).get("event_ts_ms")


def _output_schema(settings: WorkerSettings, handler: ModelHandler, source: SchemaSource,
                   copied: list[tuple[str, ColumnSpec]]) -> WriterSchema:
    given = settings.output_schema
    if given and not given.endswith(".avsc"):
        return source.latest(given)  # registered already: a subject, or a record name in the folder
    if given:
        try:
            raw = json.loads(Path(given).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--output-schema {given}: {exc}") from exc
    elif getattr(handler, "output_schema", None):  # the model's own, from the schema folder
        raw = FolderRegistry.from_dir(settings.schemas_dir).latest(handler.output_schema).raw  # type: ignore[attr-defined]
    else:
        raw = derive_schema(f"{handler.name}_prediction", "stream.predictions", copied, handler.outputs)
    subject = subject_name(settings.subject_name_strategy, settings.output_topic, full_name(raw))
    return source.register(subject, raw)


class Worker:
    def __init__(
        self,
        settings: WorkerSettings,
        *,
        handler: ModelHandler | None = None,
        metrics: StreamMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.metrics = metrics if metrics is not None else StreamMetrics()
        self._clock = clock
        # Intra-op threads for CPU inference: the pipeline's own threads need the other cores.
        torch.set_num_threads(settings.torch_threads)
        handler = handler if handler is not None else create_handler(settings.model, settings.model_dir)
        self._engine = InferenceEngine(handler, select_device(settings.device))
        self._decoder, self._binder, self._encoder, self._event_time_field = build_codecs(settings, handler)
        self.metrics.model_info.info({
            "name": handler.name, "version": handler.version, "device": str(self._engine.device),
            "input_schema": f"{self._decoder.reader.name}:{self._decoder.reader.schema_id}",
            "output_schema": f"{self._encoder.schema.name}:{self._encoder.schema.schema_id}"})
        self._consumer_config = settings.consumer_config()
        self._producer_config = settings.producer_config()
        self._batcher: MicroBatcher[Records] = MicroBatcher(settings.max_batch_size, settings.max_wait_ms, clock,
                                                            size=len)
        self._tracker = OffsetTracker()
        self._stalls = StallDetector(settings.stall_timeout_s, clock)
        # Batches waiting for the processor: at most max_inflight_batches (slots), plus room for the sentinel.
        self._slots = threading.BoundedSemaphore(settings.max_inflight_batches)
        self._queue: queue.Queue[Dispatched | None] = queue.Queue(maxsize=settings.max_inflight_batches + 1)
        self._stop = threading.Event()
        self._failure: BaseException | None = None
        self._failure_lock = threading.Lock()
        self._summary = WorkerSummary()
        self._paused = False
        self._processing = False  # written by the processor thread only
        self._committed_positions: dict[tuple[str, int], int] = {}
        self._async_commit_sent_at: float | None = None  # an asynchronous commit waits for its answer
        self._consumer: Consumer | None = None
        self._input: native.NativeInput | None = None  # input records taken in C (else consumer.consume)
        self._serve_consumer_at = 0.0  # native input: when the consumer's own queue is next served
        self._publisher: Publisher | None = None
        self._processor: BatchProcessor | None = None
        self._end_offsets: dict[int, int] | None = None
        self._epoch = 0  # exactly-once: bumped by each rewind
        self._rewind_after: int | None = None  # exactly-once: epoch whose batches the processor abandoned
        self._rewind_warned: int | None = None  # the pending rewind whose slow offset read was logged
        self._next_drain_check = 0.0
        # torch, the model and the clients are loaded: move those objects out of the collector's reach, so a
        # full collection walks only what the pipeline allocates (they took tens of ms with torch's objects in).
        gc.collect()
        gc.freeze()

    # ---------------------------------------------------------------------------- public
    def request_stop(self) -> None:
        """Stop fetching, finish and publish what is in flight, commit, exit (safe from a signal handler)."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        def handle(signum: int, _frame: FrameType | None) -> None:
            log.info("signal %s: finishing in-flight work and stopping", signal.Signals(signum).name)
            self.request_stop()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def run(self) -> WorkerSummary:
        # The processing thread holds the GIL for most of its work; the poll thread (fetching, dispatching)
        # waits for it. Python lets a holder keep it for 5 ms once another thread asks; at 1 ms the poll thread
        # kept up with it and 1 M-event drains on Kafka averaged ~6 % faster (interleaved runs, when a third
        # thread served delivery reports). Process-wide, so restored when the worker returns.
        previous = sys.getswitchinterval()
        sys.setswitchinterval(self.settings.gil_switch_interval_ms / 1000.0)
        # Every consumed record is a `Message`, an object the cycle collector tracks: at the default threshold
        # (700) it ran ~1,100 young collections per million records, each walking the records still held in
        # batches, with the GIL held (py-spy at 227,000 events/s: a quarter of the poll thread's samples).
        # Records are freed by reference counting; a collection every 50,000 tracked allocations still bounds
        # cyclic garbage. consume() alone, 1 M records held 5 batches deep: 0.71-0.79 -> 0.59-0.68 us a record.
        previous_gc = gc.get_threshold()
        gc.set_threshold(_GC_THRESHOLD, *previous_gc[1:])
        try:
            return self._run()
        finally:
            sys.setswitchinterval(previous)
            gc.set_threshold(*previous_gc)

    def _run(self) -> WorkerSummary:
        s = self.settings
        if s.dlq_topic:
            status = create_topics(s.bootstrap_servers, [s.dlq_topic],
                                   len(partitions_of(s.bootstrap_servers, s.input_topic)))
            log.info("dead-letter topic %s: %s", s.dlq_topic, status[s.dlq_topic])
        self._publisher = Publisher(self._producer_config, on_span_done=self._on_span_done,
                                    native_topic=self._native_topic())
        policy = ProcessingPolicy(s.input_topic, s.output_topic, s.dlq_topic, s.max_input_bytes, s.model_retries,
                                  s.retry_backoff_ms, s.dlq_max_fraction, s.dlq_window, s.provenance_headers,
                                  event_time_field=self._event_time_field)
        self._processor = BatchProcessor(policy, self._engine, self._decoder, self._binder, self._encoder,
                                         self._publisher, self.metrics, stopping=self._stop.is_set)
        self._consumer = Consumer({**self._consumer_config, "on_commit": self._on_commit,
                                   "error_cb": self._on_consumer_error})
        self._input = self._native_input(self._consumer)
        processor = threading.Thread(target=self._process_loop, name="processor", daemon=True)
        processor.start()
        metrics_server = self.metrics.serve(s.metrics_port, s.metrics_host) if s.metrics_port is not None else None
        try:
            if s.exactly_once:
                self._publisher.init_transactions(self._txn_timeout_s())
            if s.stop_at_end:
                self._end_offsets = self._read_end_offsets()
            if self._stop.is_set():
                return self._finish(processor, metrics_server)  # stopped during start-up: never join the group
            self._consumer.subscribe([s.input_topic], on_assign=self._on_assign, on_revoke=self._on_revoke,
                                     on_lost=self._on_lost)
            log.info("worker consuming %s -> %s as group %s (max_batch_size=%d, max_wait_ms=%g)",
                     s.input_topic, s.output_topic, s.group_id, s.max_batch_size, s.max_wait_ms)
            self._poll_loop()
        except BaseException as exc:  # keep going to the orderly shutdown below, then report
            self._fail(exc)
        return self._finish(processor, metrics_server)

    def _native_topic(self) -> str | None:
        """The output topic, when its predictions go through the C producer (stream.native); logs the choice."""
        s = self.settings
        why_not = None
        if not s.native_producer:
            why_not = "--no-native-producer"
        elif s.exactly_once:
            why_not = "exactly-once (transactions need confluent-kafka's producer)"
        elif s.provenance_headers or not self._encoder.carries_source:
            why_not = "provenance headers"
        else:
            why_not = native.unavailable()
        if why_not is not None:
            log.info("predictions published through confluent-kafka (native producer off: %s)", why_not)
            return None
        log.info("predictions published through the native producer (stream._nativeproduce)")
        return s.output_topic

    def _native_input(self, consumer: Consumer) -> native.NativeInput | None:
        """The C consumer for input records (stream.native.NativeInput), when it can be used; logs the choice."""
        s = self.settings
        why_not = None
        if not s.native_consumer:
            why_not = "--no-native-consumer"
        elif s.exactly_once:
            why_not = "exactly-once (its rewinds are tested with confluent-kafka's consume)"
        else:
            why_not = native.unavailable()
        if why_not is None:
            try:
                source = native.NativeInput(consumer, s.input_topic)
            except (RuntimeError, TypeError, ValueError) as exc:
                why_not = str(exc)
            else:
                log.info("input records taken through the native consumer (stream._nativeproduce)")
                return source
        log.info("input records taken through confluent-kafka (native consumer off: %s)", why_not)
        return None

    def _finish(self, processor: threading.Thread, metrics_server: Any) -> WorkerSummary:
        self._shutdown(processor)
        if metrics_server is not None:
            metrics_server.shutdown()
        summary = self._summary
        if self._failure is not None:
            summary.error = f"{type(self._failure).__name__}: {self._failure}"
            summary.exit_code = 1
        log.info("shutdown summary: %s", summary.line())
        return summary

    # ---------------------------------------------------------------------------- poll thread
    def _poll_loop(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        batcher = self._batcher
        commit_every_s = self.settings.commit_interval_ms / 1000.0
        next_commit = self._clock() + commit_every_s
        next_gauge = 0.0
        stalled_since: float | None = None
        adaptive = self.settings.batch_policy == "adaptive"
        close_early = False
        while not self._stop.is_set() and self._failure_now() is None:
            records: Records | None = None
            close_now = close_early and len(batcher) > 0  # a revoke may have emptied the batch meanwhile
            close_early = False
            ready = close_now or batcher.ready()
            if not ready:
                stalled_since = None
                if self._paused:
                    # Input is paused only while a closed batch waits for the processor. A revoke, a lost
                    # assignment or an exactly-once rewind can empty that batch: then nothing would ever be
                    # dispatched (and resume) again, and the partitions would stay paused for good.
                    self._set_paused(False)
            if ready:
                if self._try_dispatch(wait_s=0.0 if self._paused else _STALL_STEP_S):
                    stalled_since = None
                else:
                    # Queue full. Pausing restarts fetching on resume, so only pause on a sustained stall;
                    # until then the short blocking put keeps consume() calls (membership) frequent enough.
                    now = self._clock()
                    stalled_since = now if stalled_since is None else stalled_since
                    if self._paused:
                        records = self._take(1, _STALL_STEP_S)  # serves rebalances, heartbeats
                    elif now - stalled_since >= _PAUSE_AFTER_S:
                        self._set_paused(True)
            elif len(batcher) == 0:
                # Empty batch: take one record as soon as it arrives, so its wait is timed from arrival.
                records = self._take(1, _IDLE_POLL_S)
            elif adaptive and self._model_idle():
                # The model has nothing to do: waiting for more records only adds latency. Take what is
                # already fetched; if that does not fill the batch, hand it over now. Under load the model is
                # busy, so records pile up while it works and batches grow on their own.
                room = batcher.room
                records = self._take(room, 0)
                close_early = len(records) < room
            else:
                wait_s = batcher.time_left() or 0.0
                if adaptive:
                    wait_s = min(wait_s, _IDLE_CHECK_S)  # look again soon: the model may be idle by then
                records = self._take(max(batcher.room, 1), wait_s)
            if records is not None and len(records):
                faults.reach("after-poll")
                self._accept(records)
            if self._rewind_pending():
                self._rewind()
            now = self._clock()
            if now >= next_commit and self._async_commit_due():
                self._commit(asynchronous=True)
                next_commit = now + commit_every_s
            if self._end_offsets is not None and self._drained():
                log.info("stop-at-end: every partition is committed up to its end offset at start")
                break
            if now >= next_gauge:
                self.metrics.in_flight.set(self._tracker.in_flight())
                next_gauge = now + _GAUGE_EVERY_S
            if self._stalls.due():
                self._check_stalls()

    def _take(self, n: int, timeout_s: float) -> Records:
        """Up to ``n`` consumed records, waiting up to ``timeout_s`` for them; serves the group meanwhile."""
        consumer = self._consumer
        assert consumer is not None
        source = self._input
        if source is None:
            return self._records_of(consumer.consume(n, timeout_s))
        now = self._clock()
        if now >= self._serve_consumer_at:
            # Rebalances (on_assign routes new partitions to the native queue before they are assigned),
            # commit results and client errors. Served before taking records, so records taken next are of
            # partitions assigned now.
            self._serve_consumer_at = now + _SERVE_CONSUMER_S
            if len(self._records_of(consumer.consume(100, 0))):
                raise StreamError("a record reached the consumer's own queue while the native consumer takes the "
                                  "input (a partition assigned without on_assign?)")
        records, errors, pending = source.consume(n, timeout_s)
        for _partition, _offset, code, text in errors:
            self._consume_error(KafkaError(code, text))
        if pending:
            self._serve_consumer_at = 0.0  # at the next call
        return records

    def _records_of(self, messages: list[Message]) -> Records:
        good = []
        for msg in messages:
            err = msg.error()
            if err is None:
                good.append(msg)
            else:
                self._consume_error(err)
        return Records.from_messages(good) if good else Records.empty()

    @staticmethod
    def _consume_error(err: KafkaError) -> None:
        if err.code() == KafkaError._PARTITION_EOF:
            return
        if err.fatal() or not err.retriable():
            raise KafkaClientError("consume", err)
        log.warning("consume: %s", err)

    def _accept(self, records: Records) -> None:
        topic = self.settings.input_topic
        present = np.unique(records.partitions).tolist()
        foreign = [p for p in present if not self._tracker.is_assigned((topic, p))]
        if foreign:
            # Taken as its partition was being revoked: the partition's next owner has it (nothing committed).
            records = records.without_partitions(foreign)
            log.info("dropped records of partitions no longer assigned: %s", _fmt([(topic, p) for p in foreign]))
        if not len(records):
            return
        if self._summary.first_consumed_at is None:
            self._summary.first_consumed_at = time.time()
        self._summary.consumed += len(records)
        self.metrics.consumed.inc(len(records))
        self._batcher.add([records])

    def _try_dispatch(self, wait_s: float) -> bool:
        """Hand the closed batch to the processor, waiting up to ``wait_s`` for queue space."""
        # A free slot is released by the processor as it takes a batch: block on it, never spin (a spinning
        # poll thread steals the GIL from the processor).
        acquired = self._slots.acquire(timeout=wait_s) if wait_s > 0 else self._slots.acquire(blocking=False)
        if not acquired:
            return False
        self._queue.put_nowait(self._close_batch())
        if self._paused:
            self._set_paused(False)
        return True

    def _model_idle(self) -> bool:
        """No batch queued for the processor and none being processed."""
        return not self._processing and self._queue.empty()

    def _close_batch(self) -> Dispatched:
        """Take the open batch and register its per-partition spans with the offset tracker."""
        records = Records.concat(self._batcher.take())
        if len(records) > self._batcher.max_batch_size:  # a record that slipped in while paused
            records, rest = records.split(self._batcher.max_batch_size)
            self._batcher.add([rest])
        partitions, offsets = records.partitions, records.offsets
        bounds: dict[int, tuple[int, int, int]] = {}  # partition -> (first offset, last offset, records)
        for p in np.unique(partitions).tolist():
            rows = np.flatnonzero(partitions == p)
            bounds[p] = (int(offsets[rows[0]]), int(offsets[rows[-1]]), len(rows))
        topic = self.settings.input_topic
        for p, (first, _, _) in bounds.items():
            # Base for the committed counter: the first offset this assignment dispatches.
            self._committed_positions.setdefault((topic, p), first)
        assert self._publisher is not None
        deliveries = {
            p: SpanDelivery(self._publisher, self._tracker.dispatch((topic, p), first, last, count))
            for p, (first, last, count) in bounds.items()
        }
        self._summary.batches += 1
        self._summary.batched_records += len(records)
        self.metrics.batches.inc()
        self.metrics.batch_size.observe(len(records))
        metadata = self._consumer.consumer_group_metadata() if self.settings.exactly_once and self._consumer else None
        return Dispatched(records, partitions, offsets, deliveries, self._epoch, metadata)

    def _set_paused(self, paused: bool) -> None:
        consumer = self._consumer
        assert consumer is not None
        assignment = consumer.assignment()
        if assignment:
            (consumer.pause if paused else consumer.resume)(assignment)
        self._paused = paused
        self.metrics.paused_partitions.set(len(assignment) if paused else 0)

    def _commit(self, *, asynchronous: bool, tps: list[tuple[str, int]] | None = None) -> bool:
        """Commit acknowledged positions. A synchronous commit also retakes positions that an asynchronous one
        holds without an answer yet. False when a rebalance deferred it (the positions are offered again)."""
        positions = self._tracker.committable(tps, unconfirmed=not asynchronous)
        if not positions:
            return True
        consumer = self._consumer
        assert consumer is not None
        offsets = [TopicPartition(t, p, off) for (t, p), off in positions.items()]
        if self.settings.exactly_once:
            self._record_commits(offsets)  # already committed inside their transactions
            return True
        if asynchronous:
            consumer.commit(offsets=offsets, asynchronous=True)
            self._async_commit_sent_at = time.monotonic()
            return True
        try:
            result = consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            self.metrics.commit_failures.inc()
            self._tracker.restore(positions)
            error = exc.args[0]
            if error.code() in _REBALANCE_ERRORS:
                # The group is rebalancing: the positions go out with the next commit, or the revoke's.
                log.info("commit deferred by a rebalance: %s", error)
                return False
            raise KafkaClientError("commit", error) from exc
        self._record_commits(result or offsets)
        return True

    def _commit_settled(self, deadline: float) -> None:
        """Shutdown's commit. A rebalance in progress fails it (librdkafka answers a commit sent during a
        cooperative rebalance once the generation moved on), so serve the group until the rebalance ends
        and commit again, up to the deadline; records fetched meanwhile are dropped, never dispatched."""
        consumer = self._consumer
        assert consumer is not None
        while not self._commit(asynchronous=False):
            if time.monotonic() >= deadline:
                log.error("the group was still rebalancing at the shutdown deadline: the last positions stay "
                          "uncommitted (their records will be processed again by the next owner)")
                return
            try:
                consumer.consume(100, min(0.1, max(deadline - time.monotonic(), 0.0)))
            except KafkaException as exc:
                log.error("the last positions stay uncommitted: the consumer failed while the group "
                          "rebalanced: %s", exc)
                return

    def _async_commit_due(self) -> bool:
        """One asynchronous commit at a time: during a rebalance librdkafka holds them until the generation
        moves on and then fails them all; one such commit is enough (its positions are offered again)."""
        sent = self._async_commit_sent_at
        return sent is None or time.monotonic() - sent > _ASYNC_COMMIT_PATIENCE_S

    def _on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        self._async_commit_sent_at = None
        if err is not None:
            # Offer the positions again; a later commit of a higher position supersedes them.
            self.metrics.commit_failures.inc()
            if err.code() in _REBALANCE_ERRORS:
                log.info("async commit deferred by a rebalance: %s", err)
            else:
                log.warning("async commit failed: %s", err)
            self._tracker.restore({(tp.topic, tp.partition): tp.offset for tp in partitions if tp.offset >= 0})
            return
        self._record_commits(partitions)

    def _record_commits(self, partitions: list[TopicPartition]) -> None:
        self._tracker.confirm({(tp.topic, tp.partition): tp.offset for tp in partitions
                               if tp.error is None and tp.offset >= 0})
        for tp in partitions:
            if tp.error is not None or tp.offset < 0:
                continue
            key = (tp.topic, tp.partition)
            before = self._committed_positions.get(key)
            if before is None or tp.offset > before:
                advanced = tp.offset - (before if before is not None else tp.offset)
                self._committed_positions[key] = tp.offset
                self._stalls.progressed(key)
                self._summary.committed += advanced
                self._summary.last_committed_at = time.time()
                self.metrics.committed.inc(advanced)

    # ---------------------------------------------------------------------------- rebalances
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = [(tp.topic, tp.partition) for tp in partitions]
        if self._input is not None:
            # Before confluent-kafka assigns them (after this callback): none of their records reach the
            # consumer's own queue.
            self._input.route([p for t, p in tps if t == self._input.topic])
        self._tracker.assign(tps)
        self._stalls.assign(tps)
        for tp in tps:
            # The committed counter's base is set by this assignment's first dispatched offset; no broker
            # round trip inside the rebalance callback.
            self._committed_positions.pop(tp, None)
        # librdkafka keeps a partition's pause flag across unassign and assign: a partition paused when it was
        # lost or revoked comes back paused, however long ago that was. Set the state explicitly, both ways
        # (resuming a partition that is not paused is a no-op there).
        if self._paused:
            consumer.pause(partitions)
            self.metrics.paused_partitions.inc(len(partitions))
        else:
            consumer.resume(partitions)
        self.metrics.assigned_partitions.set(len(self._tracker.assigned()))
        log.info("assigned %s", _fmt(tps))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Finish the revoked partitions' in-flight records, commit them synchronously, forget them."""
        tps = [(tp.topic, tp.partition) for tp in partitions]
        revoked = {p for _, p in tps}
        dropped = self._batcher.discard(lambda r: r.without_partitions(revoked))
        started = time.monotonic()
        deadline = started + self._revoke_budget_s()
        live = [tp for tp in tps if self._tracker.is_assigned(tp)]
        while (any(self._tracker.in_flight(tp) for tp in live) and time.monotonic() < deadline
               and self._failure_now() is None and not self._rewind_pending()):
            time.sleep(0.002)
        try:
            self._commit(asynchronous=False, tps=live)
        except KafkaClientError as exc:
            log.error("commit on revoke failed (the next owner re-processes from the last commit): %s", exc)
        unfinished = sum(self._tracker.in_flight(tp) for tp in live)
        if unfinished:
            why = "a transaction was aborted" if self._rewind_pending() else "the revoke's time was up"
            log.warning("revoke: %d records still unacknowledged after %.1fs (%s); not committed",
                        unfinished, time.monotonic() - started, why)
        self._tracker.forget(tps)
        self._stalls.forget(tps)
        self._forget_paused(partitions)
        self.metrics.assigned_partitions.set(len(self._tracker.assigned()))
        log.info("revoked %s (dropped %d unstarted records)", _fmt(tps), dropped)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Ownership already gone: commit nothing, drop state (their in-flight records may be repeated)."""
        tps = [(tp.topic, tp.partition) for tp in partitions]
        lost = {p for _, p in tps}
        self._batcher.discard(lambda r: r.without_partitions(lost))
        self._tracker.forget(tps)
        self._stalls.forget(tps)
        self._forget_paused(partitions)
        self.metrics.assigned_partitions.set(len(self._tracker.assigned()))
        log.warning("lost %s", _fmt(tps))

    def _forget_paused(self, partitions: list[TopicPartition]) -> None:
        if self._paused:
            self.metrics.paused_partitions.dec(len(partitions))

    def _revoke_budget_s(self) -> float:
        max_poll_ms = int(self._consumer_config.get("max.poll.interval.ms", 300_000))
        return min(max_poll_ms / 2000.0, self.settings.shutdown_timeout_s)

    # ---------------------------------------------------------------------------- processor thread
    def _process_loop(self) -> None:
        # OpenMP's thread count is per thread: set it where the model runs, or this thread would get a pool of
        # one thread per core, whose idle workers spin (measured: ~0.8 of a core at full load, on 2 cores).
        torch.set_num_threads(self.settings.torch_threads)
        processor, publisher = self._processor, self._publisher
        assert processor is not None and publisher is not None
        # On a GPU, keep one batch ahead: the next batch is decoded, copied and queued on the device while the
        # host waits for, encodes and publishes the one before. Exactly-once keeps one batch per transaction.
        pipelined = self._engine.asynchronous and self.settings.gpu_overlap and not self.settings.exactly_once
        ahead: Begun | None = None
        sent = False  # a batch was published since the processor last waited for work
        abandoned = False  # a batch was left undone while stopping (processing.Abandoned)
        while True:
            if ahead is None:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    if sent:
                        # Nothing next: make sure the last batch goes out now (Publisher.send_now). Still busy for
                        # the adaptive batch policy, so records arriving meanwhile join the next batch.
                        sent = False
                        self._serve(lambda: publisher.send_now(_SEND_WINDOW_S))
                        continue
                    self._processing = False
                    try:
                        item = self._queue.get(timeout=_SERVE_EVERY_S)
                    except queue.Empty:  # idle: acknowledge what was delivered meanwhile
                        self._serve(publisher.serve)
                        continue
            else:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:  # nothing to overlap with: finish the batch on the device now
                    self._complete(ahead)
                    ahead = None
                    continue
            if item is None:
                if ahead is not None:
                    self._complete(ahead)
                return
            self._processing = True
            sent = True
            self._slots.release()
            if self._failure_now() is not None:
                ahead = None
                continue  # drain without work: nothing after a failure may be published
            if abandoned:
                continue  # stopping, and an earlier batch was left undone: nothing after it may be committed
            if self._rewind_after is not None and item.epoch <= self._rewind_after:
                continue  # consumed before a rewind: it will be consumed again
            try:
                if self.settings.exactly_once:
                    self._process_in_transaction(item)
                elif pipelined:
                    begun = processor.begin(item)
                    if ahead is not None:
                        previous, ahead = ahead, None
                        self._complete(previous)
                    ahead = begun
                else:
                    processor.process(item)
                    faults.reach("after-produce")
            except Abandoned as exc:
                abandoned = True
                log.warning("%s: this batch and the ones after it are left uncommitted", exc)
            except BaseException as exc:
                self._fail(exc)

    def _serve(self, serve: Callable[[], None]) -> None:
        """Serve delivery reports; an exception from a callback fails the worker instead of the thread."""
        try:
            serve()
        except BaseException as exc:
            self._fail(exc)

    def _complete(self, begun: Begun) -> None:
        if self._failure_now() is not None:
            return  # nothing after a failure may be published
        assert self._processor is not None
        try:
            self._processor.complete(begun)
            faults.reach("after-produce")
        except BaseException as exc:
            self._fail(exc)

    def _process_in_transaction(self, batch: Dispatched) -> None:
        """One transaction: the batch's predictions and dead letters, plus its input offsets."""
        publisher, processor = self._publisher, self._processor
        assert publisher is not None and processor is not None
        timeout_s = self._txn_timeout_s()
        started = time.monotonic()
        publisher.begin_transaction()
        try:
            processor.process(batch)
            faults.reach("after-produce")
            topic = self.settings.input_topic
            offsets = [TopicPartition(topic, p, d.span.last + 1) for p, d in batch.deliveries.items()]
            faults.reach("in-transaction")
            publisher.commit_transaction(offsets, batch.group_metadata, timeout_s)
        except TransactionError as exc:
            elapsed = time.monotonic() - started
            if elapsed >= timeout_s:
                # Rewinding would replay the same batch into the same timeout, forever.
                raise StreamError(
                    f"a batch's transaction took {elapsed:.1f}s, longer than transaction.timeout.ms "
                    f"({timeout_s:.0f}s), and was aborted ({exc}); raise KAFKA_PRODUCER_TRANSACTION_TIMEOUT_MS "
                    "or lower --max-batch-size") from exc
            if exc.fatal or not exc.requires_abort:
                raise
            log.warning("transaction aborted, rewinding to the last committed offsets: %s", exc)
            publisher.abort_transaction(timeout_s)
            self.metrics.transactions_aborted.inc()
            self._rewind_after = batch.epoch
            return
        except BaseException:
            with contextlib.suppress(TransactionError):
                publisher.abort_transaction(timeout_s)
            raise
        elapsed = time.monotonic() - started
        if elapsed > timeout_s / 2:
            log.warning("a batch transaction took %.1fs, over half of transaction.timeout.ms (%.0fs): "
                        "raise it or lower --max-batch-size", elapsed, timeout_s)
        for delivery in batch.deliveries.values():
            delivery.span.outstanding = 0
            self._on_span_done(delivery)

    def _rewind(self) -> None:
        """Exactly-once, after an aborted transaction: drop everything consumed since the last commit and
        seek every assigned partition back to its committed offset."""
        consumer = self._consumer
        assert consumer is not None and self._rewind_after is not None
        assignment = consumer.assignment()
        try:
            committed = consumer.committed(assignment, timeout=_REWIND_QUERY_TIMEOUT_S)
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if not isinstance(error, KafkaError) or error.code() != KafkaError._TIMED_OUT:
                raise
            # The coordinator did not answer in time (a stalled process, a slow broker): the rewind stays pending
            # and is tried again by the next loop; what is consumed meanwhile belongs to the aborted epoch and
            # is dropped by the processor.
            if self._rewind_warned != self._rewind_after:
                self._rewind_warned = self._rewind_after
                log.warning("rewind: committed offsets not read yet (%s); trying again (an open transaction of "
                            "the partitions' previous owner holds them until it ends or times out)", error)
            return
        unread = [tp for tp in committed if tp.error is not None]
        if unread:
            log.warning("rewind: committed offsets of %s not read (%s); trying again",
                        _fmt([(tp.topic, tp.partition) for tp in unread]), unread[0].error)
            return
        self._epoch = self._rewind_after + 1
        self._batcher.take()
        tps = [(tp.topic, tp.partition) for tp in assignment]
        self._tracker.forget(tps)
        self._tracker.assign(tps)
        idle = []
        for tp in committed:
            try:
                consumer.seek(TopicPartition(tp.topic, tp.partition,
                                             tp.offset if tp.offset >= 0 else OFFSET_BEGINNING))
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if not isinstance(error, KafkaError) or error.code() not in _NOT_FETCHING:
                    raise
                # Assigned, and not fetching yet: librdkafka is still reading its committed offset (an open
                # transaction of its previous owner can hold that read for a while), or it is being revoked.
                # Nothing was taken from it, and it will start at its committed offset: nothing to rewind.
                idle.append((tp.topic, tp.partition))
        log.info("rewound %s to the committed offsets (epoch %d)%s", _fmt(tps), self._epoch,
                 f"; not fetching yet, left to start there: {_fmt(idle)}" if idle else "")

    def _rewind_pending(self) -> bool:
        """An aborted transaction's batches are abandoned: nothing of theirs will be acknowledged."""
        return self._rewind_after is not None and self._rewind_after >= self._epoch

    def _txn_timeout_s(self) -> float:
        return int(self._producer_config.get("transaction.timeout.ms", 60_000)) / 1000.0

    # ---------------------------------------------------------------------------- stuck partitions
    def _check_stalls(self) -> None:
        """Report partitions with records waiting and no committed progress for --stall-timeout-s."""
        stalls = self._stalls
        for tp in stalls.take_recovered():
            log.info("%s[%d] is making progress again", *tp)
        idle = stalls.idle()
        if idle:
            warn = stalls.judge(self._records_waiting(idle))
            if warn:
                log.warning("stalled: %s %s records waiting and no committed progress for %.0fs or more "
                            "(--stall-timeout-s %g)%s", _fmt(warn), "has" if len(warn) == 1 else "have",
                            min(stalls.stalled_for_s(tp) for tp in warn), stalls.timeout_s,
                            "; input is paused: the model's queue is full" if self._paused else "")
        self.metrics.stalled_partitions.set(len(stalls.stalled()))

    def _records_waiting(self, tps: list[tuple[str, int]]) -> dict[tuple[str, int], bool]:
        """Per partition: records beyond what this worker has taken (end offsets, for a read_committed consumer
        the last stable offset), or records it has taken and not committed yet. Partitions whose end offset
        could not be read are left out (judged at the next check)."""
        consumer = self._consumer
        assert consumer is not None
        try:
            # A ListOffsets request for the latest offsets (timestamp -1), all partitions in one round trip.
            answer = consumer.offsets_for_times([TopicPartition(t, p, OFFSET_END) for t, p in tps],
                                                timeout=_STALL_QUERY_TIMEOUT_S)
            # The application position passes the control records of transactional input; committed positions
            # stop at the last data record + 1, so they alone would show a transaction marker as waiting.
            positions = consumer.position([TopicPartition(t, p) for t, p in tps])
        except KafkaException as exc:
            log.warning("stall check: end offsets of %s not read: %s", _fmt(tps), exc.args[0] if exc.args else exc)
            return {}
        ends = {(tp.topic, tp.partition): tp.offset for tp in answer if tp.error is None and tp.offset >= 0}
        for t, p in tps:
            # Also the end offset the last fetch response carried (no round trip): the embedded Tansu broker
            # answers ListOffsets(latest) wrongly, its fetch responses rightly; on Kafka the two agree.
            _, fetched = consumer.get_watermark_offsets(TopicPartition(t, p), cached=True)
            if fetched >= 0:
                ends[(t, p)] = max(ends.get((t, p), 0), fetched)
        taken = {(tp.topic, tp.partition): tp.offset for tp in positions if tp.error is None and tp.offset >= 0}
        unknown = [tp for tp in tps if tp not in taken and tp not in self._committed_positions]
        # Nothing taken from these since they were assigned: where does the group stand on them? With no
        # committed offset, fetching starts where auto.offset.reset says: offset 0 for "earliest", else unknown.
        reset = str(self._consumer_config.get("auto.offset.reset", "latest")).lower()
        start = 0 if reset in ("earliest", "smallest", "beginning") else None
        committed: dict[tuple[str, int], int | None] = {}
        if unknown:
            try:
                answer = consumer.committed([TopicPartition(t, p) for t, p in unknown], timeout=_STALL_QUERY_TIMEOUT_S)
            except KafkaException:
                # Unreadable for now: an open transaction of the partitions' previous owner holds them until it
                # ends or times out, and nothing can be taken from them meanwhile either.
                committed = dict.fromkeys(unknown, 0)
            else:
                committed = {(tp.topic, tp.partition): tp.offset if tp.offset >= 0 else start
                             for tp in answer if tp.error is None}
        batched = self._batched_partitions()
        waiting = {}
        for tp in tps:
            known = [x for x in (taken.get(tp), self._committed_positions.get(tp), committed.get(tp)) if x is not None]
            if tp not in ends or not known:
                continue
            waiting[tp] = ends[tp] > max(known) or self._tracker.holds(tp) or tp[1] in batched
        return waiting

    def _batched_partitions(self) -> set[int]:
        """Input partitions with records in the open batch."""
        out: set[int] = set()
        for records in self._batcher.items():
            out.update(np.unique(records.partitions).tolist())
        return out

    # ---------------------------------------------------------------------------- delivery callbacks
    def _on_span_done(self, delivery: SpanDelivery) -> None:
        faults.reach("after-delivery")
        n = delivery.span.count - delivery.dead
        self._summary.predicted += n
        self._summary.dead_lettered += delivery.dead
        self.metrics.predicted.inc(n)
        if delivery.ts_ms is not None and len(delivery.ts_ms):
            now_ms = time.time() * 1000.0
            self.metrics.e2e_latency_seconds.observe_many((now_ms - delivery.ts_ms) / 1000.0)

    # ---------------------------------------------------------------------------- errors, end, shutdown
    def _fail(self, exc: BaseException) -> None:
        with self._failure_lock:
            if self._failure is None:
                self._failure = exc
                log.error("worker failing: %s: %s", type(exc).__name__, exc)
        self._stop.set()

    def _failure_now(self) -> BaseException | None:
        if self._failure is None and self._publisher is not None:
            failure = self._publisher.failure()
            if failure is not None:
                self._fail(failure)
        return self._failure

    def _on_consumer_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._fail(KafkaClientError("consumer", err))
        else:
            log.warning("consumer: %s", err)

    def _read_end_offsets(self) -> dict[int, int]:
        ends = end_offsets(self.settings.bootstrap_servers, self.settings.input_topic)
        log.info("stop-at-end: end offsets at start %s", ends)
        return ends

    def _drained(self) -> bool:
        """True once the group's committed offsets reach the end offsets seen at start, for every partition."""
        now = self._clock()
        if now < self._next_drain_check:
            return False
        self._next_drain_check = now + 0.25
        assert self._end_offsets is not None and self._consumer is not None
        pending = {p: end for p, end in self._end_offsets.items() if end > 0}
        # Own partitions first (no round trip): what we committed.
        topic = self.settings.input_topic
        for (t, p), pos in self._committed_positions.items():
            if t == topic and p in pending and pos >= pending[p]:
                del pending[p]
        if not pending:
            return True
        if self._tracker.in_flight() or len(self._batcher):
            return False
        self._commit(asynchronous=False)
        others = [TopicPartition(topic, p) for p in pending]
        for tp in self._consumer.committed(others, timeout=10):
            if tp.offset != OFFSET_INVALID and tp.offset >= pending[tp.partition]:
                del pending[tp.partition]
        return not pending

    def _shutdown(self, processor: threading.Thread) -> None:
        consumer, publisher = self._consumer, self._publisher
        deadline = time.monotonic() + self.settings.shutdown_timeout_s
        failed = self._failure_now() is not None
        # 1. Finish the open batch (never after a failure: nothing past it may be published).
        while not failed and len(self._batcher) and consumer is not None:
            if not self._slots.acquire(timeout=max(deadline - time.monotonic(), 0.01)):
                self._fail(StreamError("processor did not take the last batch within the shutdown timeout"))
                break
            self._queue.put_nowait(self._close_batch())
        # 2. Let the processor finish the queue.
        try:
            self._queue.put(None, timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Full:
            log.error("processor did not drain its queue within the shutdown timeout")
        processor.join(timeout=max(deadline - time.monotonic(), 0.01))
        # 3. Wait for every delivery report, then commit the acknowledged watermark.
        if publisher is not None:
            undelivered = publisher.close(max(deadline - time.monotonic(), 0.01))
            if undelivered:
                log.error("%d predictions undelivered at shutdown; their offsets stay uncommitted", undelivered)
            failure = publisher.failure()
            if failure is not None:
                self._fail(failure)
        if consumer is not None:
            try:
                self._commit_settled(deadline)
            except KafkaClientError as exc:
                self._fail(exc)
            self._stop.set()
            if self._input is not None:
                self._input.close()  # before the consumer's close, which destroys the client it uses
                self._input = None
            try:
                consumer.close()  # leaves the group; on_revoke finds nothing left to do
            except Exception as exc:  # confluent-kafka raises KafkaError itself here, not KafkaException
                log.warning("consumer close: %s", exc)


def _fmt(tps: list[tuple[str, int]]) -> str:
    if not tps:
        return "nothing"
    return f"{tps[0][0]}{sorted(p for _, p in tps)}"
