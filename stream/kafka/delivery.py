"""One span's delivery state: its predictions, dead letters and reply copies counted down as the broker
acknowledges them, the publisher told once all are (`Publisher.span_done`); under exactly-once the transaction's
commit acknowledges the whole span at once."""

from __future__ import annotations

import logging
from typing import Any, Protocol

import numpy as np
from confluent_kafka import KafkaError, Message

from stream.errors import PublishError
from stream.kafka.offsets import Span

log = logging.getLogger(__name__)


class Publisher(Protocol):
    """What a span's delivery needs of `stream.kafka.publish.Publisher` (which imports this module)."""

    transactional: bool

    def record_failure(self, error: PublishError, msg: Message | None) -> None: ...

    def span_done(self, delivery: SpanDelivery) -> None: ...


class SpanDelivery:
    """The delivery state of one span, and its only writer: the delivery callback for its predictions (and dead
    letters), counting them down; the publisher's ``on_span_done`` is called once all are acknowledged."""

    __slots__ = ("_publisher", "dead", "span", "traced", "ts_ms")

    def __init__(self, publisher: Publisher, span: Span) -> None:
        self._publisher = publisher
        self.span = span
        self.ts_ms: np.ndarray | None = None  # event times of its predictions, for end-to-end latency
        self.dead = 0  # how many of the span's records went to the dead-letter topic
        # the open tracing spans of its records with a trace context (`stream.ops.tracing.RecordTrace`)
        self.traced: list[Any] | None = None

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if self._publisher.transactional:
            # The transaction commit acknowledges the span; a failed record fails the commit instead.
            if err is not None:
                log.debug("delivery in a transaction failed: %s", err)
            return
        if err is not None:
            self._publisher.record_failure(PublishError("deliver prediction", err), msg)
            return
        self.acknowledge(1)

    def acknowledge(self, n: int) -> None:
        """``n`` of the span's records are durably delivered (acknowledging more than it holds raises)."""
        span = self.span
        span.ack(n)
        if span.done:
            self._publisher.span_done(self)

    def acknowledge_all(self) -> None:
        """Exactly-once: the batch's transaction committed, delivering every record of the span at once."""
        if not self.span.done:
            self.acknowledge(self.span.outstanding)

    def expect(self, n: int) -> None:
        """``n`` reply copies of the span's records go out too: the span is done once they are delivered as well
        (before any of its records is produced)."""
        self.span.expect(n)

    def dead_letter(self) -> None:
        """One of the span's records goes to the dead-letter topic instead of becoming a prediction."""
        self.dead += 1
