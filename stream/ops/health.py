"""``/healthz`` and ``/readyz`` beside ``/metrics``, for liveness and readiness probes.

- ``/healthz`` (liveness): the worker has not failed, once it consumes its poll loop went round within
  ``LIVENESS_S``, and no call into the model has been under way for ``--model-timeout-s`` (the warm-up's
  included, before the worker consumes). A worker whose poll loop or model is stuck is restarted by its
  orchestrator; one waiting on unreachable brokers is not (its loop keeps turning, and at start-up it waits by
  design: a restart would not bring the brokers back).
- ``/readyz`` (readiness): the model is loaded, the worker has joined its group (an assignment arrived, even
  an empty one: with more replicas than partitions some hold none), the brokers can be reached, and no
  partition is stalled (records waiting, no committed progress for ``--stall-timeout-s``), and it has got past
  every position where the group's last run stopped on purpose on its partitions (`stream.pipeline.stops`).

Both answer 200 ``ok`` or 503 with the reasons, one per line.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

log = logging.getLogger(__name__)
LIVENESS_S = 30.0
MAX_CONNECTIONS = 64  # connections served at once (probes, scrapes); past it the oldest is closed
READ_TIMEOUT_S = 10.0  # a connection whose client sends nothing for this long is closed
MAX_REQUEST_BYTES = 16 * 1024  # request line and headers: a probe or a scrape sends a few hundred


class Health:
    """What the probes report; written by the worker's threads (single writes of plain values)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._tick = clock()
        self.polling = False  # the poll loop started: from then on it must keep going round
        self.model_loaded = False
        self.warming: str | None = None  # the model's warm-up under way (what it has done so far)
        self.joined = False  # an assignment (possibly empty) arrived from the group
        self.failed: str | None = None
        self.unreachable: Callable[[], bool] = lambda: False
        self.stalled: Callable[[], int] = lambda: 0
        self.stopped_before: Callable[[], list[str]] = list  # partitions held where the last run stopped on purpose
        self.hung: Callable[[], str | None] = lambda: None  # a call into the model past --model-timeout-s

    def tick(self) -> None:
        """The poll loop went round."""
        self._tick = self._clock()

    def live(self) -> list[str]:
        """Reasons the worker is not alive (empty: alive)."""
        reasons = []
        if self.failed is not None:
            reasons.append(f"failed: {self.failed}")
        quiet = self._clock() - self._tick
        if self.polling and quiet > LIVENESS_S:
            reasons.append(f"poll loop has not gone round for {quiet:.0f}s")
        hung = self.hung()
        if hung is not None:
            reasons.append(hung)
        return reasons

    def ready(self) -> list[str]:
        """Reasons the worker is not ready (empty: ready)."""
        reasons = self.live()
        if not self.model_loaded:
            reasons.append("model not loaded")
        if self.warming is not None:
            reasons.append(f"warming the model: {self.warming}")
        if not self.joined:
            reasons.append("not in the consumer group yet (no assignment)")
        if self.unreachable():
            reasons.append("Kafka brokers unreachable")
        stalled = self.stalled()
        if stalled:
            reasons.append(f"{stalled} partition{'s' if stalled > 1 else ''} stalled")
        reasons += self.stopped_before()
        return reasons


class _RequestTooLarge(Exception):
    pass


class _Capped:
    """A connection's reader that refuses to read past ``budget`` bytes (`_RequestTooLarge`)."""

    def __init__(self, raw: Any, budget: int) -> None:
        self._raw, self._left = raw, budget

    def _take(self, n: int) -> int:
        if self._left <= 0:
            raise _RequestTooLarge
        return self._left if n is None or n < 0 else min(n, self._left)

    def readline(self, limit: int = -1) -> bytes:
        line: bytes = self._raw.readline(self._take(limit))
        self._left -= len(line)
        return line

    def read(self, n: int = -1) -> bytes:
        data: bytes = self._raw.read(self._take(n))
        self._left -= len(data)
        return data

    def close(self) -> None:
        self._raw.close()


class _Quiet(WSGIRequestHandler):
    """One request a connection (HTTP/1.0), read within `READ_TIMEOUT_S` a read and `MAX_REQUEST_BYTES` in all:
    a probe or a scrape sends a few hundred bytes at once."""

    timeout = READ_TIMEOUT_S

    def setup(self) -> None:
        super().setup()
        self.rfile = _Capped(self.rfile, MAX_REQUEST_BYTES)  # type: ignore[assignment]

    def handle(self) -> None:
        try:
            super().handle()
        except _RequestTooLarge:
            self.close_connection = True
            self.send_error(431, f"the request line and headers exceed {MAX_REQUEST_BYTES} bytes")
        except (TimeoutError, ConnectionError):
            pass  # a client that sent nothing in time, or left (or was let go: `_Threading`)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Threading(ThreadingMixIn, WSGIServer):
    """A thread a connection, at most `MAX_CONNECTIONS` at once: past that the oldest is closed, so that clients
    that connect and send nothing (or drip) can neither grow the threads nor keep a new probe out."""

    daemon_threads = True  # a probe that hangs never holds the worker's exit

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._open: dict[int, socket.socket] = {}  # by when it came: insertion order
        self._open_lock = threading.Lock()
        self.evicted = 0

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            while len(self._open) >= MAX_CONNECTIONS:
                oldest = self._open.pop(next(iter(self._open)))
                self.evicted += 1
                with contextlib.suppress(OSError):
                    oldest.shutdown(socket.SHUT_RDWR)  # its thread's read returns: it ends and closes it
            self._open[id(request)] = request
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._open_lock:
                if self._open.get(id(request)) is request:
                    del self._open[id(request)]

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("metrics and probes: a request from %s failed", client_address, exc_info=True)


def serve(registry: CollectorRegistry, health: Health, port: int, host: str, last_port: int | None = None
          ) -> WSGIServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` on ``host:port`` from a daemon thread (``.shutdown()``); any
    other path answers 404. With ``last_port``, on the first port from ``port`` to it that is free (its
    ``server_port`` says which)."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in ("/healthz", "/readyz"):
            reasons = health.live() if path == "/healthz" else health.ready()
            start_response("503 Service Unavailable" if reasons else "200 OK",
                           [("Content-Type", "text/plain; charset=utf-8")])
            return [("\n".join(reasons) if reasons else "ok").encode() + b"\n"]
        if path == "/metrics":
            return metrics(environ, start_response)  # type: ignore[no-any-return]
        # Any other path is 404, so that a mistyped probe (/readz) fails instead of passing on the metrics page.
        start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
        return [f"no {path}: this port serves /metrics, /healthz and /readyz\n".encode()]

    last = last_port if last_port is not None else port
    for candidate in range(port, last + 1):
        try:
            server = make_server(host, candidate, app, server_class=_Threading, handler_class=_Quiet)
            break
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or candidate == last:
                raise
    log.info("metrics and probes on http://%s:%d (/metrics, /healthz, /readyz)", host, server.server_port)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
