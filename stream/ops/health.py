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

import errno
import logging
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

log = logging.getLogger(__name__)
LIVENESS_S = 30.0


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


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Threading(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a probe that hangs never holds the worker's exit


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
