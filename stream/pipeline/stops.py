"""A worker that stops on purpose says so where the next start reads it, so that a restart never loops on the same
records without a word.

When the worker stops itself (`stream.errors.StoppedOnPurpose`: the dead-letter breaker tripped, or a bad record
and no dead-letter topic), it commits each partition it holds at the position it already had, with a note in the
commit's metadata (`StopNote`: why, when, and how many times in a row it stopped there). Nothing moves: the next
owner of the partition resumes at that position, as it would have anyway.

A worker starting reads the notes of its group (`read_notes`), logs a WARNING for each, and until it has committed
past a noted position on a partition it holds, ``/readyz`` answers 503 saying why and
``stream_stopped_on_purpose_partitions`` counts it (`PreviousStops`). Its first commit past the position replaces
the note. A broker that keeps no commit metadata (the embedded Tansu) loses the notes: the worker says so when it
leaves them.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, TopicPartition

from stream.errors import StoppedOnPurpose

log = logging.getLogger(__name__)
NOTE_KEY = "stream.stopped"
GUIDE = "docs/operations.md, 'A worker that stopped on purpose'"
_MAX_MESSAGE = 600  # the metadata must stay under the broker's offset.metadata.max.bytes (4096 by default)


@dataclass(frozen=True)
class StopNote:
    reason: str  # dead-letter-breaker, no-dlq-topic
    message: str
    position: int  # the committed position it stopped at: where the next owner resumes
    at_ms: int  # when (Unix ms)
    stops: int = 1  # how many times in a row a worker stopped on purpose at this position
    counts: tuple[int, int] | None = None  # the dead-letter breaker's when it tripped: (records, failed)

    def encode(self) -> str:
        return json.dumps({NOTE_KEY: self.reason, "message": self.message[:_MAX_MESSAGE],
                           "position": self.position, "at_ms": self.at_ms, "stops": self.stops,
                           **({"counts": list(self.counts)} if self.counts else {})})

    @classmethod
    def parse(cls, metadata: str | None) -> StopNote | None:
        """The note in a commit's metadata; None for any other metadata (or none)."""
        if not metadata or NOTE_KEY not in metadata:
            return None
        try:
            raw = json.loads(metadata)
            counts = raw.get("counts")
            return cls(str(raw[NOTE_KEY]), str(raw["message"]), int(raw["position"]), int(raw["at_ms"]),
                       int(raw.get("stops", 1)), (int(counts[0]), int(counts[1])) if counts else None)
        except (ValueError, KeyError, TypeError):
            return None

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.at_ms / 1000))
        again = f" ({self.stops} times in a row)" if self.stops > 1 else ""
        return f"stopped on purpose at offset {self.position} on {when}{again}: {self.message}"


def read_notes(consumer: Consumer, topic: str, timeout_s: float = 10.0) -> dict[int, StopNote]:
    """The notes in the group's committed offsets of ``topic`` (partition -> note); {} when they cannot be read
    (the worker goes on: the notes are a courtesy, the offsets the contract)."""
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        partitions = sorted(metadata.partitions) if metadata is not None and metadata.partitions else []
        if not partitions:
            return {}
        committed = consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=timeout_s)
    except KafkaException as exc:
        log.info("could not read the group's committed offsets for notes of a stop on purpose: %s", exc)
        return {}
    notes = {}
    for tp in committed:
        note = StopNote.parse(getattr(tp, "metadata", None))
        if note is not None and tp.offset == note.position:
            notes[tp.partition] = note
    return notes


def leave_notes(consumer: Consumer, topic: str, positions: dict[int, int], error: StoppedOnPurpose,
                previous: dict[int, StopNote], timeout_s: float = 10.0) -> None:
    """Commit each of ``positions`` (partition -> the position it already has) again, with a note of ``error``;
    the count of stops in a row goes on from ``previous`` where the position has not moved."""
    if not positions:
        return
    now_ms = int(time.time() * 1000)
    offsets = []
    most = 1
    for partition, position in sorted(positions.items()):
        before = previous.get(partition)
        stops = before.stops + 1 if before is not None and before.position == position else 1
        note = StopNote(error.reason, str(error), position, now_ms, stops, error.counts)
        most = max(most, stops)
        offsets.append(TopicPartition(topic, partition, position, metadata=note.encode()))
    try:
        consumer.commit(offsets=offsets, asynchronous=False)
        kept = consumer.committed([TopicPartition(topic, tp.partition) for tp in offsets], timeout=timeout_s)
    except KafkaException as exc:
        log.warning("could not leave a note of this stop in the group's offsets: %s", exc)
        return
    if most > 1:
        log.warning("stopped on purpose %d times in a row at the same positions: restarting will not get past these "
                    "records (%s)", most, GUIDE)
    if not any(StopNote.parse(getattr(tp, "metadata", None)) for tp in kept):
        log.warning("the brokers keep no commit metadata (the embedded Tansu does not): the next start cannot "
                    "tell that this worker stopped on purpose")


class PreviousStops:
    """The notes a start found: what readiness and ``stream_stopped_on_purpose_partitions`` report, for the
    partitions this worker holds and has not committed past (``position(partition)``: its committed position)."""

    def __init__(self, topic: str, notes: dict[int, StopNote]) -> None:
        self.topic = topic
        self.notes = dict(notes)
        self._lock = threading.Lock()  # asked from the probes' and the metrics' threads

    def pending(self, assigned: Iterable[tuple[str, int]],
                position: Callable[[tuple[str, int]], int | None]) -> list[str]:
        """One line per held partition whose note this worker has not got past (notes it got past are dropped)."""
        out: list[str] = []
        if not self.notes:
            return out
        with self._lock:
            for topic, partition in assigned:
                note = self.notes.get(partition)
                if topic != self.topic or note is None:
                    continue
                at = position((topic, partition))
                if at is not None and at > note.position:
                    del self.notes[partition]
                    log.info("%s[%d]: past offset %d, where the last run stopped on purpose", topic, partition,
                             note.position)
                    continue
                out.append(f"{topic}[{partition}]: the last run {note.describe()}; not ready until past it "
                           f"({GUIDE})")
        return out

    def breaker_counts(self) -> tuple[int, int] | None:
        """The dead-letter breaker's counts the last run tripped with, if it stopped for that."""
        counts = [n.counts for n in self.notes.values() if n.counts is not None]
        return max(counts) if counts else None

    def log_found(self) -> None:
        for partition, note in sorted(self.notes.items()):
            log.warning("%s[%d]: the last run of this group %s. Resuming at offset %d: the same records stop it "
                        "again if they fail the same way (%s)", self.topic, partition, note.describe(),
                        note.position, GUIDE)
