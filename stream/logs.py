"""The command-line processes' logging: one line a record on stderr, with the process id; `Throttle` for a line
an event can ask for thousands of times a second."""

from __future__ import annotations

import logging
import sys


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=getattr(logging, level), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s[%(process)d] %(message)s")
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # the schema registry client logs every request


class Throttle:
    """At most one log line every ``every_s`` for an event that can come thousands of times a second (what a
    producer or a caller sends): `due` is None while the last line is recent (the event is counted), else how many
    events went unlogged before this one, which the caller's line says. Not locked: one thread, or its caller's
    lock."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._at: float | None = None  # when the last line was due
        self._unlogged = 0

    def due(self, now: float) -> int | None:
        if self._at is not None and now - self._at < self.every_s:
            self._unlogged += 1
            return None
        unlogged, self._at, self._unlogged = self._unlogged, now, 0
        return unlogged
