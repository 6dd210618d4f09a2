"""What the worker does about dead letters beyond sending them: the circuit breaker that stops a worker whose model
fails on most of what it is given (`DeadLetterBreaker`), and the rate-limited report of the records the decode stage
refuses, their producer's fault (`RejectedInputs`)."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

from stream.errors import StoppedOnPurpose

log = logging.getLogger("stream.pipeline.processing")  # the name operators' log filters know these lines by


class DeadLetterBreaker:
    """Stops the worker when the model failed on more than ``max_fraction`` of the last ``window`` records it was
    given (records dead-lettered at the model stage, among those that reached the model; at least
    ``min(window, 100)`` of them).

    What the decode stage dead-letters never counts: such records are their producer's fault, however many come
    in a row, and the stream goes on past them (`RejectedInputs` reports them). A model or a deployment that fails
    on everything it is given is what the breaker is for: it stops the worker before it dead-letters the stream."""

    def __init__(self, max_fraction: float, window: int) -> None:
        self.max_fraction = max_fraction
        self.window = window
        self._recent: deque[tuple[int, int]] = deque()  # (records given to the model, failed) per batch
        self._records = 0
        self._dead = 0

    def prime(self, records: int, dead: int) -> None:
        """Start from the counts a previous run tripped with (`stream.pipeline.stops`): a restart that fails the
        same way stops at its first failed batch instead of dead-lettering another window's worth."""
        if records > 0 and not self._recent:
            self._recent.append((records, dead))
            self._records, self._dead = records, dead

    def record(self, records: int, dead: int, where: tuple[int, int] | None = None) -> None:
        """``records`` reached the model, ``dead`` of them failed it (``where``: the first failed one's input
        partition and offset)."""
        if records == 0:
            return
        self._recent.append((records, dead))
        self._records += records
        self._dead += dead
        while self._recent and self._records - self._recent[0][0] >= self.window:
            r, d = self._recent.popleft()
            self._records -= r
            self._dead -= d
        if dead and self._records >= min(self.window, 100) and self._dead > self.max_fraction * self._records:
            partition, offset = where if where is not None else (None, None)
            raise StoppedOnPurpose(
                "dead-letter-breaker",
                f"dead-letter circuit breaker: the model failed on {self._dead} of the last {self._records} "
                f"records it was given (> {self.max_fraction:.0%}); stopping instead of dead-lettering the stream",
                partition, offset, (self._records, self._dead))


class RejectedInputs:
    """The records the decode stage dead-letters (the input's fault): a WARNING at the first of them, then at most
    one every ``every_s`` (and at shutdown), how many since the last one by reason and where the latest was; the
    counts are also ``stream_dead_letters_total``'s ``stage="decode"`` series."""

    def __init__(self, topic: str, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.topic = topic
        self.every_s = every_s
        self._clock = clock
        self._since = clock()
        self._logged_at = -float("inf")
        self._reasons: dict[str, int] = {}
        self._last: tuple[int, int] | None = None

    def record(self, reasons: list[str], last: tuple[int, int]) -> None:
        if not self._reasons:
            self._since = self._clock()
        for reason in reasons:
            self._reasons[reason] = self._reasons.get(reason, 0) + 1
        self._last = last
        if self._clock() - self._logged_at >= self.every_s:
            self.flush()

    def flush(self) -> None:
        now = self._clock()
        if self._reasons and self._last is not None:
            total = sum(self._reasons.values())
            by_reason = ", ".join(f"{r} {n:,}" for r, n in sorted(self._reasons.items(), key=lambda kv: -kv[1]))
            log.warning("%s input records dead-lettered at the decode stage in the last %.0f s (%s), the latest at "
                        "%s[%d]@%d: their producer sends what the model cannot take; they are in the dead-letter "
                        "topic, and the records behind them are predicted", f"{total:,}", now - self._since,
                        by_reason, self.topic, *self._last)
            self._logged_at = now
        self._reasons = {}
