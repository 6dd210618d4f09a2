"""The gateway's side of the durable queue: framed events in, futures of their predictions out.

`PredictionClient.send` produces events to the input topic with a reply address (`stream.kafka.replies`: this
client's reply topic and partition, and a correlation id), all of a request's or none: it refuses at once, nothing
sent, when ``max_pending`` events already wait or no worker serves the topic (`stream.gateway.presence`). It reads
its reply partition, and only that one, from the end it had at start: each reply settles the future of its
correlation id with the prediction record (a dict, as the output schema decodes it) or with `DeadLettered`. A
future not settled within ``timeout_s`` of its sending fails with `RequestTimeout`, naming the input record's
partition and offset when the broker acknowledged it: the record is durable, a worker will still predict it, and
its prediction will be in the output topic.

One background thread serves the producer's delivery reports, reads replies and expires futures; a second one
checks every two seconds that the brokers answer and whether a worker serves the topic (``ready``). What the
broker's client says when it refuses an event goes to the log, never to a caller.
"""

from __future__ import annotations

import base64
import functools
import itertools
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from stream.codec.registry import SchemaSource, WireDecoder
from stream.errors import StreamError
from stream.gateway.errors import (
    BadReply,
    NotSent,
    NoWorkers,
    Overloaded,
    Oversized,
    RequestTimeout,
    dead_lettered,
)
from stream.gateway.presence import WorkerPresence
from stream.kafka.publish import DLQ_ERROR_MESSAGE, DLQ_ERROR_REASON, DLQ_STAGE, HEADER_OFFSET, HEADER_PARTITION
from stream.kafka.records import MESSAGES_A_CONSUME
from stream.kafka.replies import REPLY_HEADER, USAGE_TOKENS_HEADER, ReplyAddress
from stream.ops.verify import headers_of

log = logging.getLogger(__name__)
_CHECK_JOIN_S = 20.0  # close: the most it waits for a presence check in flight (its requests' timeouts summed)
_REPLIES_A_ROUND = 512  # replies read between two rounds of expiring the calls past their deadline
_NOT_YET = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART)
_TOO_LARGE = (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE)


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


class PredictionClient:
    """Framed events in, futures of their predictions out (see the module's docstring). Thread-safe ``send``."""

    def __init__(self, *, bootstrap_servers: str, input_topic: str, reply_topic: str, reply_partition: int,
                 source: SchemaSource, timeout_s: float = 5.0, max_pending: int = 10_000,
                 worker_group: str | None = None, producer_config: Mapping[str, Any] | None = None,
                 consumer_config: Mapping[str, Any] | None = None,
                 admin_config: Mapping[str, Any] | None = None) -> None:
        self.input_topic = input_topic
        self.address_prefix = f"{reply_topic}:{reply_partition}:"
        self.reply = TopicPartition(reply_topic, reply_partition)
        self.timeout_s = timeout_s
        self.max_pending = max_pending
        self._decode = WireDecoder(source)
        self._ids = (f"{uuid.uuid4().hex[:12]}-{n}" for n in itertools.count())
        self._pending: dict[str, _Pending] = {}
        self._deadlines: deque[tuple[float, str]] = deque()  # in sending order, hence in deadline order
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
        self.presence = WorkerPresence(
            AdminClient({"bootstrap.servers": bootstrap_servers, **(admin_config or {})}), input_topic, worker_group)
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
        self.presence.check()  # before the first request
        self._thread = threading.Thread(target=self._serve, name="gateway-replies", daemon=True)
        self._thread.start()
        self._checker = threading.Thread(target=self._check_brokers, name="gateway-brokers", daemon=True)
        self._checker.start()

    # -- callers ---------------------------------------------------------------------------------------------
    def send(self, values: Sequence[bytes], keys: Sequence[bytes | None] | None = None,
             context: Sequence[tuple[str, bytes]] = ()) -> list[Future[Prediction]]:
        """Send every value (framed events) to the input topic, each future settling with its `Prediction`, or
        `DeadLettered`, `RequestTimeout`, `NotSent`, `BadReply`. Raises before anything is sent when
        ``max_pending`` would be passed (`Overloaded`), no worker serves the topic (`NoWorkers`) or the client is
        stopping; `Oversized` or `NotSent` (``sent``: the values before it went) when the broker's client refuses
        one. ``context``: headers every record carries besides its reply address (the trace context)."""
        self.check_room(len(values))
        now = time.monotonic()
        futures: list[Future[Prediction]] = []
        correlations = []
        with self._lock:
            if len(self._pending) + len(values) > self.max_pending:
                raise Overloaded(f"{len(self._pending)} events are waiting for their predictions (--max-pending "
                                 f"{self.max_pending}): try again shortly")
            for _ in values:
                correlation = next(self._ids)
                future: Future[Prediction] = Future()
                self._pending[correlation] = _Pending(future)
                self._deadlines.append((now + self.timeout_s, correlation))
                futures.append(future)
                correlations.append(correlation)
        for i, (value, correlation) in enumerate(zip(values, correlations, strict=True)):
            try:
                self._producer.produce(self.input_topic, value, keys[i] if keys else None,
                                       headers=[(REPLY_HEADER, (self.address_prefix + correlation).encode()),
                                                *context],
                                       on_delivery=functools.partial(self._delivered, correlation))
            except (BufferError, KafkaException) as exc:
                with self._lock:
                    for unsent in correlations[i:]:
                        self._pending.pop(unsent, None)
                code = exc.args[0].code() if isinstance(exc, KafkaException) else None
                if code in _TOO_LARGE:
                    raise Oversized("the event is larger than the broker takes (its message.max.bytes)", index=i,
                                    sent=i > 0) from exc
                log.warning("the producer refused an event: %s", exc)
                raise NotSent("the broker's client did not take the event: try again shortly", index=i,
                              sent=i > 0) from exc
        return futures

    def check_room(self, count: int) -> None:
        """Raise what `send` would for ``count`` events before sending anything: the client stopping, no worker
        serving, ``max_pending`` passed (a request refused under load costs no more than this)."""
        if self._stop.is_set():
            raise NotSent("the gateway is stopping")
        if not self.presence.serving():
            raise NoWorkers(self.presence.why_not())
        if self.pending + count > self.max_pending:
            raise Overloaded(f"{self.pending} events are waiting for their predictions (--max-pending "
                             f"{self.max_pending}): try again shortly")

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def ready(self) -> list[str]:
        """Why the gateway is not ready (empty: ready): the brokers did not answer within the last few seconds,
        no worker serves the topic, or the client is stopping."""
        if self._stop.is_set() or not self._thread.is_alive():
            return ["the gateway is stopping"]
        reasons = []
        if not self._reachable:
            reasons.append("the brokers do not answer")
        if not self.presence.serving():
            reasons.append(self.presence.why_not())
        return reasons

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
        # A presence check in flight: its admin requests are answered on librdkafka's background thread, which
        # calls into Python to settle them; an interpreter ending meanwhile crashed the gateway (SIGSEGV at exit).
        self._checker.join(timeout=_CHECK_JOIN_S)
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
                # there without waiting, a few at a time (a Message holds its record's headers parsed whole), up to
                # _REPLIES_A_ROUND before the expiries are served again.
                first = self._consumer.poll(0.02)
                messages = [] if first is None else [first]
                read = 0
                while messages:
                    self._producer.poll(0)  # the delivery reports of the events these replies answer, first
                    for msg in messages:
                        err = msg.error()
                        if err is None:
                            self._reply(msg)
                        elif err.code() != KafkaError._PARTITION_EOF:
                            log.warning("reply partition: %s", err)
                    read += len(messages)
                    messages = []  # let go before the next call
                    if read < _REPLIES_A_ROUND:
                        messages = self._consumer.consume(MESSAGES_A_CONSUME, 0)
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
            if self._reachable:
                self.presence.check()
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
            if err.code() in _TOO_LARGE:
                _settle(pending.future, error=Oversized("the event is larger than the input topic takes (its "
                                                        "max.message.bytes)"))
            else:
                log.warning("the broker did not take an event: %s", err)
                _settle(pending.future, error=NotSent("the broker did not take the event: try again shortly"))

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
        self.presence.replied()
        if pending is None:
            self.foreign_replies += 1
            return
        # Where the event is in the input topic: the worker's provenance headers on the copy (the producer's
        # delivery report may not have been served yet).
        if headers.get(HEADER_OFFSET, b"").isdigit() and headers.get(HEADER_PARTITION, b"").isdigit():
            pending.partition, pending.offset = int(headers[HEADER_PARTITION]), int(headers[HEADER_OFFSET])
        if DLQ_STAGE in headers:
            _settle(pending.future, error=dead_lettered(
                headers[DLQ_STAGE].decode("utf-8", "replace"), headers.get(DLQ_ERROR_REASON, b"").decode(
                    "utf-8", "replace"), headers.get(DLQ_ERROR_MESSAGE, b"").decode("utf-8", "replace"),
                pending.partition, pending.offset))
            return
        try:
            record = self._decode(msg.value() or b"")
        except Exception as exc:  # the deployment's fault: logged; the caller learns its reply was unreadable
            log.warning("a reply could not be decoded: %s", exc)
            _settle(pending.future, error=BadReply("the prediction could not be read (the gateway's log says why)"))
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

