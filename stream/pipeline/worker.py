"""The orchestrator, and the table of contents of the pipeline.

    poll thread (this module):  take records (`intake`) -> `MicroBatcher` -> close a batch: its spans in the
        `OffsetTracker` (`spans`) -> the first stage's bounded queue; input paused while a closed batch waits for it
        (`pausing`); commits (`committer`); rebalances (`rebalance`); stuck partitions (`stall_check`);
        exactly-once rewinds (`transactions`); stop-at-end; shutdown.
    the stages (`stage`, threads of their own, bounded queues between them): prepare (a pool: decode, the
        model's host-side prepare) -> device (submit; on the CPU the forward pass) -> finish (outputs, encode,
        produce, and the delivery reports that acknowledge spans and so advance the commit positions;
        exactly-once: transactions of one or more batches, `transactions`); `processing` is a batch's work.
    any thread: the first failure stops the worker (`failure`).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import NoReturn

import numpy as np
from confluent_kafka import Consumer, KafkaException, TopicPartition

from stream.config import WorkerSettings
from stream.errors import ConfigError, KafkaClientError, ModelHung, StoppedOnPurpose, StreamError
from stream.kafka.access import check_access, ensure_dlq_topic, reply_partitions
from stream.kafka.client_logs import ConnectionWatch, client_logger
from stream.kafka.client_stats import ConsumerStats
from stream.kafka.deadline import Deadline
from stream.kafka.guarded import unless_stopped
from stream.kafka.intake import Intake, close_within
from stream.kafka.offsets import OffsetTracker
from stream.kafka.publish import Publisher, native_topic
from stream.kafka.records import Records
from stream.kafka.replies import carried_headers
from stream.kafka_env import check_client_configs
from stream.ops.health import Health
from stream.ops.health import serve as serve_http
from stream.ops.metrics import StreamMetrics
from stream.ops.stalls import StallDetector
from stream.ops.summary import WorkerSummary
from stream.ops.tracing import BatchTraces, tracing_from_env
from stream.pipeline import faults
from stream.pipeline.batching import MicroBatcher, token_bounds
from stream.pipeline.committer import CommitLedger, Committer
from stream.pipeline.failure import Failure
from stream.pipeline.inference import (
    Call,
    InferenceEngine,
    ModelHandler,
    TextOptions,
    create_handler,
    select_device,
)
from stream.pipeline.pausing import PAUSE_AFTER_S, InputPause
from stream.pipeline.processing import BatchProcessor, ProcessingPolicy
from stream.pipeline.rebalance import IdleReplica, Rebalancer
from stream.pipeline.runtime import freeze_loaded, set_torch_threads, tuned
from stream.pipeline.schemas import build_codecs
from stream.pipeline.spans import Delivered, Spans
from stream.pipeline.stage import ProcessingStages
from stream.pipeline.stall_check import StallCheck
from stream.pipeline.stop_at_end import StopAtEnd
from stream.pipeline.stops import GUIDE, PreviousStops, leave_notes, read_notes
from stream.pipeline.transactions import Transactions

__all__ = ["Worker", "WorkerSummary"]

log = logging.getLogger(__name__)
WARM_LIMIT_S = 120.0  # the model's warm-up at most (then the shapes left are met by records' batches)
_IDLE_POLL_S = 0.1
_CLOSE_FLOOR_S = 10.0  # the consumer's close gets at least this long, whatever the shutdown deadline left
_STALL_STEP_S = 0.05
_GAUGE_EVERY_S = 0.1
_HUNG_WAIT_S = 1.0  # how long the stages get to end after the model hung (the hung call's thread never does)
_WARM_WATCH_S = 0.5  # how often the warm-up's calls into the model are looked at
EXIT_STOPPED_ON_PURPOSE = 3  # the worker's exit status when it stopped itself (`stream.errors.StoppedOnPurpose`)
_IDLE_CHECK_S = 0.001  # adaptive batching, confluent-kafka's consumer: how often a waiting poll thread checks
# whether the model went idle (the C consumer's take is woken instead)


@dataclass(frozen=True)
class Connected:
    """What exists once the worker's Kafka clients do (`Worker._connect`): the clients and the parts made over
    them, handed to the poll loop and the shutdown."""

    consumer: Consumer
    publisher: Publisher
    failed: Callable[[], bool]  # the worker's failure, or its publisher's (`Failure.watching`)
    intake: Intake
    committer: Committer
    rebalancer: Rebalancer
    spans: Spans
    processor: BatchProcessor
    stage: ProcessingStages
    stall_check: StallCheck


def _token_bound(max_batch_tokens: int | None, handler: ModelHandler) -> Callable[[Records], np.ndarray] | None:
    """Each record's most tokens (`stream.pipeline.batching.token_bounds`) when batches close on a token budget;
    ConfigError when the model takes no tokens or one text could be over the budget."""
    if max_batch_tokens is None:
        return None
    cap = getattr(handler, "max_tokens", None)
    if not isinstance(cap, int):
        raise ConfigError(f"--max-batch-tokens: the model {handler.name} takes no tokens (a text model, such as "
                          "--model minilm, does)")
    if max_batch_tokens < cap:
        raise ConfigError(f"--max-batch-tokens {max_batch_tokens} is below the model's --max-tokens {cap}: one "
                          "text may take that many")
    return lambda records: token_bounds(records.lengths, cap)


def where_is(thread: int | None) -> str:
    """"Thread NAME is at:" and the stack of the thread of that ident, for an ERROR about a thread that does not
    end: where it waits is what the operator needs."""
    frame = sys._current_frames().get(thread) if thread is not None else None
    stack = "".join(traceback.format_stack(frame)).rstrip() if frame is not None else "(it has returned since)"
    name = next((t.name for t in threading.enumerate() if t.ident == thread), "?")
    return f"Thread {name} is at:\n{stack}"


def exit_now(code: int) -> NoReturn:
    """End the process at once, the log and output flushed first: for a thread that will never return (a model
    call, a client's close), which the interpreter's end or a destructor would wait for."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Worker:
    def __init__(self, settings: WorkerSettings, *, handler: ModelHandler | None = None,
                 metrics: StreamMetrics | None = None, clock: Callable[[], float] = time.monotonic,
                 stopping: Callable[[], bool] = lambda: False) -> None:
        """``stopping``: whether a stop came during this start-up (before `install_signal_handlers`); the
        schemas' reading then ends in `StoppedAtStartUp` at once instead of waiting for the registry."""
        self.settings = s = settings
        consumer_config, producer_config, admin_config = s.consumer_config(), s.producer_config(), s.admin_config()
        # before the model loads: a setting librdkafka refuses fails the start with its reason
        check_client_configs({"consumer": consumer_config, "producer": producer_config, "admin": admin_config},
                             beside=" beside the worker's own")
        self.metrics = metrics if metrics is not None else StreamMetrics()
        self._clock = clock
        self._connection = ConnectionWatch(clock)
        self.health = Health(clock)
        set_torch_threads(s.torch_threads)  # intra-op threads: the pipeline's own threads need the other cores
        handler = handler if handler is not None else create_handler(
            s.model, s.model_dir, TextOptions(s.max_tokens, s.dtype, s.fixed_shapes, s.cuda_graphs, s.packing))
        self._engine = InferenceEngine(handler, select_device(s.device))
        self.health.hung = self._hung
        self._decoder, self._binder, self._encoder, self._event_time_field = unless_stopped(
            lambda: build_codecs(s, handler), stopping, "reading the schemas")
        self.metrics.model_info.info({
            "name": handler.name, "version": handler.version, "device": str(self._engine.device),
            "input_schema": f"{self._decoder.reader.name}:{self._decoder.reader.schema_id}",
            "output_schema": f"{self._encoder.schema.name}:{self._encoder.schema.schema_id}",
            "shadow": "true" if s.shadow else "false"})
        if self._engine.device.type == "cuda":
            self.metrics.watch_cuda_memory(self._engine.device)
        self._consumer_config = consumer_config
        stats_ms = int(self._consumer_config.get("statistics.interval.ms", 0))
        self._consumer_stats = ConsumerStats(s.input_topic, stats_ms / 1000.0) if stats_ms > 0 else None
        if self._consumer_stats is not None:
            self.metrics.registry.register(self._consumer_stats)
        self._producer_config = producer_config
        # The admin requests' clients report connection errors to the watch, as the consumer and producer do.
        self._stop = threading.Event()
        self._failure = Failure(s, self.health, self._connection, self._stop)
        self._fail = self._failure.fail
        self._admin_config = {**admin_config, "error_cb": self._connection.on_admin_error}
        self._summary = WorkerSummary()
        tokens = _token_bound(s.max_batch_tokens, handler)
        self._batcher: MicroBatcher[Records] = MicroBatcher(
            s.max_batch_size, s.max_wait_ms, clock, size=len,
            weight=None if tokens is None else (lambda r: int(tokens(r).sum())), max_weight=s.max_batch_tokens,
            nbytes=lambda r: r.nbytes, max_bytes=s.max_batch_bytes)
        self._tokens = tokens
        # bytes: the largest record (its value, key and watched headers' values: `Records.sizes`) of the last
        # records taken (`_take_n`); before the first, the largest valid value
        self._largest_record = s.max_input_bytes
        self._tracker = OffsetTracker()
        self._stalls = StallDetector(s.stall_timeout_s, clock)
        self._pause = InputPause(self.metrics)
        self._transactions = Transactions(
            self.metrics, s.input_topic, int(self._producer_config.get("transaction.timeout.ms", 60_000)) / 1000.0,
            clock, interval_s=s.transaction_interval_ms / 1000.0)
        # OpenTelemetry spans of the records that carry a trace context, with OTEL_EXPORTER_OTLP_ENDPOINT set
        self._tracing = tracing_from_env("stream-worker")
        self._traces = (BatchTraces(self._tracing, s.input_topic, handler.name, s.max_traced_per_s)
                        if self._tracing is not None else None)
        # What the clients' callbacks report to, so built before them: the consumer's commit answers, the
        # publisher's acknowledged spans. The rest is built once the clients exist (`_connect`).
        self._ledger = CommitLedger(self._tracker, self._stalls, self._summary, self.metrics, clock)
        self._delivered = Delivered(self._summary, self.metrics, self._traces)
        self.close_abandoned = False  # the consumer's close did not return in time (`close_within`)
        self.threads_abandoned = False  # a stage's thread did not end (a model call that never returned)
        self._exit: Callable[[int], object] = exit_now  # a warm-up whose model hung
        self._previous = PreviousStops(s.input_topic, {})  # where the group's last run stopped on purpose
        freeze_loaded()

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

    def _warm(self) -> None:
        """The model's warm-up batches (`InferenceEngine.warm`) before the worker joins its group: `/readyz` says
        so meanwhile, the log how long it took."""
        def progress(done: int, total: int) -> None:
            self.health.warming = f"{done} of {total} batches"

        self.health.warming = "starting"
        warmed = threading.Event()
        threading.Thread(target=self._watch_warm_up, args=(warmed,), name="warm-up-watch", daemon=True).start()
        try:
            done, total, seconds = self._engine.warm(WARM_LIMIT_S, self._stop.is_set, progress)
        finally:
            warmed.set()
            self.health.warming = None
        if total and done < total and self._stop.is_set():
            log.info("warm-up left after %d of %d batches (%.1f s): the worker is stopping", done, total, seconds)
        elif total:
            log.info("model warmed in %.1f s: %d of %d batches of the shapes it will use", seconds, done, total)

    def _hung_call(self) -> tuple[Call, str] | None:
        """A call into the model under way for --model-timeout-s or more, and why the model is taken to be hung."""
        call = self._engine.calls.longest()
        limit = self.settings.model_timeout_s
        if call is None or call.seconds < limit:
            return None
        return call, f"{call.describe()} (--model-timeout-s {limit:g})"

    def _hung(self) -> str | None:
        hung = self._hung_call()
        return None if hung is None else hung[1]

    def _check_model(self, consuming: bool = True) -> bool:
        """Fail the worker once a call into the model has not returned for --model-timeout-s: it keeps polling, so
        the group would leave it its partitions, their records waiting behind that call for ever. The call's stack
        goes to the log (where it hangs is what the operator needs); its thread is left, never waited for. In the
        warm-up (``consuming`` False: the call is the main thread's own, and no partition is held) it exits 1.
        Whether the model was found hung."""
        hung = self._hung_call()
        if hung is None:
            return False
        call, why = hung
        if consuming:
            log.error("%s: stopping without it; what this replica has not committed goes to the group's other "
                      "replicas. %s", why, where_is(call.thread))
            self._fail(ModelHung(why))
        else:
            log.error("%s in the warm-up: exiting (1) without it, before joining the group. %s",
                      why, where_is(call.thread))
            self._exit(1)
        return True

    def _watch_warm_up(self, warmed: threading.Event) -> None:
        """The poll loop's look at the model's calls (`_check_model`), while the main thread runs the warm-up."""
        while not warmed.wait(_WARM_WATCH_S):
            self._check_model(consuming=False)

    def run(self) -> WorkerSummary:
        with tuned(self.settings.gil_switch_interval_ms):
            return self._run()

    # ---------------------------------------------------------------------------- start and end
    def _run(self) -> WorkerSummary:
        s = self.settings
        health = self.health
        health.model_loaded = True  # by the constructor
        health.unreachable = lambda: self._connection.unreachable
        health.stalled = lambda: len(self._stalls.stalled())
        # Probes answer from the start, while the worker still waits for the brokers.
        http = serve_http(self.metrics.registry, health, s.metrics_port.first, s.metrics_host,
                          s.metrics_port.last) if s.metrics_port is not None else None
        if http is not None and s.metrics_port_file is not None:
            s.metrics_port_file.write_text(f"{http.server_port}\n")
        try:
            return self._run_clients()
        finally:
            if http is not None:
                http.shutdown()
                http.server_close()
            if self._tracing is not None:
                self._tracing.shutdown()  # exports the spans still queued

    def _run_clients(self) -> WorkerSummary:
        s = self.settings
        if s.dlq_topic:
            ensure_dlq_topic(s, self._admin_config, self._connection, self._stop)
        check_access(s, self._admin_config, self._connection, self._stop)
        if self._stop.is_set():  # told to stop while the brokers were asked (or waited for): no client exists yet
            log.info("stopped during start-up, before any client was made: nothing consumed, nothing to commit")
            return self._summarize(None)
        publisher = Publisher(self._producer_config, on_span_done=self._delivered.done,
                              native_topic=native_topic(s, self._encoder.carries_source), connection=self._connection)
        consumer = Consumer({**self._consumer_config, "on_commit": self._ledger.on_commit,
                             "error_cb": self._failure.on_consumer_error, "logger": client_logger("consumer"),
                             **({"stats_cb": self._consumer_stats.on_stats} if self._consumer_stats else {})})
        parts = self._connect(consumer, publisher)
        if not self._stop.is_set():  # the notes are a courtesy, not worth a stopping worker's wait for the brokers
            self._previous = PreviousStops(s.input_topic, read_notes(consumer, s.input_topic))
            self._previous.log_found()
        counts = self._previous.breaker_counts()
        if counts is not None:
            parts.processor.breaker.prime(*counts)
        self.health.stopped_before = lambda: self._previous.pending(self._tracker.assigned(), self._ledger.position)
        self.metrics.stopped_on_purpose.set_function(lambda: len(self.health.stopped_before()))
        self._warm()
        parts.stage.start()
        try:
            # A worker stopped during start-up never joins the group, nor asks the brokers what only that needs
            if s.exactly_once and not self._stop.is_set():
                publisher.init_transactions(self._transactions.timeout_s)
            end = None
            if s.stop_at_end and not self._stop.is_set():
                end = StopAtEnd.from_broker(consumer, self._admin_config, s.input_topic, parts.committer,
                                            lambda: bool(self._tracker.in_flight() or len(self._batcher)),
                                            self._tracker.taken_to, self._clock)
            if not self._stop.is_set():
                r = parts.rebalancer

                def on_assign(c: Consumer, partitions: list[TopicPartition]) -> None:
                    r.on_assign(c, partitions)
                    self.health.joined = True

                consumer.subscribe([s.input_topic], on_assign=on_assign, on_revoke=r.on_revoke, on_lost=r.on_lost)
                log.info("worker consuming %s -> %s as group %s (max_batch_size=%d, max_wait_ms=%g)",
                         s.input_topic, s.output_topic, s.group_id, s.max_batch_size, s.max_wait_ms)
                self._poll_loop(parts, end)
        except BaseException as exc:  # keep going to the orderly shutdown below, then report
            self._fail(exc)
        self._shutdown(parts)
        return self._summarize(parts)

    def _summarize(self, parts: Connected | None) -> WorkerSummary:
        """The summary's exit code and the stages' times (``parts`` None: stopped before the clients existed)."""
        s = self.settings
        error = self._failure.error
        if error is not None:
            self._summary.error = f"{type(error).__name__}: {error}"
            self._summary.exit_code = 1
        if isinstance(error, StoppedOnPurpose):
            where = (f"{s.input_topic}[{error.partition}]@{error.offset}" if error.partition is not None
                     else s.input_topic)
            log.error("stopped on purpose (%s) near %s: nothing at or after the committed positions is lost or "
                      "skipped; a restart resumes there and stops again if the same records fail the same way. "
                      "What to do: %s", error.reason, where, GUIDE)
            self._summary.exit_code = EXIT_STOPPED_ON_PURPOSE
        self._summary.transactions = self._transactions.committed
        if parts is not None:
            self._summary.stage_busy_s = parts.stage.busy_seconds()
            self._summary.stage_cpu_s = parts.stage.cpu_seconds()
        if self._engine.device.type == "cuda":
            self._summary.device_busy_s = self._engine.device_busy_s
            self._summary.device_warm_s = self._engine.warm_device_s
        log.info("shutdown summary: %s", self._summary.line())
        return self._summary

    def _connect(self, consumer: Consumer, publisher: Publisher) -> Connected:
        """The parts that need the clients, wired to them (the stages' threads are started by `_run_clients`)."""
        s, clock = self.settings, self._clock
        failed = self._failure.watching(publisher.failure)
        intake = Intake.open(consumer, s, clock, self._consumer_config)
        committer = Committer(consumer, self._ledger, self._tracker, self.metrics, exactly_once=s.exactly_once,
                              clock=clock)
        max_poll_ms = int(self._consumer_config.get("max.poll.interval.ms", 300_000))
        rebalancer = Rebalancer(
            intake, self._batcher, self._tracker, self._stalls, committer, self._pause, self.metrics,
            revoke_budget_s=min(max_poll_ms / 2000.0, s.shutdown_timeout_s), failed=failed,
            rewinding=self._transactions.pending, clock=clock, start_from_ms=s.start_from_ms)
        spans = Spans(s.input_topic, consumer, publisher, self._batcher, self._tracker, self._ledger,
                      self._transactions, self._summary, self.metrics, exactly_once=s.exactly_once,
                      tokens=self._tokens, traces=self._traces)
        policy = ProcessingPolicy(s.input_topic, s.output_topic, s.dlq_topic, s.max_input_bytes, s.model_retries,
                                  s.retry_backoff_ms, s.dlq_max_fraction, s.dlq_window, s.provenance_headers,
                                  event_time_field=self._event_time_field, reply_topics=s.reply_topic_set,
                                  carried=carried_headers(s.copy_header_names))
        admin_config = self._admin_config
        processor = BatchProcessor(policy, self._engine, self._decoder, self._binder, self._encoder, publisher,
                                   self.metrics, stopping=self._stop.is_set,
                                   reply_partitions=lambda topic: reply_partitions(admin_config, topic),
                                   trace=None if self._traces is None else spans.trace)
        stage = ProcessingStages(
            processor, publisher, self._transactions, max_inflight_batches=s.max_inflight_batches,
            prepare_threads=s.prepare_threads, torch_threads=s.torch_threads, overlap=s.gpu_overlap,
            exactly_once=s.exactly_once, fail=self._fail, failed=failed, metrics=self.metrics,
            on_idle=intake.wake)
        self.metrics.queued_batches.set_function(stage.queued)
        self.metrics.open_batch.set_function(self._batcher.__len__)
        stall_check = StallCheck(consumer, self._stalls, self._ledger, self._tracker, self._batcher,
                                 self._pause, self.metrics, self._consumer_config)
        return Connected(consumer, publisher, failed, intake, committer, rebalancer, spans, processor, stage,
                         stall_check)

    # ---------------------------------------------------------------------------- poll thread
    def _poll_loop(self, parts: Connected, end: StopAtEnd | None = None) -> None:
        """Until a stop, a failure or, with ``end``, the end offsets read at start are committed."""
        consumer, intake, stage, stall_check = parts.consumer, parts.intake, parts.stage, parts.stall_check
        batcher, pause = self._batcher, self._pause
        committer, spans, failed = parts.committer, parts.spans, parts.failed
        commit_every_s = self.settings.commit_interval_ms / 1000.0
        next_commit = self._clock() + commit_every_s
        next_gauge = 0.0
        idle = IdleReplica(self.settings.input_topic, clock=self._clock)
        stalled_since: float | None = None
        adaptive = self.settings.batch_policy == "adaptive"
        close_early = False
        health = self.health
        health.polling = True
        while not self._stop.is_set() and not failed():
            health.tick()
            records: Records | None = None
            close_now = close_early and len(batcher) > 0  # a revoke may have emptied the batch meanwhile
            close_early = False
            ready = close_now or batcher.ready()
            if not ready:
                stalled_since = None
                if pause.paused:  # nothing waits for the processor any more (see stream.pipeline.pausing)
                    pause.set(consumer, False)
            if ready:
                if self._dispatch(parts, wait_s=0.0 if pause.paused else _STALL_STEP_S):
                    stalled_since = None
                else:
                    # Queue full. Pausing restarts fetching on resume, so only pause on a sustained stall;
                    # until then the short blocking put keeps consume() calls (membership) frequent enough.
                    now = self._clock()
                    stalled_since = now if stalled_since is None else stalled_since
                    if pause.paused:
                        records = intake.take(1, _STALL_STEP_S)  # serves rebalances, heartbeats
                    elif now - stalled_since >= PAUSE_AFTER_S:
                        pause.set(consumer, True)
            elif len(batcher) == 0:
                # Empty batch: take a record as soon as it arrives, so its wait is timed from arrival, and with it
                # those fetched before it (a backlog's batch in one piece, not one record and then the rest).
                records = intake.take(self._take_n(), _IDLE_POLL_S, first=True)
            elif adaptive and stage.idle():
                # The model has nothing to do: waiting for more records only adds latency. Take what is
                # already fetched; if that does not fill the batch, hand it over now. Under load the model is
                # busy, so records pile up while it works and batches grow on their own.
                room = self._take_n()
                records = intake.take(room, 0)
                close_early = len(records) < room
            else:
                wait_s = batcher.time_left() or 0.0
                if adaptive and not intake.wakeable:
                    wait_s = min(wait_s, _IDLE_CHECK_S)  # look again soon: the model may be idle by then
                # else the stage wakes this take as it goes idle: no polling, which took the GIL from a
                # model-bound processor a thousand times a second
                records = intake.take(self._take_n(), wait_s)
            if records is not None and len(records):
                self._largest_record = int(records.sizes().max())
                self._connection.reachable()
                faults.reach("after-poll")
                spans.accept(records)
            if self._transactions.pending():
                self._transactions.rewind(consumer, batcher, self._tracker)
                if not self._transactions.pending():  # rewound: the unreadable batches met since are met again
                    intake.forget()
            now = self._clock()
            if now >= next_commit and self._ledger.async_due():
                committer.commit(asynchronous=True)
                next_commit = now + commit_every_s
            if end is not None and end.reached():
                break
            if now >= next_gauge:
                self._check_model()
                self.metrics.in_flight.set(self._tracker.in_flight())
                idle.check(len(self._tracker.assigned()), health.joined)
                next_gauge = now + _GAUGE_EVERY_S
            if stall_check.due():
                stall_check.run()

    def _take_n(self) -> int:
        """How many records to take for the open batch: its room, and no more than records as large as the
        largest of the last take that fit in its bytes (at least one). A take is one buffer, which a batch cut
        from it would keep alive whole: a backlog of large records is taken a batch's bytes at a time, not as
        much as librdkafka has fetched."""
        batcher = self._batcher
        room, byte_room = batcher.room, batcher.byte_room
        if byte_room is None or self._largest_record <= 0:
            return max(room, 1)
        return max(min(room, byte_room // self._largest_record), 1)

    def _dispatch(self, parts: Connected, wait_s: float) -> bool:
        """Hand the closed batch to the stages, waiting up to ``wait_s`` for room in their first queue."""
        if not parts.stage.offer(parts.spans.close_batch, wait_s):
            return False
        if self._pause.paused:
            self._pause.set(parts.consumer, False)
        return True

    # ---------------------------------------------------------------------------- shutdown
    def _shutdown(self, parts: Connected) -> None:
        consumer, publisher, stage = parts.consumer, parts.publisher, parts.stage
        deadline = Deadline(self.settings.shutdown_timeout_s, self._clock)
        # A call into the model that never returns is not waited for: once one has been under way for
        # --model-timeout-s, before or during the waits below, the worker fails (`_check_model`) and the stages get
        # _HUNG_WAIT_S more (to abort an open transaction), not the rest of the shutdown's time.
        hung_at = [self._clock()] if isinstance(self._failure.error, ModelHung) else []

        def give_up() -> bool:
            if not hung_at:
                if not self._check_model():  # hung: its ERROR, the stack, the worker failing
                    return False
                hung_at.append(self._clock())
            return self._clock() - hung_at[0] >= _HUNG_WAIT_S

        # 1. Finish the open batch (never after a failure: nothing past it may be published).
        while not parts.failed() and len(self._batcher):
            if stage.offer(parts.spans.close_batch, min(_GAUGE_EVERY_S, deadline.left(0.01))):
                continue
            give_up()
            if deadline.passed():
                self._fail(StreamError("processor did not take the last batch within the shutdown timeout"))
                break
        # 2. Let the stages finish their queues.
        left = stage.finish(deadline, give_up)
        self.threads_abandoned = bool(left)
        if left and not hung_at:
            limit = self.settings.shutdown_timeout_s
            log.error("the stages did not finish their batches within --shutdown-timeout-s (%g s): exiting without "
                      "them; what this replica has not committed goes to the group's other replicas. %s", limit,
                      "\n".join(where_is(thread.ident) for thread in left))
            self._fail(StreamError(f"the stages did not finish their batches within --shutdown-timeout-s "
                                   f"({limit:g} s)"))
        elif left:
            log.error("the stages did not end within %g s of the hung call (threads %s left): exiting without them",
                      _HUNG_WAIT_S, ", ".join(thread.name for thread in left))
        parts.processor.rejected.flush()
        # 3. Wait for every delivery report, then commit the acknowledged watermark.
        undelivered = publisher.close(deadline.left(0.01))
        parts.rebalancer.publishing_ended()  # the consumer's close below revokes: no acknowledgement is left to come
        if undelivered:
            log.error("%d predictions undelivered at shutdown; their offsets stay uncommitted", undelivered)
        failure = publisher.failure()
        if failure is not None:
            self._fail(failure)
        try:
            parts.committer.commit_settled(deadline)
        except KafkaClientError as exc:
            self._fail(exc)
        if isinstance(self._failure.error, StoppedOnPurpose):
            self._leave_notes(consumer, self._failure.error)
        self._stop.set()
        parts.intake.close()  # before the consumer's close, which destroys the client it uses
        self.close_abandoned = not close_within(consumer, max(deadline.left(0.0), _CLOSE_FLOOR_S))

    def _leave_notes(self, consumer: Consumer, error: StoppedOnPurpose) -> None:
        """Each held partition's committed position again, with a note of why the worker stopped
        (`stream.pipeline.stops`); a partition the group never committed gets the position this run started at."""
        topic = self.settings.input_topic
        held = [p for t, p in self._tracker.assigned() if t == topic]
        if not held:
            return
        try:
            committed = consumer.committed([TopicPartition(topic, p) for p in held], timeout=10)
        except KafkaException as exc:
            log.warning("could not read the committed positions to leave a note of this stop: %s", exc)
            return
        positions = {}
        for tp in committed:
            position = tp.offset if tp.offset >= 0 else self._ledger.position((topic, tp.partition))
            if position is not None:
                positions[tp.partition] = position
        leave_notes(consumer, topic, positions, error, self._previous.notes)
