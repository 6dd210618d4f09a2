"""The worker's first failure, from whichever thread meets it: kept once, named as the missing ACL when the
brokers refused an operation, reported to the probes, and the worker told to stop; the clients' error callbacks
that decide what is a failure and what a connection trouble to report once."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from confluent_kafka import KafkaError

from stream.config import WorkerSettings
from stream.errors import KafkaClientError
from stream.kafka.access import AUTHORIZATION_ERRORS, denied
from stream.kafka.client_logs import ConnectionWatch
from stream.ops.health import Health

log = logging.getLogger(__name__)


class Failure:
    def __init__(self, settings: WorkerSettings, health: Health, connection: ConnectionWatch,
                 stop: threading.Event) -> None:
        self._settings, self._health, self._connection, self._stop = settings, health, connection, stop
        self.error: BaseException | None = None
        self._lock = threading.Lock()

    def fail(self, exc: BaseException) -> None:
        if isinstance(exc, KafkaClientError) and isinstance(exc.kafka_error, KafkaError):
            # The brokers refused an operation: say which ACL is missing.
            where = "consumer" if exc.operation in ("consume", "consumer") else "producer"
            exc = denied(exc.kafka_error, self._settings, where) or exc
        with self._lock:
            if self.error is None:
                self.error = exc
                self._health.failed = f"{type(exc).__name__}: {exc}"
                log.error("worker failing: %s: %s", type(exc).__name__, exc)
        self._stop.set()

    def watching(self, publisher_failure: Callable[[], BaseException | None]) -> Callable[[], bool]:
        """The check the worker's threads make once the publisher exists: the worker failed, or its publisher did
        (then the worker fails now)."""
        def failed() -> bool:
            if self.error is None:
                failure = publisher_failure()
                if failure is not None:
                    self.fail(failure)
            return self.error is not None
        return failed

    def on_consumer_error(self, err: KafkaError) -> None:
        if err.fatal() or err.code() in AUTHORIZATION_ERRORS:
            self.fail(KafkaClientError("consumer", err))
        elif not self._connection.error("consumer", err):
            log.warning("consumer: %s", err)
