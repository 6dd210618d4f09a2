"""Stuck partitions: assigned, with records waiting, and no committed progress for ``timeout_s``.

Pure (no Kafka): the worker feeds it assignments, commit advances and, when asked, whether each idle partition
has records waiting; it answers which partitions are stalled. A partition counts as idle once its committed
position has not moved for ``check_every_s``; only idle partitions are looked at, so a working worker costs
nothing but a dictionary walk every ``check_every_s``.

A record that arrives at a long-idle partition must not make it look stuck at once, so the time that counts
is how long records have been *seen* waiting at consecutive checks, not how long the partition has been quiet:
a partition is stalled when every check for at least ``timeout_s`` found records waiting and no commit moved
it. Reported within ``timeout_s`` plus two check periods of the last progress.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from stream.errors import ConfigError

TopicPartition = tuple[str, int]
Clock = Callable[[], float]


@dataclass
class _Watch:
    progress_at: float  # assignment or last committed advance
    waiting_since: float | None = None  # first of the consecutive checks that found records waiting
    warned_at: float = -math.inf


class StallDetector:
    """Which assigned partitions have records waiting and have made no progress for ``timeout_s``."""

    def __init__(self, timeout_s: float, clock: Clock = time.monotonic) -> None:
        if timeout_s <= 0:
            raise ConfigError(f"stall timeout must be > 0 s, got {timeout_s}")
        self.timeout_s = timeout_s
        self.check_every_s = timeout_s / 4
        self._clock = clock
        self._watches: dict[TopicPartition, _Watch] = {}
        self._stalled: set[TopicPartition] = set()
        self._recovered: list[TopicPartition] = []
        self._next_check = clock() + self.check_every_s

    def assign(self, tps: Iterable[TopicPartition]) -> None:
        now = self._clock()
        for tp in tps:
            self._watches[tp] = _Watch(now)
            self._stalled.discard(tp)

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        """Revoked or lost: no longer ours to report."""
        for tp in tps:
            self._watches.pop(tp, None)
            self._stalled.discard(tp)

    def progressed(self, tp: TopicPartition) -> None:
        """The committed position of ``tp`` advanced."""
        watch = self._watches.get(tp)
        if watch is None:
            return
        watch.progress_at = self._clock()
        watch.waiting_since = None
        if tp in self._stalled:
            self._stalled.discard(tp)
            self._recovered.append(tp)

    def due(self) -> bool:
        """Time for a check (at most every ``check_every_s``); the caller then calls `idle` and `judge`."""
        now = self._clock()
        if now < self._next_check:
            return False
        self._next_check = now + self.check_every_s
        return True

    def idle(self) -> list[TopicPartition]:
        """Partitions whose committed position has not moved for ``check_every_s``: the ones to look at."""
        now = self._clock()
        return [tp for tp, w in self._watches.items() if now - w.progress_at >= self.check_every_s]

    def judge(self, waiting: Mapping[TopicPartition, bool]) -> list[TopicPartition]:
        """Record what a check found (``tp -> records waiting``); returns the stalled partitions to warn about
        now: newly stalled ones, and ones still stalled ``timeout_s`` after their last warning."""
        now = self._clock()
        warn = []
        for tp, has_records in waiting.items():
            watch = self._watches.get(tp)
            if watch is None:
                continue
            if not has_records:
                watch.waiting_since = None
                if tp in self._stalled:  # caught up without a commit of ours (e.g. the input was truncated)
                    self._stalled.discard(tp)
                    self._recovered.append(tp)
                continue
            if watch.waiting_since is None:
                watch.waiting_since = now
            if now - watch.waiting_since >= self.timeout_s and now - watch.progress_at >= self.timeout_s:
                self._stalled.add(tp)
                if now - watch.warned_at >= self.timeout_s:
                    watch.warned_at = now
                    warn.append(tp)
        return sorted(warn)

    def stalled(self) -> list[TopicPartition]:
        return sorted(self._stalled)

    def stalled_for_s(self, tp: TopicPartition) -> float:
        """Seconds since ``tp`` last made progress (its assignment, or its last committed advance)."""
        watch = self._watches.get(tp)
        return 0.0 if watch is None else self._clock() - watch.progress_at

    def take_recovered(self) -> list[TopicPartition]:
        """Partitions that were stalled and have made progress since the last call."""
        out, self._recovered = self._recovered, []
        return sorted(out)
