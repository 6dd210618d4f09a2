"""Consumed input records of one topic as a few arrays: what the poll thread batches and the processor reads.

The values sit back to back in one ``bytes`` (the decoder scans it in place, no ``bytes`` object per value); the
keys stay a list, which the producers take as is. Built either by the native consumer (``stream.kafka.native``: straight
from librdkafka, no ``Message`` object per record) or from confluent-kafka ``Message``s (``from_messages``).
"""

from __future__ import annotations

import time
from collections.abc import Container, Sequence
from dataclasses import dataclass

import numpy as np
from confluent_kafka import Message

from stream.kafka.replies import ADDRESS_HEADERS, AddressHeaders

_EMPTY_I64 = np.zeros(0, dtype=np.int64)


# `Records.compact` leaves a shared buffer alone while what it holds beside the records' values is at most this
# (or at most their own bytes)
_COMPACT_SLACK = 1_048_576

# The most records one confluent-kafka ``consume()`` call is asked for where the records come from anyone: each
# record's Message holds its headers, parsed whole at the call (up to librdkafka's 100,000, some 6.6 MB), until the
# Message is let go; a call's Messages are read and let go before the next call. Each call gives up the GIL once:
# at 64 the demo's drains on that path ran at 0.88-0.92 of one call a take (docs/performance.md).
MESSAGES_A_CONSUME = 64

# `Records.lengths` of a record in a batch the consumer could not decompress (`stream.kafka.unreadable`): no value
# is known; the decode stage dead-letters it as ``unreadable``
UNREADABLE = -2


@dataclass(frozen=True)
class Records:
    buffer: bytes  # every value, back to back
    starts: np.ndarray  # int64: where each value starts in buffer
    lengths: np.ndarray  # int64: each value's length, -1 for a null value (a tombstone), UNREADABLE
    keys: list[bytes | None]
    partitions: np.ndarray  # int32
    offsets: np.ndarray  # int64
    # {row: its watched headers' values (`stream.kafka.replies.watched_headers`: a reply address's, then those carried
    # onto its prediction)} of the records carrying any of them; None when none does
    replies: dict[int, AddressHeaders] | None = None
    # int64: each record's bytes beside its value, which count toward a batch's bytes as its value's do: its key's
    # and its watched headers' values' (in `replies`); None when no record has any
    side_bytes: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.keys)

    @classmethod
    def empty(cls) -> Records:
        return cls(b"", _EMPTY_I64, _EMPTY_I64, [], np.zeros(0, dtype=np.int32), _EMPTY_I64)

    @classmethod
    def unreadable(cls, partitions: list[int], offsets: list[int]) -> Records:
        """Rows for offsets of batches the consumer could not read: no value, no key."""
        n = len(offsets)
        return cls(b"", np.zeros(n, dtype=np.int64), np.full(n, UNREADABLE, dtype=np.int64), [None] * n,
                   np.array(partitions, dtype=np.int32), np.array(offsets, dtype=np.int64))

    @classmethod
    def build(cls, values: Sequence[bytes | None], keys: list[bytes | None], partitions: Sequence[int],
              offsets: Sequence[int], replies: dict[int, AddressHeaders] | None = None) -> Records:
        n = len(values)
        lengths = np.fromiter((-1 if v is None else len(v) for v in values), dtype=np.int64, count=n)
        sizes = np.maximum(lengths, 0)
        side_bytes = np.fromiter((0 if k is None else len(k) for k in keys), dtype=np.int64, count=n)
        for row, held in (replies or {}).items():
            side_bytes[row] += sum(len(v) for v in held if isinstance(v, bytes))
        return cls(b"".join(v for v in values if v is not None), np.cumsum(sizes) - sizes, lengths, keys,
                   np.fromiter(partitions, dtype=np.int32, count=n), np.fromiter(offsets, dtype=np.int64, count=n),
                   replies or None, side_bytes if side_bytes.any() else None)

    @classmethod
    def from_messages(cls, messages: Sequence[Message], watched: Sequence[str] = ADDRESS_HEADERS) -> Records:
        """Records of consumed, error-free ``Message``s (each has a partition and an offset); ``watched``: the
        header names whose values `replies` holds."""
        rows = MessageRows(watched)
        rows.add(list(messages))
        return rows.records()

    @classmethod
    def concat(cls, parts: Sequence[Records]) -> Records:
        """One batch of several consumed chunks, in order."""
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        shifts = np.cumsum([0] + [len(p.buffer) for p in parts[:-1]])
        keys: list[bytes | None] = []
        replies: dict[int, AddressHeaders] = {}
        for p in parts:
            if p.replies:
                replies.update((len(keys) + row, address) for row, address in p.replies.items())
            keys += p.keys
        side_bytes = None
        if any(p.side_bytes is not None for p in parts):
            side_bytes = np.concatenate([np.zeros(len(p), dtype=np.int64) if p.side_bytes is None
                                           else p.side_bytes for p in parts])
        return cls(b"".join(p.buffer for p in parts),
                   np.concatenate([p.starts + shift for p, shift in zip(parts, shifts.tolist(), strict=True)]),
                   np.concatenate([p.lengths for p in parts]), keys,
                   np.concatenate([p.partitions for p in parts]), np.concatenate([p.offsets for p in parts]),
                   replies or None, side_bytes)

    @property
    def nbytes(self) -> int:
        """The bytes of their values, keys and watched headers' values (the buffer may hold more: one shared after
        `split` or `select`)."""
        return int(self.sizes().sum())

    def sizes(self) -> np.ndarray:
        """Each record's bytes (int64): its value's, key's and watched headers' values' (`nbytes`: their sum)."""
        sizes: np.ndarray = np.maximum(self.lengths, 0)
        return sizes if self.side_bytes is None else sizes + self.side_bytes

    def compact(self) -> Records:
        """These records over a buffer of their own values, where the one they share holds more than as many
        bytes again beside them (a batch cut from a large take would keep all of it alive, and `concat` copy
        it whole); else themselves."""
        sizes = np.maximum(self.lengths, 0)
        used = int(sizes.sum())
        if len(self.buffer) - used <= max(used, _COMPACT_SLACK):
            return self
        starts = np.cumsum(sizes) - sizes
        first = int(self.starts[0]) if len(self) else 0
        if np.array_equal(self.starts - first, starts):  # one run (a split's part): one copy
            buffer = self.buffer[first:first + used]
        else:
            view = memoryview(self.buffer)
            buffer = b"".join(view[a:a + n] for a, n in zip(self.starts.tolist(), sizes.tolist(), strict=True))
        return Records(buffer, starts, self.lengths, self.keys, self.partitions, self.offsets, self.replies,
                       self.side_bytes)

    def value(self, i: int) -> bytes | None:
        n = int(self.lengths[i])
        if n < 0:
            return None
        start = int(self.starts[i])
        return self.buffer[start:start + n]

    def values(self) -> list[bytes | None]:
        """One ``bytes`` (or None) per record: for the paths that need them (fastavro, the Python producer)."""
        buf = self.buffer
        return [None if n < 0 else buf[s:s + n] for s, n in zip(self.starts.tolist(), self.lengths.tolist(),
                                                                   strict=True)]

    def select(self, rows: np.ndarray) -> Records:
        """The records at ``rows`` (the buffer is shared)."""
        picked = rows.tolist()
        replies = None
        if self.replies:
            replies = {new: self.replies[old] for new, old in enumerate(picked) if old in self.replies} or None
        side_bytes = None if self.side_bytes is None else self.side_bytes[rows]
        return Records(self.buffer, self.starts[rows], self.lengths[rows], [self.keys[i] for i in picked],
                       self.partitions[rows], self.offsets[rows], replies, side_bytes)

    def split(self, n: int) -> tuple[Records, Records]:
        """(the first n records, the rest)."""
        head = rest = None
        if self.replies:
            head = {row: a for row, a in self.replies.items() if row < n} or None
            rest = {row - n: a for row, a in self.replies.items() if row >= n} or None
        side = self.side_bytes
        return (Records(self.buffer, self.starts[:n], self.lengths[:n], self.keys[:n], self.partitions[:n],
                        self.offsets[:n], head, None if side is None else side[:n]),
                Records(self.buffer, self.starts[n:], self.lengths[n:], self.keys[n:], self.partitions[n:],
                        self.offsets[n:], rest, None if side is None else side[n:]))

    def without_partitions(self, partitions: Container[int]) -> Records:
        """The records of every partition but ``partitions`` (e.g. revoked ones)."""
        present = np.unique(self.partitions).tolist()
        drop = [p for p in present if p in partitions]
        if not drop:
            return self
        return self.select(np.flatnonzero(~np.isin(self.partitions, drop)))


class MessageRows:
    """Consumed, error-free ``Message``s gathered a chunk at a time into one `Records`. `add` lets each Message go
    once read: confluent-kafka parses a record's headers whole at ``consume`` (up to 100,000 of them, some 6.6 MB) and
    keeps them on its Message, so a take held as Messages at once is bounded by its count alone."""

    def __init__(self, watched: Sequence[str] = ADDRESS_HEADERS) -> None:
        self._watched = watched
        self._values: list[bytes | None] = []
        self._keys: list[bytes | None] = []
        self._partitions: list[int] = []
        self._offsets: list[int] = []
        self._replies: dict[int, AddressHeaders] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def add(self, messages: list[Message]) -> None:
        """Reads these Messages in order and empties the list (each dropped as soon as it is read)."""
        watched = self._watched
        taken_ns = time.time_ns()
        messages.reverse()
        while messages:
            m = messages.pop()
            headers = m.headers()
            if headers:
                pairs = headers.items() if isinstance(headers, dict) else headers  # a consumed one's: a list
                named = {k: v for k, v in pairs if k in watched}  # the last of each name; a null one is absent
                last = {k: v for k, v in named.items() if isinstance(v, bytes)}
                if last:
                    kind, ts_ms = m.timestamp()
                    self._replies[len(self._keys)] = (*(last.get(name) for name in watched), ts_ms if kind else None,
                                                      taken_ns)
            self._values.append(m.value())
            self._partitions.append(m.partition())  # type: ignore[arg-type]
            self._offsets.append(m.offset())  # type: ignore[arg-type]
            self._keys.append(m.key())

    def records(self) -> Records:
        """Every row added so far, in order."""
        if not self._keys:
            return Records.empty()
        return Records.build(self._values, self._keys, self._partitions, self._offsets, self._replies)
