"""The consumer's rebalance callbacks (cooperative-sticky: partitions come and go a few at a time).

- assigned: the C consumer routes them (before confluent-kafka assigns them), the tracker and the stall detector
  start them afresh, they take the input's pause state;
- revoked: records of them not yet in a batch are dropped for the next owner; their in-flight records are
  finished (or abandoned after the revoke's budget, or at once when a transaction was aborted or when nothing
  more can be acknowledged: the worker's publisher closed as it stops), committed synchronously, and forgotten;
- lost (ownership already gone): nothing committed, their state dropped (in-flight records may be repeated).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import OFFSET_END, Consumer, TopicPartition

from stream.errors import KafkaClientError
from stream.kafka.deadline import Deadline
from stream.kafka.intake import Intake
from stream.kafka.offsets import OffsetTracker, fmt_partitions
from stream.kafka.records import Records
from stream.ops.metrics import StreamMetrics
from stream.ops.stalls import StallDetector
from stream.pipeline.batching import MicroBatcher
from stream.pipeline.committer import Committer
from stream.pipeline.pausing import InputPause

log = logging.getLogger(__name__)


class Rebalancer:
    def __init__(self, intake: Intake, batcher: MicroBatcher[Records], tracker: OffsetTracker, stalls: StallDetector,
                 committer: Committer, pause: InputPause, metrics: StreamMetrics, *, revoke_budget_s: float,
                 failed: Callable[[], bool], rewinding: Callable[[], bool],
                 clock: Callable[[], float] = time.monotonic, start_from_ms: int | None = None) -> None:
        self.intake = intake
        self._batcher = batcher
        self._tracker = tracker
        self._stalls = stalls
        self._committer = committer
        self._pause = pause
        self._metrics = metrics
        self._revoke_budget_s = revoke_budget_s
        self._failed = failed
        self._rewinding = rewinding
        self._clock = clock
        self._start_from_ms = start_from_ms  # --start-from a time: for partitions the group never committed
        self._publishing_ended = False

    def publishing_ended(self) -> None:
        """The worker's publisher is closed (it is stopping): every acknowledgement there will be has come, so a
        revoke from now on (the consumer's close) waits for none. Records still in flight then were left undone
        (a batch abandoned while the schema registry could not be reached, for example)."""
        self._publishing_ended = True

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = [(tp.topic, tp.partition) for tp in partitions]
        self.intake.route(tps)
        self._tracker.assign(tps)
        self._stalls.assign(tps)
        self._committer.ledger.reassigned(tps)
        self._pause.assigned(consumer, partitions)
        self._metrics.assigned_partitions.set(len(self._tracker.assigned()))
        if partitions:
            self._metrics.rebalances.labels("assigned").inc()
        log.info("assigned %s", fmt_partitions(tps))
        if self._start_from_ms is not None and partitions:
            self._assign_from_time(consumer, partitions, self._start_from_ms)

    @staticmethod
    def _assign_from_time(consumer: Consumer, partitions: list[TopicPartition], at_ms: int) -> None:
        """Assign ``partitions`` ourselves (confluent-kafka then does not): those the group committed at their
        committed offset, the others at their first record at or after ``at_ms`` (their end when none is)."""
        committed = consumer.committed([TopicPartition(tp.topic, tp.partition) for tp in partitions], timeout=10)
        fresh = [TopicPartition(tp.topic, tp.partition, at_ms) for tp in committed if tp.offset < 0]
        found = {(tp.topic, tp.partition): tp.offset
                 for tp in (consumer.offsets_for_times(fresh, timeout=10) if fresh else [])}
        start = []
        for tp in committed:
            offset = tp.offset if tp.offset >= 0 else found.get((tp.topic, tp.partition), -1)
            start.append(TopicPartition(tp.topic, tp.partition, offset if offset >= 0 else OFFSET_END))
        log.info("starting %s", ", ".join(f"{tp.partition}@{'end' if tp.offset == OFFSET_END else tp.offset}"
                                          for tp in start))
        consumer.incremental_assign(start)

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        tps = [(tp.topic, tp.partition) for tp in partitions]
        if partitions:
            self._metrics.rebalances.labels("revoked").inc()
        revoked = {p for _, p in tps}
        dropped = self._batcher.discard(lambda r: r.without_partitions(revoked))
        started = self._clock()
        deadline = Deadline(self._revoke_budget_s, self._clock)
        live = [tp for tp in tps if self._tracker.is_assigned(tp)]
        while (any(self._tracker.in_flight(tp) for tp in live) and not deadline.passed()
               and not self._failed() and not self._rewinding() and not self._publishing_ended):
            time.sleep(0.002)
        try:
            self._committer.commit(asynchronous=False, tps=live)
        except KafkaClientError as exc:
            log.error("commit on revoke failed (the next owner re-processes from the last commit): %s", exc)
        unfinished = sum(self._tracker.in_flight(tp) for tp in live)
        if unfinished:
            why = ("a transaction was aborted" if self._rewinding() else "the worker failed" if self._failed()
                   else "the worker is stopping and they were left undone" if self._publishing_ended
                   else "the revoke's time was up")
            log.warning("revoke: %d records still unacknowledged after %.1fs (%s); not committed",
                        unfinished, self._clock() - started, why)
        self._forget(partitions)
        log.info("revoked %s (dropped %d unstarted records)", fmt_partitions(tps), dropped)

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if partitions:
            self._metrics.rebalances.labels("lost").inc()
        lost = {tp.partition for tp in partitions}
        self._batcher.discard(lambda r: r.without_partitions(lost))
        self._forget(partitions)
        log.warning("lost %s", fmt_partitions([(tp.topic, tp.partition) for tp in partitions]))

    def _forget(self, partitions: list[TopicPartition]) -> None:
        tps = [(tp.topic, tp.partition) for tp in partitions]
        self.intake.forget({p for _, p in tps})
        self._tracker.forget(tps)
        self._stalls.forget(tps)
        self._pause.gone(partitions)
        self._metrics.assigned_partitions.set(len(self._tracker.assigned()))


class IdleReplica:
    """Warns once when this replica, a member of the group, has held no input partition for ``after_s``: a group
    with more replicas than the input has partitions leaves the extra ones standing by (they take partitions
    over when a replica leaves). A partition assigned again resets it."""

    def __init__(self, topic: str, after_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._topic = topic
        self._after_s = after_s
        self._clock = clock
        self._since: float | None = None
        self._warned = False

    def check(self, assigned: int, joined: bool) -> None:
        if assigned or not joined:
            self._since, self._warned = None, False
            return
        now = self._clock()
        if self._since is None:
            self._since = now
        elif not self._warned and now - self._since >= self._after_s:
            self._warned = True
            log.warning("this replica has held no partition of %s for %.0fs: the group has more replicas than the "
                        "topic has partitions, or the others hold them all; it stands by and takes partitions over "
                        "when a replica leaves", self._topic, now - self._since)
