"""Reply addresses: how a caller that waits gets the prediction of its own input record. Two styles:

* this project's own (the gateway, `stream.gateway.client`): a header ``stream.reply`` whose value is
  ``<topic>:<partition>:<id>``: the reply topic, the partition of it that caller reads, and a correlation id of its
  choosing (ASCII, no colon needed: everything after the second colon is the id; topic names cannot hold a colon).
  The reply carries the same header.
* Spring Kafka's (``ReplyingKafkaTemplate``): ``kafka_replyTopic`` (the topic's name), optionally
  ``kafka_replyPartition`` (a 4-byte big-endian int; without it the reply goes where the producer's partitioner
  puts its key), and ``kafka_correlationId`` (any bytes), which the reply carries back byte for byte. A record with
  both styles is answered in this project's.

The worker publishes the record's prediction (or its dead-letter record) to the output (or dead-letter) topic as
always, and a copy of it to that address; under exactly-once, in the same transaction. A dead-letter copy carries
the dead-letter headers (``stream.dlq.stage`` and the rest), which a caller tests to tell an error from a
prediction. The input offsets are committed only once the copy is acknowledged too, so a worker that dies before
replying leaves the record to the next one, which replies in its stead.

A worker only replies to the topics it is told to (``--reply-topics``; by default ``<input topic>.replies``): any
other address is logged, counted (``stream_replies_total{outcome="refused"}``) and not answered, so that a
producer of input records cannot make the worker write to a topic of its choosing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from stream.logs import Throttle

log = logging.getLogger(__name__)

REPLY_HEADER = "stream.reply"
SPRING_REPLY_TOPIC = "kafka_replyTopic"
SPRING_REPLY_PARTITION = "kafka_replyPartition"
SPRING_CORRELATION_ID = "kafka_correlationId"
# A reply address's headers: the first the consumer hands over per record (`stream.kafka.records.Records.replies`).
ADDRESS_HEADERS = (REPLY_HEADER, SPRING_REPLY_TOPIC, SPRING_REPLY_PARTITION, SPRING_CORRELATION_ID)
# W3C trace context: carried from an input record onto its prediction, dead letter and reply copy, with the
# operator's --copy-headers after it.
TRACE_HEADERS = ("traceparent", "tracestate")
# One record's values of the watched headers (`watched_headers`: the last of each name; None: absent), then its
# Kafka timestamp in ms (None: it has none) and when the consumer took it (wall clock, ns): `record_times`.
AddressHeaders = tuple["bytes | int | None", ...]


def carried_headers(copy_headers: Sequence[str] = ()) -> tuple[str, ...]:
    """The headers an input record passes on to what it produces: the trace context, then ``copy_headers``."""
    return TRACE_HEADERS + tuple(dict.fromkeys(h for h in copy_headers if h not in TRACE_HEADERS))


def watched_headers(copy_headers: Sequence[str] = ()) -> tuple[str, ...]:
    """The headers whose values the consumer hands over per record: a reply address's, then the carried ones."""
    return ADDRESS_HEADERS + carried_headers(copy_headers)


def carried_of(values: AddressHeaders, names: Sequence[str]) -> list[tuple[str, str | bytes | None]]:
    """A record's carried headers (``names``, after the address's in ``values``) that it has."""
    # (a shorter tuple, an address's alone, has none)
    return [(name, v) for name, v in zip(names, values[len(ADDRESS_HEADERS):], strict=False)
            if isinstance(v, bytes)]


def record_times(values: AddressHeaders) -> tuple[int | None, int | None]:
    """A record's Kafka timestamp (ms) and when the consumer took it (ns): the two values after its headers'
    (which are bytes or None, never ints); (None, None) for a tuple without them."""
    if len(values) < 2 or not isinstance(values[-1], int):
        return None, None
    ts_ms = values[-2]
    return (ts_ms if isinstance(ts_ms, int) else None), values[-1]
ANY_PARTITION = -1  # a reply partition left to the producer's partitioner
# On a reply: the tokens the model took of its input (decimal ASCII), when the model reports them (a text model's
# ``prepare`` does: `stream.pipeline.inference.ModelHandler`); the gateway's OpenAI route sums them as its usage.
USAGE_TOKENS_HEADER = "stream.usage.tokens"


@dataclass(frozen=True)
class ReplyAddress:
    topic: str
    partition: int
    correlation_id: str

    def encode(self) -> bytes:
        return f"{self.topic}:{self.partition}:{self.correlation_id}".encode()

    @classmethod
    def parse(cls, raw: bytes) -> ReplyAddress:
        """The address in a ``stream.reply`` header's value; ValueError naming what is wrong."""
        try:
            topic, partition, correlation_id = raw.decode("ascii").split(":", 2)
        except (UnicodeDecodeError, ValueError):
            raise ValueError(f"reply address {raw[:200]!r} is not <topic>:<partition>:<id> in ASCII") from None
        if not topic or not partition.isdigit() or not correlation_id:
            raise ValueError(f"reply address {raw[:200]!r} is not <topic>:<partition>:<id>")
        return cls(topic, int(partition), correlation_id)


@dataclass(frozen=True)
class Reply:
    """Where one record's reply goes, and the headers that tell its caller which request it answers."""

    topic: str
    partition: int  # ANY_PARTITION: where the partitioner puts the record's key
    headers: tuple[tuple[str, bytes], ...]


def parse_reply(values: AddressHeaders) -> Reply | None:
    """The reply a record asks for by its ADDRESS_HEADERS values; None when it asks for none (a Spring correlation
    id alone); ValueError naming what is wrong with an address."""
    own, topic, partition, correlation = (v if isinstance(v, bytes) else None for v in values[:len(ADDRESS_HEADERS)])
    if own is not None:
        address = ReplyAddress.parse(own)
        return Reply(address.topic, address.partition, ((REPLY_HEADER, own),))
    if topic is None:
        return None
    try:
        name = topic.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{SPRING_REPLY_TOPIC} {topic[:200]!r} is not UTF-8") from None
    if not name:
        raise ValueError(f"{SPRING_REPLY_TOPIC} is empty")
    at = ANY_PARTITION
    if partition is not None:
        if len(partition) != 4 or int.from_bytes(partition, "big", signed=True) < 0:
            raise ValueError(f"{SPRING_REPLY_PARTITION} {partition[:20]!r} is not a 4-byte big-endian partition number")
        at = int.from_bytes(partition, "big")
    return Reply(name, at, () if correlation is None else ((SPRING_CORRELATION_ID, correlation),))


_WARNED_KINDS = 1000  # `ReplyRouter._warn_once`: kinds of refused address each logged once
_PAST_CAP_EVERY_S = 60.0


class ReplyRouter:
    """The worker's side: which records of a batch get a reply copy, and where.

    ``partitions_of(topic)`` says how many partitions a topic has (None: it does not exist); it is asked at most
    once per topic every ``refresh_s``, so a reply topic created or grown later is seen within that time."""

    def __init__(self, topics: frozenset[str], partitions_of: Callable[[str], int | None],
                 on_refused: Callable[[int], None], clock: Callable[[], float] = time.monotonic,
                 refresh_s: float = 30.0) -> None:
        self.topics = topics
        self._partitions_of = partitions_of
        self._on_refused = on_refused
        self._clock = clock
        self._refresh_s = refresh_s
        self._known: dict[str, tuple[int | None, float]] = {}  # topic -> (partitions, when asked)
        self._warned: set[str] = set()
        self._past_cap = Throttle(_PAST_CAP_EVERY_S)  # the WARNINGs past `_WARNED_KINDS` kinds

    def route(self, replies: dict[int, AddressHeaders]) -> dict[int, Reply]:
        """{row: its reply} of the rows asking for one whose address is allowed and exists."""
        routed: dict[int, Reply] = {}
        refused = 0
        for row, values in replies.items():
            try:
                reply = parse_reply(values)
            except ValueError as exc:
                refused += 1
                self._warn_once("malformed", f"{exc}: the record is processed, no reply is sent")
                continue
            if reply is None:
                continue
            if reply.topic not in self.topics:
                refused += 1
                self._warn_once(f"topic:{reply.topic}",
                                f"reply address names topic {reply.topic!r}, not one of --reply-topics "
                                f"({', '.join(sorted(self.topics))}): no reply is sent")
                continue
            partitions = self._partitions(reply.topic)
            if partitions is None or reply.partition >= partitions:
                refused += 1
                self._warn_once(f"partition:{reply.topic}:{reply.partition}",
                                f"reply address names partition {reply.partition} of {reply.topic!r}, which "
                                f"{'does not exist' if partitions is None else f'has {partitions}'}: no reply is "
                                "sent")
                continue
            routed[row] = reply
        if refused:
            self._on_refused(refused)
        return routed

    def _partitions(self, topic: str) -> int | None:
        now = self._clock()
        known = self._known.get(topic)
        if known is None or now - known[1] >= self._refresh_s:
            known = (self._partitions_of(topic), now)
            self._known[topic] = known
        return known[0]

    def _warn_once(self, what: str, message: str) -> None:
        """A WARNING the first time a kind of refusal is met; past `_WARNED_KINDS` kinds (a producer writing a new
        address into every record), at most one a `_PAST_CAP_EVERY_S`, naming the refusal it met and how many
        went unlogged: a misconfigured caller met after such a flood is still named in the log."""
        if what in self._warned:
            return
        if len(self._warned) < _WARNED_KINDS:
            self._warned.add(what)
            log.warning("%s", message)
            return
        unlogged = self._past_cap.due(self._clock())
        if unlogged is None:
            return
        log.warning("%s (%d refused reply address(es) not logged before this one: past %d kinds, one of these "
                    "lines a minute at most; stream_replies_total{outcome=\"refused\"} counts them all)", message,
                    unlogged, _WARNED_KINDS)
