"""A point in time on an injected monotonic clock, for the bounded waits of shutdown, revokes and commits."""

from __future__ import annotations

import time
from collections.abc import Callable


class Deadline:
    """``seconds`` from now on ``clock`` (``float("inf")``: never)."""

    __slots__ = ("_at", "_clock")

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._at = clock() + seconds

    def left(self, floor: float = 0.0) -> float:
        """Seconds left, never less than ``floor`` (a short last wait rather than none)."""
        return max(self._at - self._clock(), floor)

    def passed(self) -> bool:
        return self._clock() >= self._at
