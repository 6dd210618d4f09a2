"""``--stop-at-end``: drain the input to the end offsets that existed at start (for the whole group), then stop."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaException, TopicPartition

from stream.errors import coordinator_away
from stream.kafka.topics import end_offsets
from stream.pipeline.committer import Committer

log = logging.getLogger(__name__)
# The group's own positions are looked at every 0.02 s; the broker is asked (a synchronous commit, then the committed
# offsets) when this worker is idle with partitions short of their ends: at once when it has just finished taking
# and processing its own partitions' records up to their ends, else at most every 0.25 s (an idle moment between
# two fetches is no reason for a round trip). At one look every 0.25 s, a benchmark's drain window (first record
# to last commit) ended on that tick: up to 7 % of a 3.5 s drain.
_CHECK_EVERY_S = 0.02
_ASK_EVERY_S = 0.25


class StopAtEnd:
    """``ends``: the input's end offsets at start, per partition (`from_broker` reads them)."""

    def __init__(self, consumer: Consumer, topic: str, ends: dict[int, int], committer: Committer,
                 busy: Callable[[], bool], taken_to: Callable[[str, dict[int, int]], bool],
                 clock: Callable[[], float]) -> None:
        self._consumer = consumer
        self._topic = topic
        self._ends = ends
        self._committer = committer
        self._busy = busy  # records in flight or batched: not done yet
        self._taken_to = taken_to  # (topic, {partition: end}): those assigned here were taken up to their ends
        self._clock = clock
        self._next_check = 0.0
        self._next_ask = 0.0
        self._asked_since_busy = False

    @classmethod
    def from_broker(cls, consumer: Consumer, admin_config: dict[str, Any], topic: str, committer: Committer,
                    busy: Callable[[], bool], taken_to: Callable[[str, dict[int, int]], bool],
                    clock: Callable[[], float]) -> StopAtEnd:
        """With the topic's end offsets as the broker has them now."""
        ends = end_offsets(admin_config["bootstrap.servers"], topic, client_config=admin_config)
        log.info("stop-at-end: end offsets at start %s", ends)
        return cls(consumer, topic, ends, committer, busy, taken_to, clock)

    def reached(self) -> bool:
        """True once the group's committed offsets reach the end offsets seen at start, for every partition
        (`_CHECK_EVERY_S`, `_ASK_EVERY_S`)."""
        now = self._clock()
        if now < self._next_check:
            return False
        self._next_check = now + _CHECK_EVERY_S
        pending = {p: end for p, end in self._ends.items() if end > 0}
        for (t, p), pos in self._committer.ledger.positions().items():  # own partitions first: no round trip
            if t == self._topic and p in pending and pos >= pending[p]:
                del pending[p]
        if pending:
            if self._busy():
                self._asked_since_busy = False
                return False
            if now < self._next_ask and (self._asked_since_busy or not self._taken_to(self._topic, pending)):
                return False
            self._next_ask = now + _ASK_EVERY_S
            self._asked_since_busy = True
            self._committer.commit(asynchronous=False)
            try:
                committed = self._consumer.committed([TopicPartition(self._topic, p) for p in pending], timeout=10)
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if not coordinator_away(error):
                    raise
                # NOT_COORDINATOR seen on a fresh cluster's first group: asked again (`_ASK_EVERY_S`).
                log.debug("stop-at-end: committed offsets not read (%s); asking again", error)
                return False
            for tp in committed:
                if tp.offset != OFFSET_INVALID and tp.offset >= pending[tp.partition]:
                    del pending[tp.partition]
        if pending:
            return False
        log.info("stop-at-end: every partition is committed up to its end offset at start")
        return True
