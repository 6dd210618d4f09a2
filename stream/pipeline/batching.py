"""A pure count-, weight-, byte- or time micro-batcher: no threads, no Kafka, an injected monotonic clock."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

import numpy as np

from stream.errors import ConfigError

T = TypeVar("T")
Clock = Callable[[], float]


class MicroBatcher(Generic[T]):
    """Collects items into batches that close at ``max_batch_size`` items, or once the batch's
    FIRST item has waited ``max_wait_ms`` (measured on ``clock``, seconds, monotonic).

    With ``size``, each item is a chunk of that many records (the worker's consumed ``Records``), and every
    count here (``len``, ``room``, the size limit, ``discard``) is of records. With ``weight`` and ``max_weight``
    a batch is also ready once its items weigh ``max_weight`` (a text model's token bound: `token_bounds`), and
    with ``nbytes`` and ``max_bytes`` once they hold that many bytes; the caller cuts what it takes at those bounds
    (`byte_room` says how many more bytes fit)."""

    def __init__(self, max_batch_size: int, max_wait_ms: float, clock: Clock = time.monotonic,
                 size: Callable[[T], int] | None = None, weight: Callable[[T], int] | None = None,
                 max_weight: int | None = None, nbytes: Callable[[T], int] | None = None,
                 max_bytes: int | None = None) -> None:
        if max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_wait_ms < 0:
            raise ConfigError(f"max_wait_ms must be >= 0, got {max_wait_ms}")
        if max_weight is not None and (max_weight < 1 or weight is None):
            raise ConfigError(f"max_weight must be >= 1 and come with a weight, got {max_weight}")
        if max_bytes is not None and (max_bytes < 1 or nbytes is None):
            raise ConfigError(f"max_bytes must be >= 1 and come with nbytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self._nbytes = nbytes
        self._bytes = 0
        self.max_batch_size = max_batch_size
        self.max_weight = max_weight
        self._weigh = weight
        self._weight = 0
        self.max_wait_s = max_wait_ms / 1000.0
        self._clock = clock
        self._size = size
        self._items: list[T] = []
        self._count = 0
        self._opened_at: float | None = None

    def __len__(self) -> int:
        return self._count

    def _measure(self, items: list[T]) -> int:
        size = self._size
        return len(items) if size is None else sum(size(item) for item in items)

    def _weigh_all(self, items: list[T]) -> int:
        weigh = self._weigh
        return 0 if weigh is None else sum(weigh(item) for item in items)

    @property
    def weight(self) -> int:
        return self._weight

    @property
    def bytes(self) -> int:
        return self._bytes

    @property
    def byte_room(self) -> int | None:
        """How many more bytes fit before the batch is full (None: no byte bound)."""
        return None if self.max_bytes is None else max(self.max_bytes - self._bytes, 0)

    def _bytes_of(self, items: list[T]) -> int:
        nbytes = self._nbytes
        return 0 if nbytes is None else sum(nbytes(item) for item in items)

    @property
    def room(self) -> int:
        """How many items fit before the batch is full."""
        return max(self.max_batch_size - self._count, 0)

    def add(self, items: Iterable[T]) -> None:
        """Append items (in order); the clock starts at the first item of an empty batch.

        Adding beyond ``max_batch_size`` is allowed (a batch never splits records of one poll
        arbitrarily); `ready` is then true at once.
        """
        added = list(items)
        before = self._count
        self._items.extend(added)
        self._count += self._measure(added)
        self._weight += self._weigh_all(added)
        self._bytes += self._bytes_of(added)
        if before == 0 and self._count:
            self._opened_at = self._clock()

    def deadline(self) -> float | None:
        """Clock time at which the open batch must close, or None when empty."""
        return None if self._opened_at is None else self._opened_at + self.max_wait_s

    def time_left(self) -> float | None:
        """Seconds until the open batch's deadline (>= 0), or None when empty."""
        deadline = self.deadline()
        return None if deadline is None else max(deadline - self._clock(), 0.0)

    def ready(self) -> bool:
        if not self._count:
            return False
        if self._count >= self.max_batch_size:
            return True
        if self.max_weight is not None and self._weight >= self.max_weight:
            return True
        if self.max_bytes is not None and self._bytes >= self.max_bytes:
            return True
        deadline = self.deadline()
        return deadline is not None and self._clock() >= deadline

    def items(self) -> list[T]:
        """The open batch's items (a copy of the list; the batch stays open)."""
        return list(self._items)

    def take(self) -> list[T]:
        """Close the batch and return its items (possibly empty); the next add opens a new one."""
        items, self._items, self._count, self._opened_at = self._items, [], 0, None
        self._weight = self._bytes = 0
        return items

    def discard(self, keep: Callable[[T], T | bool]) -> int:
        """Drop items for which ``keep`` is false (e.g. revoked partitions); returns how many were dropped.
        For chunks, ``keep`` may also return what is kept of an item (an empty chunk drops it).

        The batch keeps its opening time: the remaining first item has waited at least that long.
        """
        kept: list[T] = []
        for item in self._items:
            verdict = keep(item)
            if verdict is True:
                kept.append(item)
            elif verdict is not False and (self._size is None or self._size(verdict)):
                kept.append(verdict)
        count = self._measure(kept)
        dropped = self._count - count
        self._items, self._count = kept, count
        self._weight = self._weigh_all(kept)
        self._bytes = self._bytes_of(kept)
        if not count:
            self._items = []
            self._opened_at = None
        return dropped


def token_bounds(lengths: np.ndarray, cap: int) -> np.ndarray:
    """Each record's most tokens for a text model, from its value's length (bytes; -1 a tombstone): a WordPiece
    token takes at least one character of the text, the text is within the value, and the model adds two ([CLS],
    [SEP]) and cuts at ``cap`` (its ``--max-tokens``). An upper bound, known before decoding: a batch closed on
    it never holds more tokens than it says (text-embeddings-inference counts after tokenizing, so its batches
    carry more texts for the same number)."""
    bounds: np.ndarray = np.minimum(np.maximum(lengths, 0) + 2, cap)
    return bounds
