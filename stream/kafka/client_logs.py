"""What the Kafka clients say, in the worker's own log at a bearable rate.

Against brokers that cannot be reached, librdkafka reports the same failure from every client on every reconnect
attempt (its ``error_cb`` about every 50 ms, its own ``%3|...`` log lines on stderr besides): twenty lines a
second, forever. Here:

- `ConnectionWatch` turns the clients' connection errors into one WARNING when the brokers become unreachable, a
  reminder at most every ``remind_s`` (30 s) with how long it has lasted, and one INFO when the worker hears from
  them again (records taken, a partition assigned, a prediction acknowledged);
- `client_logger` gives each client a logger under ``stream.librdkafka`` (confluent-kafka's ``logger`` setting,
  served by the client's poll), whose `RepeatFilter` lets the same line through at most once per ``remind_s``,
  with the count of those held back.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

from confluent_kafka import KafkaError

log = logging.getLogger(__name__)
REMIND_S = 30.0
# Errors that say a broker could not be reached (or dropped the connection), not that a request failed.
CONNECTION_ERRORS = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE})


class ConnectionWatch:
    """Whether the brokers can be reached, from the clients' errors and the worker's progress; thread-safe (the
    clients' callbacks run on whichever thread polls them)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, remind_s: float = REMIND_S,
                 logger: logging.Logger = log) -> None:
        self._clock = clock
        self._remind_s = remind_s
        self._log = logger
        self._lock = threading.Lock()
        self._down_since: float | None = None
        self._last_line = 0.0
        self._last_error = 0.0
        self._held = 0

    @property
    def unreachable(self) -> bool:
        return self._down_since is not None

    def unreachable_for(self) -> float:
        """Seconds since the brokers became unreachable (0: reachable)."""
        since = self._down_since
        return 0.0 if since is None else self._clock() - since

    def on_admin_error(self, err: KafkaError) -> None:
        """An admin client's ``error_cb``: a connection error reported here, at its rate; any other, a WARNING."""
        if not self.error("admin", err):
            self._log.warning("admin: %s", err)

    def error(self, client: str, err: KafkaError) -> bool:
        """A client's non-fatal error: True when it was a connection error (logged here, at its rate), False when
        the caller should report it itself."""
        if err.code() not in CONNECTION_ERRORS:
            return False
        with self._lock:
            now = self._clock()
            # No connection error for two reminder periods and no news of recovery: a new outage all the same.
            if self._down_since is None or now - self._last_error > 2 * self._remind_s:
                self._down_since, self._last_line, self._held = now, now, 0
                self._last_error = now
                line = f"cannot reach the Kafka brokers ({client}: {err.str()}); retrying"
            elif now - self._last_line >= self._remind_s:
                line = (f"still cannot reach the Kafka brokers after {now - self._down_since:.0f} s ({client}: "
                        f"{err.str()}; {self._held} more such errors since the last line)")
                self._last_line, self._held, self._last_error = now, 0, now
            else:
                self._held += 1
                self._last_error = now
                return True
        self._log.warning("%s", line)
        return True

    def reachable(self) -> None:
        """Evidence that the brokers answer (records, an assignment, an acknowledgement)."""
        if self._down_since is None:  # the common case, without the lock
            return
        with self._lock:
            if self._down_since is None:
                return
            lasted = self._clock() - self._down_since
            self._down_since = None
        self._log.info("the Kafka brokers answer again, after %.0f s unreachable", lasted)


class RepeatFilter(logging.Filter):
    """Lets a line through once per ``window_s`` per (logger, text with its numbers blanked); the next one through
    says how many were held back."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, window_s: float = REMIND_S) -> None:
        super().__init__()
        self._clock = clock
        self._window_s = window_s
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}  # key -> (last let through, held since)
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, re.sub(r"\d+", "#", record.getMessage()))
        now = self._clock()
        with self._lock:
            last, held = self._seen.get(key, (float("-inf"), 0))
            if now - last < self._window_s:
                self._seen[key] = (last, held + 1)
                return False
            if len(self._seen) > 1000:  # bounded: forget lines not seen for a window
                self._seen = {k: v for k, v in self._seen.items() if now - v[0] < self._window_s}
            self._seen[key] = (now, 0)
        if held:
            record.msg = f"{record.getMessage()} ({held} more like it in the last {now - last:.0f} s)"
            record.args = None
        return True


_FILTER = RepeatFilter()


def client_logger(client: str) -> logging.Logger:
    """The logger a client's librdkafka lines go to (``stream.librdkafka.<client>``), repeats held back."""
    logger = logging.getLogger(f"stream.librdkafka.{client}")
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger
