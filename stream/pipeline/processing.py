"""One micro-batch, start to finish, in the three steps the stages (`stream.pipeline.stage`) run on their threads:
`prepare` (decode, bind the model's inputs, the handler's host-side prepare), `submit` (to the device) and
`complete` (wait for the model, isolating poison records; encode; hand predictions and dead-letter records to the
publisher). `process` runs the three in a row.

Every input record of a batch leaves as exactly one output record: its prediction, or its dead-letter
record. Both count as the record's acknowledgement, so an offset commits only after one of them is
delivered. Without a dead-letter topic, a bad record stops the worker (nothing past it is committed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from stream.codec import InputSource
from stream.codec.columns import Columns
from stream.codec.decoder import ColumnDecoder
from stream.codec.encoder import OutputEncoder
from stream.codec.registry import RegistryUnavailable
from stream.errors import (
    DecodeError,
    DeviceMemoryError,
    ModelError,
    StoppedOnPurpose,
    StreamError,
    UnrecoverableModelError,
)
from stream.kafka.delivery import SpanDelivery
from stream.kafka.publish import (
    DLQ_ERROR_CLASS,
    DLQ_ERROR_MESSAGE,
    DLQ_ERROR_REASON,
    DLQ_MODEL,
    DLQ_STAGE,
    DLQ_VALUE_BYTES,
    HEADER_OFFSET,
    HEADER_PARTITION,
    HEADER_TOPIC,
    Headers,
    Publisher,
)
from stream.kafka.records import Records
from stream.kafka.replies import (
    TRACE_HEADERS,
    USAGE_TOKENS_HEADER,
    AddressHeaders,
    Reply,
    ReplyRouter,
    carried_of,
)
from stream.ops.metrics import StreamMetrics
from stream.pipeline import faults
from stream.pipeline.contract import Decoded, DecodeStage
from stream.pipeline.dead_letters import DeadLetterBreaker, RejectedInputs
from stream.pipeline.inference import InferenceEngine, InFlight, Prepared
from stream.pipeline.inputs import InputBinder, input_rows, take_inputs

log = logging.getLogger(__name__)
_SCALAR_TYPES = ("float", "double", "int", "long", "boolean")  # outputs whose values stream_prediction_value shows


class Abandoned(StreamError):
    """A batch left undone because the worker is stopping (its schema could not be found meanwhile): none of its
    records is acknowledged, so nothing at or after them is committed; another replica, or the next start, takes
    them up."""


@dataclass
class Dispatched:
    """A closed micro-batch on its way to the processor."""

    records: Records
    partitions: np.ndarray  # input partition per record
    offsets: np.ndarray  # input offset per record
    deliveries: dict[int, SpanDelivery]  # input partition -> its span's delivery callback
    epoch: int = 0  # exactly-once: batches of an epoch before a rewind are dropped
    group_metadata: Any = None  # exactly-once: the consumer group generation when the batch was consumed
    queued_at: float = 0.0  # monotonic time it entered the processing stage's queue
    closed_ns: int = 0  # wall clock (ns) when it was closed, for the tracing spans (`stream.ops.tracing`)


@dataclass
class Begun:
    """A batch decoded and prepared (`BatchProcessor.prepare`), then submitted to the model (`submit`), waiting
    for ``BatchProcessor.complete``."""

    batch: Dispatched
    decoded: Columns  # the records the model takes (``index``: their positions in the batch)
    inputs: dict[str, Any]  # the model's inputs, one row per decoded record
    dead: list[DeadRecord]
    prepared: Prepared | None  # None when no record decoded
    flight: InFlight | None = None  # set by submit; None when no record decoded
    submitted_ns: int | None = None  # wall clock (ns) when submit handed it to the model


@dataclass(frozen=True)
class ProcessingPolicy:
    input_topic: str
    output_topic: str
    dlq_topic: str | None
    max_input_bytes: int
    model_retries: int
    retry_backoff_ms: float
    dlq_max_fraction: float
    dlq_window: int
    provenance_headers: bool = False
    event_time_field: str | None = None  # the input field holding each event's time (ms), for end-to-end latency
    reply_topics: frozenset[str] = frozenset()  # the topics reply addresses may name (`stream.kafka.replies`)
    # the input headers carried onto a record's prediction, dead letter and reply (`stream.kafka.replies`), in the
    # order the consumer hands them over after a reply address's
    carried: tuple[str, ...] = TRACE_HEADERS
    registry_backoff_max_s: float = 5.0


@dataclass(frozen=True)
class DeadRecord:
    index: int  # position in the batch
    stage: str  # "decode" | "model"
    reason: str
    error: BaseException


class BatchProcessor:
    def __init__(self, policy: ProcessingPolicy, engine: InferenceEngine, decoder: ColumnDecoder,
                 binder: InputBinder, encoder: OutputEncoder, publisher: Publisher, metrics: StreamMetrics,
                 sleep: Callable[[float], None] = time.sleep, stopping: Callable[[], bool] = lambda: False,
                 reply_partitions: Callable[[str], int | None] = lambda topic: None,
                 trace: Callable[[Begun, dict[int, Headers], list[DeadRecord]], None] | None = None) -> None:
        """``reply_partitions(topic)``: a reply topic's partition count when the worker may write to it, else
        None (`stream.kafka.access.reply_partitions`); ``trace``: starts the tracing spans of a batch's records
        with a trace context (`stream.pipeline.spans.Spans.trace`), None when tracing is off."""
        self.policy = policy
        self._engine = engine
        self._decode_stage = DecodeStage(decoder, binder, policy.max_input_bytes)
        self._encoder = encoder
        self._stopping = stopping
        self._publisher = publisher
        self._metrics = metrics
        self._sleep = sleep
        self.breaker = DeadLetterBreaker(policy.dlq_max_fraction, policy.dlq_window)
        self.rejected = RejectedInputs(policy.input_topic)
        self._topic_header = policy.input_topic.encode()
        # The input record's topic/partition/offset travel in the prediction's value when its schema has the
        # fields for them (version 2 on), as headers when asked for or when it has not.
        self._provenance_headers = policy.provenance_headers or not encoder.carries_source
        self._replies = ReplyRouter(policy.reply_topics, reply_partitions, metrics.replies.labels("refused").inc)
        self._trace = trace

    @property
    def engine(self) -> InferenceEngine:
        return self._engine

    def process(self, batch: Dispatched) -> None:
        self.complete(self.begin(batch))

    def begin(self, batch: Dispatched) -> Begun:
        """`prepare` and `submit`: the batch on the device, not waited for."""
        return self.submit(self.prepare(batch))

    def prepare(self, batch: Dispatched) -> Begun:
        """Host work before the device (safe on several threads at once): the decode stage (decode, bind the
        model's inputs; the records it cannot take are kept as dead), and the handler's own ``prepare``."""
        stage = self._decode(batch)
        decoded, inputs = stage.columns, stage.inputs
        dead = [DeadRecord(i, "decode", e.reason, e) for i, e in stage.errors]
        prepared = None
        if len(decoded):
            prepared = self._engine.prepare(inputs)
            if prepared.truncated:
                self._metrics.inputs_truncated.inc(prepared.truncated)
        return Begun(batch, decoded, inputs, dead, prepared)

    def submit(self, begun: Begun) -> Begun:
        """Hand the prepared batch to the model without waiting for its forward pass (on the CPU it runs now)."""
        if begun.prepared is not None:
            faults.reach("during-inference")
            begun.submitted_ns = time.time_ns()
            begun.flight = self._engine.submit(begun.inputs, begun.prepared)
        return begun

    def _decode(self, batch: Dispatched) -> Decoded:
        """The decode stage (`stream.pipeline.contract`), waiting out a schema registry that cannot be reached (its
        records are neither dead-lettered nor acknowledged meanwhile, so nothing is committed past them; the finish
        stage serves earlier batches' acknowledgements meanwhile)."""
        delay_s = 0.1
        while True:
            try:
                return self._decode_stage.run(batch.records)
            except RegistryUnavailable as exc:
                if self._stopping():
                    raise Abandoned(f"stopping while the schema registry is unreachable: {exc}") from exc
                self._metrics.registry_retries.inc()
                log.warning("%s; retrying in %.1f s", exc, delay_s)
                self._sleep(delay_s)
                delay_s = min(delay_s * 2, self.policy.registry_backoff_max_s)

    def complete(self, begun: Begun) -> None:
        """Wait for the batch's forward pass (isolating poison records), then publish its predictions and dead
        letters. Batches are completed in the order they were begun."""
        batch, decoded, dead = begun.batch, begun.decoded, begun.dead
        watched = batch.records.replies
        replies = self._replies.route(watched) if watched else {}
        carried = self._carried(watched) if watched else {}
        copies: list[tuple[int, bytes | None, Headers]] = []  # (row, value, headers) of the reply copies
        if replies:  # before any of the batch's records is produced, so that no span completes without them
            for p, n in zip(*np.unique(batch.partitions[list(replies)], return_counts=True), strict=True):
                batch.deliveries[int(p)].expect(int(n))
        outputs = None
        if begun.flight is not None:
            reached = len(decoded)
            ok_rows, outputs, poison = self._infer_isolating(begun.inputs, begun.flight)
            failed = [DeadRecord(int(decoded.index[row]), "model",
                                 "out-of-memory" if isinstance(err, DeviceMemoryError) else "model-error", err)
                      for row, err in poison]
            if self.policy.dlq_topic is not None:  # without one, a failed record stops the worker (_dead_letter)
                first = failed[0].index if failed else 0
                self.breaker.record(reached, len(failed), (int(batch.partitions[first]), int(batch.offsets[first])))
            dead += failed
            if poison:
                decoded = decoded.take(ok_rows)
        if self._trace is not None and carried:  # before any of its records is produced, as the replies
            self._trace(begun, carried, dead)
        if outputs is not None:
            self._publish_predictions(batch, decoded, outputs, replies, copies, carried)
        if dead:
            dead.sort(key=lambda d: d.index)  # input-offset order per partition, whatever the stage
            self._dead_letter(batch, dead, replies, copies, carried)
        if len(copies) != len(replies):  # each is expected by its span: one missing would hold it forever
            raise StreamError(f"internal: {len(replies)} records to reply to, {len(copies)} replies made")
        if copies:
            tokens = begun.prepared.tokens if begun.prepared is not None else None
            usage = dict(zip(begun.decoded.index.tolist(), tokens.tolist(), strict=True)) if tokens is not None else {}
            self._send_replies(batch, replies, copies, usage, carried)
        self._publisher.send_now()

    # ------------------------------------------------------------------ model, with poison isolation
    def _infer_isolating(self, inputs: dict[str, Any], flight: InFlight | None = None
                         ) -> tuple[np.ndarray, dict[str, np.ndarray], list[tuple[int, ModelError]]]:
        """Run the batch (``flight``: its first attempt, already submitted); on a model error retry with backoff,
        then bisect to isolate failing rows.

        Returns (rows that succeeded, their outputs in row order, [(row, error)] for the poison rows).
        """
        ok: list[np.ndarray] = []
        parts: list[dict[str, np.ndarray]] = []
        poison: list[tuple[int, ModelError]] = []
        pending = [(0, input_rows(inputs), True)]  # (start, stop, retry whole) in row order, stack
        while pending:
            start, stop, retry = pending.pop()
            try:
                result = self._run(take_inputs(inputs, start, stop), self.policy.model_retries if retry else 0,
                                   flight)
            except UnrecoverableModelError:
                raise
            except ModelError as exc:
                if stop - start == 1:
                    poison.append((start, exc))
                    log.warning("poison record isolated at row %d: %s", start, exc)
                else:
                    mid = (start + stop) // 2
                    # Out of device memory: the halves are not suspects, they get the whole batch's retries.
                    whole = isinstance(exc, DeviceMemoryError)
                    if whole:
                        self._metrics.oom_splits.inc()
                        log.warning("%s; splitting it in two", exc)
                        self._engine.release_cached_memory()
                    pending += [(mid, stop, whole), (start, mid, whole)]  # left half first
                continue
            finally:
                flight = None  # only the whole batch's first attempt was submitted ahead
            ok.append(np.arange(start, stop))
            parts.append(result)
        if not parts:
            return np.zeros(0, dtype=np.int64), {o.name: np.zeros(0) for o in self._engine.handler.outputs}, poison
        if len(parts) == 1:  # the batch in one run, as nearly always: its outputs as they are, not a copy of them
            return ok[0], parts[0], poison
        outputs = {f: np.concatenate([p[f] for p in parts]) for f in parts[0]}
        return np.concatenate(ok), outputs, poison

    def _run(self, inputs: dict[str, Any], retries: int, flight: InFlight | None = None) -> dict[str, np.ndarray]:
        attempt = 0
        while True:
            try:
                result = self._engine.result(flight if flight is not None else self._engine.submit(inputs))
                self._metrics.inference_seconds.observe(result.seconds)
                return result.outputs
            except (UnrecoverableModelError, DeviceMemoryError):
                raise  # the same batch would not fit again: its caller splits it
            except ModelError as exc:
                if attempt >= retries:
                    raise
                attempt += 1
                self._metrics.model_retries.inc()
                delay_s = self.policy.retry_backoff_ms / 1000.0 * 2 ** (attempt - 1)
                log.warning("model error (retry %d/%d in %.0f ms): %s", attempt, retries, delay_s * 1000, exc)
                self._sleep(delay_s)
            finally:
                flight = None

    # ------------------------------------------------------------------ publishing
    def _carried(self, watched: dict[int, AddressHeaders]) -> dict[int, Headers]:
        """{row: the headers it carries onto what it produces} of the rows that have any."""
        names = self.policy.carried
        out: dict[int, Headers] = {}
        for row, values in watched.items():
            hdrs = carried_of(values, names)
            if hdrs:
                out[row] = hdrs
        return out

    def _publish_predictions(self, batch: Dispatched, decoded: Columns, outputs: dict[str, np.ndarray],
                             replies: dict[int, Reply], copies: list[tuple[int, bytes | None, Headers]],
                             carried: dict[int, Headers]) -> None:
        if not len(decoded):
            return
        records = batch.records
        handler = self._engine.handler
        for spec in handler.outputs:
            if spec.type in _SCALAR_TYPES:
                self._metrics.prediction_values.observe_many(spec.name, outputs[spec.name])
        row_partitions = batch.partitions[decoded.index]
        row_offsets = batch.offsets[decoded.index]
        if self.policy.event_time_field is not None:
            event_ts = decoded[self.policy.event_time_field].values
            for partition, delivery in batch.deliveries.items():
                delivery.ts_ms = event_ts[row_partitions == partition]
        deliveries = batch.deliveries
        keys = records.keys if len(decoded) == len(records) else [records.keys[i] for i in decoded.index.tolist()]
        source = InputSource(self.policy.input_topic, row_partitions, row_offsets)
        now_ms = int(time.time() * 1000)
        reply_rows = np.flatnonzero(np.isin(decoded.index, list(replies))).tolist() if replies else []
        # {position among the predictions: its carried headers} of the records carrying a trace context
        traced = {j: carried[row] for j, row in enumerate(decoded.index.tolist()) if row in carried} \
            if carried else {}
        if not self._provenance_headers:
            # One buffer for the whole batch; the native producer takes it as is (no bytes object per record), the
            # records carrying a trace context with their headers, in order among the others.
            joined, ends = self._encoder.encode_joined(
                decoded, outputs, model_name=handler.name, model_version=handler.version, predicted_ts_ms=now_ms,
                batch_size=len(records), source=source)
            self._publisher.produce_joined(self.policy.output_topic, joined, ends, keys, row_partitions, deliveries,
                                           traced or None)  # type: ignore[arg-type]
            for j in reply_rows:
                start = int(ends[j - 1]) if j else 0
                copies.append((int(decoded.index[j]), bytes(joined[start:int(ends[j])]), []))
            return
        payloads = self._encoder.encode_batch(
            decoded, outputs, model_name=handler.name, model_version=handler.version, predicted_ts_ms=now_ms,
            batch_size=len(records), source=source)
        parts = row_partitions.tolist()
        # Three headers cost a record ~1 µs of producer CPU, about as much as the rest of produce().
        topic_header = (HEADER_TOPIC, self._topic_header)
        partition_headers = {p: (HEADER_PARTITION, b"%d" % p) for p in deliveries}
        headers: list[Headers | None] = [[topic_header, partition_headers[p], (HEADER_OFFSET, b"%d" % o)]
                                         for p, o in zip(parts, row_offsets.tolist(), strict=True)]
        for j, extra in traced.items():
            headers[j] = [*(headers[j] or ()), *extra]
        callbacks = [deliveries[p] for p in parts]
        self._publisher.produce_many(self.policy.output_topic, payloads, keys, headers, callbacks)
        copies += [(int(decoded.index[j]), payloads[j], []) for j in reply_rows]

    def _dead_letter(self, batch: Dispatched, dead: list[DeadRecord], replies: dict[int, Reply],
                     copies: list[tuple[int, bytes | None, Headers]], carried: dict[int, Headers]) -> None:
        records = batch.records
        first = dead[0]
        if self.policy.dlq_topic is None:
            err = first.error
            partition, offset = int(batch.partitions[first.index]), int(batch.offsets[first.index])
            if isinstance(err, DecodeError):
                err = err.at(self.policy.input_topic, partition, offset)
            raise StoppedOnPurpose("no-dlq-topic", f"bad record and no --dlq-topic to send it to ({first.stage}): "
                                                   f"{err}", partition, offset) from err
        rejected = [d for d in dead if d.stage == "decode"]
        if rejected:
            last = rejected[-1].index
            self.rejected.record([d.reason for d in rejected], (int(batch.partitions[last]), int(batch.offsets[last])))
        handler = self._engine.handler
        values: list[bytes | None] = []
        keys: list[bytes | None] = []
        headers: list[Headers] = []
        callbacks: list[SpanDelivery] = []
        for d in dead:
            p = int(batch.partitions[d.index])
            raw = records.value(d.index)
            oversized = raw is not None and len(raw) > self.policy.max_input_bytes
            message = str(d.error)[:1000]
            hdrs: Headers = [
                *self._provenance(p, int(batch.offsets[d.index])), (DLQ_STAGE, d.stage.encode()),
                (DLQ_ERROR_CLASS, type(d.error).__name__.encode()), (DLQ_ERROR_REASON, d.reason.encode()),
                (DLQ_ERROR_MESSAGE, message.encode("utf-8", "replace")),
                (DLQ_VALUE_BYTES, b"%d" % (len(raw) if raw is not None else -1)),
            ]
            if d.stage == "model":
                hdrs.append((DLQ_MODEL, f"{handler.name}:{handler.version}".encode()))
            hdrs += carried.get(d.index, ())
            # The original bytes travel with the error, except an oversized value (its size is in a header).
            values.append(None if oversized else raw)
            keys.append(records.keys[d.index])
            headers.append(hdrs)
            if d.index in replies:
                copies.append((d.index, values[-1], hdrs))
            delivery = batch.deliveries[p]
            delivery.dead_letter()
            callbacks.append(delivery)
            self._metrics.dead_letters.labels(d.stage, d.reason).inc()
        self._publisher.produce_many(self.policy.dlq_topic, values, keys, headers, callbacks)

    def _send_replies(self, batch: Dispatched, replies: dict[int, Reply],
                      copies: list[tuple[int, bytes | None, Headers]], usage: dict[int, int],
                      carried: dict[int, Headers]) -> None:
        """A copy of each reply-addressed record's prediction or dead-letter record to its address, with the
        headers naming its request (`stream.kafka.replies.Reply`), the input record's provenance and carried
        headers and, when the model reported it (``usage``: {row: tokens}), the tokens it took
        (``stream.usage.tokens``); acknowledged as part of its span."""
        by_topic: dict[str, list[tuple[int, bytes | None, Headers]]] = {}
        for copy in copies:
            by_topic.setdefault(replies[copy[0]].topic, []).append(copy)
        for topic, some in by_topic.items():
            headers: list[Headers | None] = []
            for row, _value, hdrs in some:
                # a dead letter's headers (provenance and carried among them), else a prediction's
                provenance = hdrs or [*self._provenance(int(batch.partitions[row]), int(batch.offsets[row])),
                                      *carried.get(row, ())]
                used = usage.get(row)
                headers.append([*replies[row].headers, *provenance,
                                *(() if used is None else ((USAGE_TOKENS_HEADER, b"%d" % used),))])
            self._publisher.produce_many(
                topic, [v for _, v, _ in some], [batch.records.keys[row] for row, _, _ in some], headers,
                [batch.deliveries[int(batch.partitions[row])] for row, _, _ in some],
                partitions=[replies[row].partition for row, _, _ in some])
        self._metrics.replies.labels("sent").inc(len(copies))

    def _provenance(self, partition: int, offset: int) -> Headers:
        """The ``stream.input.*`` headers naming one input record (a dead letter's, a reply copy's)."""
        return [(HEADER_TOPIC, self._topic_header), (HEADER_PARTITION, b"%d" % partition),
                (HEADER_OFFSET, b"%d" % offset)]
