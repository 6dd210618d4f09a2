"""Input offsets out to the group: what the offset tracker says may be committed, when, and what a rebalance
defers.

1. Periodically (the poll loop, every ``--commit-interval-ms``) an asynchronous commit of the positions that
   advanced, one outstanding at a time: during a rebalance librdkafka holds commits until the generation moves
   on and then fails them all (``ILLEGAL_GENERATION``); one such commit is enough, its positions are offered
   again (`CommitLedger.on_commit`).
2. On a revoke, and at shutdown, a synchronous commit, which also retakes positions an unanswered asynchronous
   commit holds. At shutdown a rebalance in progress fails it: the group is served until the rebalance ends and
   the commit is tried again, up to the deadline (`commit_settled`).
3. Exactly-once: the positions went out inside their transactions; they are only recorded.

Every position the broker accepts is recorded (`CommitLedger.record`): the tracker's confirmation, the stall
detector's progress, the summary's and the metrics' committed counts. The ledger exists before the consumer (whose
configuration names its `on_commit`); the `Committer` is built over the consumer once it exists.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from stream.errors import KafkaClientError
from stream.kafka.deadline import Deadline
from stream.kafka.offsets import OffsetTracker
from stream.kafka.offsets import TopicPartition as Tp
from stream.kafka.records import MESSAGES_A_CONSUME
from stream.ops.metrics import StreamMetrics
from stream.ops.stalls import StallDetector
from stream.ops.summary import WorkerSummary

log = logging.getLogger(__name__)
REBALANCE_ERRORS = frozenset({KafkaError.ILLEGAL_GENERATION, KafkaError.REBALANCE_IN_PROGRESS,
                              KafkaError.UNKNOWN_MEMBER_ID})
_ASYNC_COMMIT_PATIENCE_S = 30.0  # then send the next asynchronous commit even if the last one got no answer



class CommitLedger:
    """The positions the broker accepted, and the answers to asynchronous commits (the consumer's ``on_commit``):
    it exists before the consumer, whose configuration names `on_commit`."""

    def __init__(self, tracker: OffsetTracker, stalls: StallDetector, summary: WorkerSummary,
                 metrics: StreamMetrics, clock: Callable[[], float] = time.monotonic) -> None:
        self._tracker = tracker
        self._stalls = stalls
        self._summary = summary
        self._metrics = metrics
        self._clock = clock
        self._positions: dict[Tp, int] = {}  # committed position per partition of this assignment
        self._async_sent_at: float | None = None  # an asynchronous commit waits for its answer

    # -- positions ------------------------------------------------------------------------------------------
    def start_at(self, tp: Tp, first: int) -> None:
        """The first offset this assignment dispatches: the committed counter's base for ``tp``."""
        self._positions.setdefault(tp, first)

    def reassigned(self, tps: Iterable[Tp]) -> None:
        """A new assignment: its base is set by its first dispatched offset (no broker round trip inside the
        rebalance callback)."""
        for tp in tps:
            self._positions.pop(tp, None)

    def position(self, tp: Tp) -> int | None:
        return self._positions.get(tp)

    def positions(self) -> dict[Tp, int]:
        return dict(self._positions)

    # -- asynchronous commits ---------------------------------------------------------------------------------
    def async_due(self) -> bool:
        sent = self._async_sent_at
        return sent is None or self._clock() - sent > _ASYNC_COMMIT_PATIENCE_S

    def sent_async(self) -> None:
        self._async_sent_at = self._clock()

    def on_commit(self, err: KafkaError | None, partitions: list[TopicPartition]) -> None:
        """The consumer's ``on_commit``: an asynchronous commit's answer."""
        if self._async_sent_at is not None:
            self._metrics.commit_seconds.labels("async").observe(self._clock() - self._async_sent_at)
        self._async_sent_at = None
        if err is not None:
            # Offer the positions again; a later commit of a higher position supersedes them.
            self._metrics.commit_failures.inc()
            if err.code() in REBALANCE_ERRORS:
                log.info("async commit deferred by a rebalance: %s", err)
            else:
                log.warning("async commit failed: %s", err)
            self._tracker.restore({(tp.topic, tp.partition): tp.offset for tp in partitions if tp.offset >= 0})
            return
        self.record(partitions)

    def record(self, partitions: list[TopicPartition]) -> None:
        """Positions the broker accepted."""
        self._tracker.confirm({(tp.topic, tp.partition): tp.offset for tp in partitions
                               if tp.error is None and tp.offset >= 0})
        for tp in partitions:
            if tp.error is not None or tp.offset < 0:
                continue
            key = (tp.topic, tp.partition)
            before = self._positions.get(key)
            if before is None or tp.offset > before:
                advanced = tp.offset - (before if before is not None else tp.offset)
                self._positions[key] = tp.offset
                self._stalls.progressed(key)
                self._summary.committed += advanced
                self._summary.last_committed_at = time.time()
                self._metrics.committed.inc(advanced)
                self._metrics.last_commit.set(self._summary.last_committed_at)


class Committer:
    """Commits through the consumer what the offset tracker says may be committed; the ledger records what the
    broker accepted."""

    def __init__(self, consumer: Consumer, ledger: CommitLedger, tracker: OffsetTracker, metrics: StreamMetrics, *,
                 exactly_once: bool, clock: Callable[[], float] = time.monotonic) -> None:
        self.consumer = consumer
        self.ledger = ledger
        self._tracker = tracker
        self._metrics = metrics
        self._exactly_once = exactly_once
        self._clock = clock

    def commit(self, *, asynchronous: bool, tps: list[Tp] | None = None) -> bool:
        """Commit acknowledged positions. A synchronous commit also retakes positions that an asynchronous one
        holds without an answer yet. False when a rebalance deferred it (the positions are offered again)."""
        positions = self._tracker.committable(tps, unconfirmed=not asynchronous)
        if not positions:
            return True
        consumer = self.consumer
        offsets = [TopicPartition(t, p, off) for (t, p), off in positions.items()]
        if self._exactly_once:
            self.ledger.record(offsets)  # already committed inside their transactions
            return True
        if asynchronous:
            consumer.commit(offsets=offsets, asynchronous=True)
            self.ledger.sent_async()
            return True
        started = self._clock()
        try:
            result = consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            self._metrics.commit_failures.inc()
            self._tracker.restore(positions)
            error = exc.args[0]
            if error.code() in REBALANCE_ERRORS:
                # The group is rebalancing: the positions go out with the next commit, or the revoke's.
                log.info("commit deferred by a rebalance: %s", error)
                return False
            raise KafkaClientError("commit", error) from exc
        self._metrics.commit_seconds.labels("sync").observe(self._clock() - started)
        self.ledger.record(result or offsets)
        return True

    def commit_settled(self, deadline: Deadline) -> None:
        """Shutdown's commit: serve the group through a rebalance in progress and commit again, up to the
        deadline; records fetched meanwhile are dropped, never dispatched."""
        consumer = self.consumer
        while not self.commit(asynchronous=False):
            if deadline.passed():
                log.error("the group was still rebalancing at the shutdown deadline: the last positions stay "
                          "uncommitted (their records will be processed again by the next owner)")
                return
            try:
                consumer.consume(MESSAGES_A_CONSUME, min(0.1, deadline.left()))
            except KafkaException as exc:
                log.error("the last positions stay uncommitted: the consumer failed while the group "
                          "rebalanced: %s", exc)
                return
