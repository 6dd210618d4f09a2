"""Reply addresses: how a caller that waits (the gateway, `stream.gateway.client`) gets the prediction of its own
input record.

The caller produces the input record with a header ``stream.reply`` whose value is ``<topic>:<partition>:<id>``:
the reply topic, the partition of it that caller reads, and a correlation id of its choosing (ASCII, no colon
needed: everything after the second colon is the id; topic names cannot hold a colon). The worker publishes the
record's prediction (or its dead-letter record) to the output (or dead-letter) topic as always, and a copy of it to
that topic and partition, carrying the same header; under exactly-once, in the same transaction. The input
offsets are committed only once the copy is acknowledged too, so a worker that dies before replying leaves the
record to the next one, which replies in its stead.

A worker only replies to the topics it is told to (``--reply-topics``; by default ``<input topic>.replies``): any
other address is logged, counted (``stream_replies_refused_total``) and not answered, so that a producer of input
records cannot make the worker write to a topic of its choosing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

REPLY_HEADER = "stream.reply"


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

    def route(self, replies: dict[int, bytes]) -> dict[int, tuple[ReplyAddress, bytes]]:
        """{row: (its address, the header's raw value)} of the rows whose address is allowed and exists."""
        routed: dict[int, tuple[ReplyAddress, bytes]] = {}
        refused = 0
        for row, raw in replies.items():
            try:
                address = ReplyAddress.parse(raw)
            except ValueError as exc:
                refused += 1
                self._warn_once("malformed", f"{exc}: the record is processed, no reply is sent")
                continue
            if address.topic not in self.topics:
                refused += 1
                self._warn_once(f"topic:{address.topic}",
                                f"reply address names topic {address.topic!r}, not one of --reply-topics "
                                f"({', '.join(sorted(self.topics))}): no reply is sent")
                continue
            partitions = self._partitions(address.topic)
            if partitions is None or address.partition >= partitions:
                refused += 1
                self._warn_once(f"partition:{address.topic}:{address.partition}",
                                f"reply address names partition {address.partition} of {address.topic!r}, which "
                                f"{'does not exist' if partitions is None else f'has {partitions}'}: no reply is "
                                "sent")
                continue
            routed[row] = (address, raw)
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
        if what not in self._warned and len(self._warned) < 1000:
            self._warned.add(what)
            log.warning("%s", message)
