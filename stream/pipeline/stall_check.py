"""The worker's side of stuck-partition reports: asks the broker, for the partitions the (pure)
`stream.ops.stalls.StallDetector` finds idle, whether records are waiting there, and logs what it judges stalled.

A partition has records waiting when its end offset (for a read_committed consumer, the last stable offset) is
past what this worker has taken, or when the worker holds records of it it has not committed. One ListOffsets
request covers them all; a committed-offsets request only those the worker has taken nothing from.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from confluent_kafka import OFFSET_END, Consumer, KafkaException, TopicPartition

from stream.kafka.offsets import OffsetTracker, fmt_partitions
from stream.kafka.offsets import TopicPartition as Tp
from stream.kafka.records import Records
from stream.ops.metrics import StreamMetrics
from stream.ops.stalls import StallDetector
from stream.pipeline.batching import MicroBatcher
from stream.pipeline.committer import CommitLedger
from stream.pipeline.pausing import InputPause

log = logging.getLogger(__name__)
_STALL_QUERY_TIMEOUT_S = 2.0  # longest wait for the end and committed offsets of idle partitions



class StallCheck:
    def __init__(self, consumer: Consumer, stalls: StallDetector, ledger: CommitLedger, tracker: OffsetTracker,
                 batcher: MicroBatcher[Records], pause: InputPause, metrics: StreamMetrics,
                 consumer_config: dict[str, Any]) -> None:
        self._consumer = consumer
        self._stalls = stalls
        self._ledger = ledger
        self._tracker = tracker
        self._batcher = batcher
        self._pause = pause
        self._metrics = metrics
        # With no committed offset, fetching starts where auto.offset.reset says: offset 0 for "earliest".
        reset = str(consumer_config.get("auto.offset.reset", "latest")).lower()
        self._reset_start = 0 if reset in ("earliest", "smallest", "beginning") else None
        # Partitions whose records past the last stable offset are waiting behind a transaction still open (the
        # latest check's): {partition: (last stable offset, end offset)}
        self.held: dict[Tp, tuple[int, int]] = {}

    def due(self) -> bool:
        return self._stalls.due()

    def run(self) -> None:
        """Report partitions with records waiting and no committed progress for --stall-timeout-s."""
        stalls = self._stalls
        for tp in stalls.take_recovered():
            log.info("%s[%d] is making progress again", *tp)
        idle = stalls.idle()
        if idle:
            warn = stalls.judge(self.records_waiting(idle))
            if warn:
                log.warning("stalled: %s %s records waiting and no committed progress for %.0fs or more "
                            "(--stall-timeout-s %g)%s%s", fmt_partitions(warn), "has" if len(warn) == 1 else "have",
                            min(stalls.stalled_for_s(tp) for tp in warn), stalls.timeout_s,
                            "; input is paused: the model's queue is full" if self._pause.paused else "",
                            self._held_note(warn))
        self._metrics.stalled_partitions.set(len(stalls.stalled()))

    def records_waiting(self, tps: list[Tp]) -> dict[Tp, bool]:
        """Per partition: records waiting or not. Partitions whose end offset could not be read are left out
        (judged at the next check)."""
        consumer = self._consumer
        try:
            # A ListOffsets request for the latest offsets (timestamp -1), all partitions in one round trip.
            answer = consumer.offsets_for_times([TopicPartition(t, p, OFFSET_END) for t, p in tps],
                                                timeout=_STALL_QUERY_TIMEOUT_S)
            # The application position passes the control records of transactional input; committed positions
            # stop at the last data record + 1, so they alone would show a transaction marker as waiting.
            positions = consumer.position([TopicPartition(t, p) for t, p in tps])
        except KafkaException as exc:
            log.warning("stall check: end offsets of %s not read: %s", fmt_partitions(tps),
                        exc.args[0] if exc.args else exc)
            return {}
        ends = {(tp.topic, tp.partition): tp.offset for tp in answer if tp.error is None and tp.offset >= 0}
        stable = dict(ends)  # a read_committed consumer's ListOffsets(latest): the last stable offset
        for t, p in tps:
            # Also the end offset the last fetch response carried (no round trip): the embedded Tansu broker
            # answers ListOffsets(latest) wrongly, its fetch responses rightly; on Kafka the two agree. It is the
            # high watermark, past the last stable offset while a transaction is open.
            _, fetched = consumer.get_watermark_offsets(TopicPartition(t, p), cached=True)
            if fetched >= 0:
                ends[(t, p)] = max(ends.get((t, p), 0), fetched)
        taken = {(tp.topic, tp.partition): tp.offset for tp in positions if tp.error is None and tp.offset >= 0}
        # Nothing taken from these since they were assigned: where does the group stand on them?
        unknown = [tp for tp in tps if tp not in taken and self._ledger.position(tp) is None]
        committed: dict[Tp, int | None] = {}
        if unknown:
            try:
                answer = consumer.committed([TopicPartition(t, p) for t, p in unknown], timeout=_STALL_QUERY_TIMEOUT_S)
            except KafkaException:
                # Unreadable for now: an open transaction of the partitions' previous owner holds them until it
                # ends or times out, and nothing can be taken from them meanwhile either.
                committed = dict.fromkeys(unknown, 0)
            else:
                committed = {(tp.topic, tp.partition): tp.offset if tp.offset >= 0 else self._reset_start
                             for tp in answer if tp.error is None}
        batched = self._batched_partitions()
        waiting = {}
        self.held = {}
        for tp in tps:
            known = [x for x in (taken.get(tp), self._ledger.position(tp), committed.get(tp)) if x is not None]
            if tp not in ends or not known:
                continue
            waiting[tp] = ends[tp] > max(known) or self._tracker.holds(tp) or tp[1] in batched
            if taken.get(tp, -1) == stable.get(tp) and stable[tp] < ends[tp]:  # read up to a transaction still open
                self.held[tp] = (stable[tp], ends[tp])
        return waiting

    def _held_note(self, tps: list[Tp]) -> str:
        """What the warning adds for stalled partitions held by an open transaction."""
        held = [(tp, *self.held[tp]) for tp in tps if tp in self.held]
        if not held:
            return ""
        return ("; " + ", ".join(f"{t}[{p}] at {stable} ({end - stable:,} records past it)"
                                 for (t, p), stable, end in held)
                + ": a transaction its producer has neither committed nor aborted holds the last stable offset "
                "there, and a read_committed consumer reads nothing past it until the producer ends it or the "
                "broker aborts it at the producer's transaction.timeout.ms (at most the broker's "
                "transaction.max.timeout.ms, 15 minutes by default): grant transactional ids only to producers "
                "you trust (docs/operations.md, 'Security: the least-privilege ACLs')")

    def _batched_partitions(self) -> set[int]:
        """Input partitions with records in the open batch."""
        out: set[int] = set()
        for records in self._batcher.items():
            out.update(np.unique(records.partitions).tolist())
        return out
