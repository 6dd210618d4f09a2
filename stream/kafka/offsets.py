"""A pure per-partition offset tracker: what was dispatched, what was acknowledged, what may be committed.

Records are dispatched in spans (the records of one partition in one micro-batch, in offset order).
A span completes when every record in it is acknowledged (prediction or dead-letter record delivered).
A partition's commit position is ``last offset + 1`` of the longest run of completed spans from the
oldest one: an unacknowledged record holds back every later one, so a crash never skips a record.
Acks are O(1); spans belong to a partition *assignment*, so acks that arrive after a revoke (or
after the partition came back) are ignored instead of corrupting the new assignment's state.

A position goes through three states: *acknowledged* (its records are delivered), *handed out* (given to a
commit whose answer is pending) and *confirmed* (the broker accepted a commit of it). Periodic asynchronous
commits take only what advanced since the last hand-out; a synchronous commit (revoke, shutdown) also takes
what was handed out and not yet confirmed, since a pending commit can still fail (a group rebalancing under
librdkafka's cooperative protocol answers it only after the generation moved on, with ILLEGAL_GENERATION).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import numpy as np

from stream.errors import StreamError

TopicPartition = tuple[str, int]


class Span:
    """The records of one partition in one batch: offsets ``first..last``, ``count`` records."""

    __slots__ = ("count", "first", "last", "outstanding", "partition")

    def __init__(self, partition: PartitionState, first: int, last: int, count: int) -> None:
        self.partition = partition
        self.first = first
        self.last = last
        self.count = count
        self.outstanding = count

    def expect(self, n: int) -> None:
        """n more records must be delivered before the span is done (reply copies, `stream.kafka.replies`); called
        before any of the span's records is handed to the producer."""
        self.outstanding += n

    def ack(self, n: int = 1) -> None:
        """n records of this span are durably delivered."""
        self.outstanding -= n
        if self.outstanding < 0:
            raise StreamError(f"span {self.first}..{self.last} acknowledged more than {self.count} times")

    @property
    def done(self) -> bool:
        return self.outstanding == 0


class PartitionState:
    __slots__ = ("acked", "committed", "confirmed", "dispatched", "spans", "taken", "tp")

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.spans: deque[Span] = deque()
        self.acked: int | None = None  # position after the longest completed prefix of spans
        self.committed: int | None = None  # last position handed out by `committable`
        self.confirmed: int | None = None  # highest position the broker accepted (`confirm`)
        self.dispatched: int | None = None  # position after the last dispatched span
        self.taken: int | None = None  # position after the highest offset taken from the consumer (`admit`)

    def watermark(self) -> int | None:
        """Commit position after the longest completed prefix of spans (pops them), or None."""
        position = None
        spans = self.spans
        while spans and spans[0].outstanding == 0:
            position = spans.popleft().last + 1
        return position


class OffsetTracker:
    """Tracks dispatched and acknowledged records per assigned partition; computes commit positions."""

    def __init__(self) -> None:
        self._partitions: dict[TopicPartition, PartitionState] = {}
        self._pending: dict[TopicPartition, int] = {}  # advanced, not yet committed

    def assign(self, tps: Iterable[TopicPartition]) -> None:
        for tp in tps:
            self._partitions[tp] = PartitionState(tp)

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        """Revoked or lost partitions: drop their state; late acks for them are ignored."""
        for tp in tps:
            self._partitions.pop(tp, None)
            self._pending.pop(tp, None)

    def assigned(self) -> list[TopicPartition]:
        return list(self._partitions)

    def is_assigned(self, tp: TopicPartition) -> bool:
        return tp in self._partitions

    def admit(self, topic: str, partitions: np.ndarray, offsets: np.ndarray) -> np.ndarray | None:
        """Which of the records just taken from the consumer to keep: of each assigned partition, those past every
        offset already taken from it since it was assigned or rewound. librdkafka can hand a range over twice
        right after a seek (an exactly-once rewind; seen once in a long chaos run with broker faults: 34 records
        of 18 offsets in one batch, 14 ms after the seek); the second copy is dropped here, where the span check
        would stop the worker. Never skips ahead: a record is dropped only at or below an offset already taken.
        None: keep all."""
        keep: np.ndarray | None = None
        for p in np.unique(partitions).tolist():
            state = self._partitions.get((topic, p))
            if state is None:
                continue  # not assigned: the caller drops it
            rows = np.flatnonzero(partitions == p)
            offs = offsets[rows]
            last = state.taken - 1 if state.taken is not None else -1
            seen = np.maximum.accumulate(np.concatenate(([last], offs[:-1])))
            fresh = offs > seen
            if not fresh.all():
                if keep is None:
                    keep = np.ones(len(partitions), dtype=bool)
                keep[rows[~fresh]] = False
            state.taken = max(last, int(offs.max())) + 1
        return keep

    def dispatch(self, tp: TopicPartition, first: int, last: int, count: int) -> Span:
        """Record that ``count`` records with offsets ``first..last`` of ``tp`` went to processing."""
        state = self._partitions.get(tp)
        if state is None:
            raise StreamError(f"dispatch for unassigned partition {tp[0]}[{tp[1]}]")
        if count < 1 or last < first or count > last - first + 1:
            raise StreamError(f"bad span {first}..{last} with {count} records for {tp[0]}[{tp[1]}]")
        if state.spans and first <= state.spans[-1].last:
            raise StreamError(
                f"offsets must increase: {tp[0]}[{tp[1]}] span {first}..{last} after ..{state.spans[-1].last}"
            )
        span = Span(state, first, last, count)
        state.spans.append(span)
        state.dispatched = last + 1
        return span

    def taken_to(self, topic: str, ends: dict[int, int]) -> bool:
        """Every partition of ``topic`` in ``ends`` ({partition: end offset}) that is assigned here has had its
        records taken from the consumer up to that end."""
        for p, end in ends.items():
            state = self._partitions.get((topic, p))
            if state is not None and (state.taken is None or state.taken < end):
                return False
        return True

    def holds(self, tp: TopicPartition) -> bool:
        """Records of ``tp`` were dispatched in this assignment and the broker has not confirmed their commit."""
        state = self._partitions.get(tp)
        if state is None or state.dispatched is None:
            return False
        return state.confirmed is None or state.confirmed < state.dispatched

    def in_flight(self, tp: TopicPartition | None = None) -> int:
        """Records dispatched and not yet acknowledged (for one partition, or all)."""
        states = self._partitions.values() if tp is None else [self._partitions[tp]]
        return sum(span.outstanding for state in states for span in state.spans)

    def committable(self, tps: Iterable[TopicPartition] | None = None, *,
                    unconfirmed: bool = False) -> dict[TopicPartition, int]:
        """Positions that advanced since the last call (for all or the given partitions); marks them handed out.

        ``unconfirmed``: also every acknowledged position the broker has not confirmed yet, even if an earlier
        call handed it out (a synchronous commit must not rely on an asynchronous one still in flight)."""
        for state in self._partitions.values():
            position = state.watermark()
            if position is not None:
                state.acked = position
                self._pending[state.tp] = position
        wanted = list(self._partitions) if tps is None else [tp for tp in tps if tp in self._partitions]
        out = {}
        for tp in wanted:
            state = self._partitions[tp]
            position = self._pending.pop(tp, None)
            if position is None and unconfirmed and state.acked is not None and (
                    state.confirmed is None or state.acked > state.confirmed):
                position = state.acked
            if position is not None:
                state.committed = position
                out[tp] = position
        return out

    def confirm(self, positions: dict[TopicPartition, int]) -> None:
        """The broker accepted commits of these positions."""
        for tp, position in positions.items():
            state = self._partitions.get(tp)
            if state is not None and (state.confirmed is None or position > state.confirmed):
                state.confirmed = position

    def restore(self, positions: dict[TopicPartition, int]) -> None:
        """Put back positions whose commit failed, so the next `committable` offers them again."""
        for tp, position in positions.items():
            state = self._partitions.get(tp)
            if state is None or tp in self._pending:
                continue
            if state.committed is not None and position < state.committed:
                continue  # a newer position was handed out since: never regress
            self._pending[tp] = position


def fmt_partitions(tps: list[TopicPartition]) -> str:
    """``topic[0, 3, 5]`` for log lines (the partitions of one topic)."""
    if not tps:
        return "nothing"
    return f"{tps[0][0]}{sorted(p for _, p in tps)}"
