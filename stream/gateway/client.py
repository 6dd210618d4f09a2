"""The caller's side of the durable queue: ``submit(event) -> Future`` of its prediction.

`PredictionClient` encodes an event with the input schema (validated first: a refused event never reaches the
topic), produces it to the input topic with a reply address (`stream.kafka.replies`: this client's reply topic and
partition, and a correlation id), and reads its reply partition, and only that one, from the end it had at
start: each reply settles the future of its correlation id with the prediction record (a dict, as the output
schema decodes it) or with `DeadLettered`. A future not settled within ``timeout_s`` of its submission fails with
`RequestTimeout`, naming the input record's partition and offset when the broker acknowledged it: the record is
durable, a worker will still predict it, and its prediction will be in the output topic.

One background thread serves the producer's delivery reports, reads replies and expires futures; a second one
checks every two seconds that the brokers answer (``ready``). The gateway (`stream.gateway.app`) is one user;
a service that talks to Kafka itself is another.
"""

from __future__ import annotations

import base64
import itertools
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from io import BytesIO
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from fastavro import parse_schema, schemaless_writer
from fastavro.validation import ValidationError, validate

from stream.codec import MAGIC, strip_logical_types
from stream.codec.registry import SchemaSource, WireDecoder, WriterSchema
from stream.errors import StreamError
from stream.kafka.publish import DLQ_ERROR_MESSAGE, DLQ_ERROR_REASON, DLQ_STAGE, HEADER_OFFSET, HEADER_PARTITION
from stream.kafka.replies import REPLY_HEADER, USAGE_TOKENS_HEADER, ReplyAddress
from stream.ops.verify import headers_of

log = logging.getLogger(__name__)
_NOT_YET = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART)


class Refused(ValueError):
    """The event was not sent: the input schema refuses it (``problems``: which field, why)."""

    def __init__(self, message: str, problems: list[str]) -> None:
        super().__init__(message)
        self.problems = problems


class Oversized(ValueError):
    """The event was not sent: encoded, it is larger than ``max_input_bytes`` (the workers would dead-letter it)."""


class Overloaded(StreamError):
    """The event was not sent: ``max_pending`` requests are already waiting for their predictions."""


class NotSent(StreamError):
    """The broker did not acknowledge the event (its error says why); no worker will see it."""


@dataclass(frozen=True)
class RequestTimeout(StreamError):
    """No reply within the timeout. With ``offset`` set the record is durable in the input topic at
    ``partition``/``offset`` and will still be predicted (into the output topic)."""

    timeout_s: float
    partition: int | None
    offset: int | None

    def __str__(self) -> str:
        where = (f"the event is at partition {self.partition}, offset {self.offset} of the input topic and will "
                 "still be predicted into the output topic" if self.offset is not None
                 else "the broker had not acknowledged the event")
        return f"no prediction within {self.timeout_s * 1000:.0f} ms; {where}"


@dataclass(frozen=True)
class DeadLettered(StreamError):
    """A worker could not predict the event and sent it to the dead-letter topic (``stage``: decode or model)."""

    stage: str
    reason: str
    message: str
    partition: int | None
    offset: int | None

    def __str__(self) -> str:
        return f"dead-lettered at the {self.stage} stage ({self.reason}): {self.message}"


@dataclass(frozen=True)
class Prediction:
    record: dict[str, Any]  # the output record, JSON-ready (bytes as base64)
    partition: int  # the input record's partition and offset
    offset: int
    tokens: int | None = None  # the tokens the model took of the event, when it reports them


@dataclass
class _Pending:
    future: Future[Prediction]
    partition: int | None = None  # where the event is in the input topic, once known
    offset: int | None = None


def _settle(future: Future[Prediction], result: Prediction | None = None,
            error: BaseException | None = None) -> None:
    """Settle a future its caller may have cancelled meanwhile."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]
    except InvalidStateError:
        pass


def _json_ready(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_ready(v) for v in value]
    return value


def _problems(exc: ValidationError) -> list[str]:
    """fastavro's validation errors, one line each: the field's path and why."""
    out = []
    for err in exc.errors:
        path = getattr(err, "field", None) or "the event"
        datum = getattr(err, "datum", None)
        schema = getattr(err, "schema", None)
        expected = schema.get("type") if isinstance(schema, dict) else schema
        out.append(f"{path}: {datum!r:.80} is not {expected}" if expected is not None else str(err))
    return out or [str(exc)]


class PredictionClient:
    """Events in, futures of their predictions out (see the module's docstring). Thread-safe ``submit``."""

    def __init__(self, *, bootstrap_servers: str, input_topic: str, reply_topic: str, reply_partition: int,
                 source: SchemaSource, input_schema: WriterSchema, timeout_s: float = 5.0,
                 max_pending: int = 10_000, max_input_bytes: int = 1_048_576,
                 producer_config: Mapping[str, Any] | None = None,
                 consumer_config: Mapping[str, Any] | None = None) -> None:
        if input_schema.schema_id < 0:
            raise StreamError("the input schema must be registered (it has no id to put in the wire format)")
        self.input_topic = input_topic
        self.address_prefix = f"{reply_topic}:{reply_partition}:"
        self.reply = TopicPartition(reply_topic, reply_partition)
        self.timeout_s = timeout_s
        self.max_pending = max_pending
        self.max_input_bytes = max_input_bytes
        self._source = source
        self._schema: Any = parse_schema(strip_logical_types(input_schema.normalized))
        self.schema_name = input_schema.name
        self._header = bytes([MAGIC]) + input_schema.schema_id.to_bytes(4, "big")
        self._decode = WireDecoder(source)
        self._ids = (f"{uuid.uuid4().hex[:12]}-{n}" for n in itertools.count())
        self._pending: dict[str, _Pending] = {}
        self._deadlines: deque[tuple[float, str]] = deque()  # in submission order, hence in deadline order
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._reachable = False
        self._closing = False
        self.replies_read = 0  # replies read from the reply partition (this client's or not)
        self.foreign_replies = 0  # of those, replies to no request of this client's (another's, or expired)
        self._producer = Producer({"bootstrap.servers": bootstrap_servers, "enable.idempotence": True,
                                   "acks": "all", "linger.ms": 2, "error_cb": self._on_error,
                                   **(producer_config or {})})
        self._consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"gateway-{uuid.uuid4()}",
                                   "enable.auto.commit": False, "fetch.wait.max.ms": 10,
                                   "fetch.queue.backoff.ms": 10, "error_cb": self._on_error,
                                   **(consumer_config or {})})
        # Read from the end the partition has now, before any request can be sent: a reply to a request sent
        # after this cannot be skipped (OFFSET_END would be resolved later, possibly after such a reply).
        deadline = time.monotonic() + 30.0
        while True:
            try:
                _low, high = self._consumer.get_watermark_offsets(self.reply, timeout=10)
                break
            except KafkaException as exc:  # a topic just created: its leader may not be known yet
                err = exc.args[0]
                if (not err.retriable() and err.code() not in _NOT_YET) or time.monotonic() > deadline:
                    self._consumer.close()
                    raise StreamError(f"reply partition {reply_topic}[{reply_partition}]: {err}") from exc
                time.sleep(0.2)
        self._consumer.assign([TopicPartition(reply_topic, reply_partition, high if high >= 0 else OFFSET_END)])
        self._thread = threading.Thread(target=self._serve, name="gateway-replies", daemon=True)
        self._thread.start()
        self._checker = threading.Thread(target=self._check_brokers, name="gateway-brokers", daemon=True)
        self._checker.start()

    # -- callers ---------------------------------------------------------------------------------------------
    def encode(self, event: Mapping[str, Any]) -> bytes:
        """The event in the wire format the workers read; `Refused` or `Oversized` when it cannot be sent."""
        if not isinstance(event, Mapping):
            raise Refused("an event is a JSON object of its fields", [f"got {type(event).__name__}"])
        try:
            validate(dict(event), self._schema, raise_errors=True)
        except ValidationError as exc:
            raise Refused(f"the event does not match the input schema {self.schema_name}",
                          _problems(exc)) from None
        out = BytesIO()
        out.write(self._header)
        schemaless_writer(out, self._schema, dict(event))
        value = out.getvalue()
        if len(value) > self.max_input_bytes:
            raise Oversized(f"the event is {len(value)} bytes encoded, over --max-input-bytes "
                            f"{self.max_input_bytes}")
        return value

    def submit(self, event: Mapping[str, Any], key: bytes | None = None) -> Future[Prediction]:
        """Send one event; the future settles with its `Prediction`, or `DeadLettered`, `RequestTimeout`,
        `NotSent`. Raises `Refused`, `Oversized`, `Overloaded` at once (nothing sent)."""
        value = self.encode(event)
        return self.submit_encoded(value, key)

    def submit_encoded(self, value: bytes, key: bytes | None = None) -> Future[Prediction]:
        if self._stop.is_set():
            raise Overloaded("the client is closing")
        future: Future[Prediction] = Future()
        now = time.monotonic()
        with self._lock:
            if len(self._pending) >= self.max_pending:
                raise Overloaded(f"{len(self._pending)} requests are waiting for their predictions "
                                 f"(--max-pending {self.max_pending})")
            correlation = next(self._ids)
            self._pending[correlation] = _Pending(future)
            self._deadlines.append((now + self.timeout_s, correlation))
        address = (self.address_prefix + correlation).encode()
        try:
            self._producer.produce(self.input_topic, value, key, headers=[(REPLY_HEADER, address)],
                                   on_delivery=lambda err, msg: self._delivered(correlation, err, msg))
        except (BufferError, KafkaException) as exc:
            with self._lock:
                self._pending.pop(correlation, None)
            raise Overloaded(f"the producer refused the event: {exc}") from exc
        return future

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def ready(self) -> bool:
        """The brokers answered within the last few seconds and the client is not closing."""
        return self._reachable and not self._stop.is_set() and self._thread.is_alive()

    def alive(self) -> bool:
        return self._thread.is_alive() or self._stop.is_set()

    def close(self, wait_s: float = 10.0) -> int:
        """Take no more events; wait up to ``wait_s`` for the pending ones (each also ends at its own timeout);
        then stop. Returns how many were still pending (they fail with `RequestTimeout`)."""
        deadline = time.monotonic() + wait_s
        self._stop.set()
        while self.pending and time.monotonic() < deadline:
            time.sleep(0.01)
        self._closing = True
        self._thread.join(timeout=5)
        left = self._expire(float("inf"))
        self._producer.flush(5)
        self._consumer.close()
        return left

    # -- the background threads -------------------------------------------------------------------------------
    def _serve(self) -> None:
        while not self._closing:
            try:
                self._producer.poll(0)
                # poll() returns at the first reply (consume(n, t) would wait for n or t): then take what else is
                # there without waiting.
                first = self._consumer.poll(0.02)
                messages = [] if first is None else [first, *self._consumer.consume(500, 0)]
                self._producer.poll(0)  # the delivery reports of the events these replies answer, first
                for msg in messages:
                    err = msg.error()
                    if err is None:
                        self._reply(msg)
                    elif err.code() != KafkaError._PARTITION_EOF:
                        log.warning("reply partition: %s", err)
                self._expire(time.monotonic())
            except Exception:  # a bad reply must not stop every caller's answers
                log.exception("serving replies")

    def _check_brokers(self) -> None:
        while not self._stop.wait(2.0 if self._reachable else 0.5):
            try:
                self._producer.list_topics(self.input_topic, timeout=2)
                self._reachable = True
            except KafkaException:
                self._reachable = False
        self._reachable = False

    def _on_error(self, err: KafkaError) -> None:
        if err.code() == KafkaError._ALL_BROKERS_DOWN:
            self._reachable = False
        log.warning("gateway client: %s", err)

    def _delivered(self, correlation: str, err: KafkaError | None, msg: Message) -> None:
        with self._lock:
            pending = self._pending.get(correlation)
            if pending is None:
                return
            if err is not None:
                del self._pending[correlation]
            else:
                pending.partition, pending.offset = msg.partition(), msg.offset()
        if err is not None:
            _settle(pending.future, error=NotSent(f"the broker did not take the event: {err}"))

    def _reply(self, msg: Message) -> None:
        self.replies_read += 1
        headers = headers_of(msg)
        raw = headers.get(REPLY_HEADER)
        try:
            correlation = ReplyAddress.parse(raw).correlation_id if raw is not None else None
        except ValueError:
            correlation = None
        with self._lock:
            pending = self._pending.pop(correlation, None) if correlation is not None else None
        if pending is None:
            self.foreign_replies += 1
            return
        # Where the event is in the input topic: the worker's provenance headers on the copy (the producer's
        # delivery report may not have been served yet).
        if HEADER_OFFSET in headers and HEADER_PARTITION in headers:
            pending.partition, pending.offset = int(headers[HEADER_PARTITION]), int(headers[HEADER_OFFSET])
        if DLQ_STAGE in headers:
            _settle(pending.future, error=DeadLettered(
                headers[DLQ_STAGE].decode(), headers.get(DLQ_ERROR_REASON, b"").decode(),
                headers.get(DLQ_ERROR_MESSAGE, b"").decode("utf-8", "replace"), pending.partition, pending.offset))
            return
        try:
            record = self._decode(msg.value() or b"")
        except Exception as exc:  # the caller learns why its reply could not be read
            _settle(pending.future, error=StreamError(f"the prediction could not be decoded: {exc}"))
            return
        partition = pending.partition if pending.partition is not None else -1
        offset = pending.offset if pending.offset is not None else -1
        used = headers.get(USAGE_TOKENS_HEADER)
        tokens = int(used) if used is not None and used.isdigit() else None
        _settle(pending.future, Prediction(_json_ready(record), partition, offset, tokens))

    def _expire(self, now: float) -> int:
        expired = []
        with self._lock:
            deadlines = self._deadlines
            while deadlines and deadlines[0][0] <= now:
                pending = self._pending.pop(deadlines.popleft()[1], None)  # None: answered meanwhile
                if pending is not None:
                    expired.append(pending)
        for p in expired:
            _settle(p.future, error=RequestTimeout(self.timeout_s, p.partition, p.offset))
        return len(expired)

