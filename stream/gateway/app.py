"""The gateway's HTTP service: Starlette on uvicorn, in front of a `PredictionClient`.

``POST /v1/predict`` takes one event (a JSON object of its fields) or a list of them and answers with the
prediction record(s) as JSON. Status codes:

* 200: the prediction (for a list: a list, each item the prediction or ``{"status": N, "error": ...}``);
* 400: the body is not JSON; 413: the body, or one event encoded, is over ``--max-input-bytes``, or a list is
  longer than ``--max-pending``; 422: the input schema refuses an event (``problems``: which field, why; nothing
  of the request is sent), or a worker dead-lettered it at its decode stage (``reason``);
* 500: a worker dead-lettered the event at its model stage (``reason``: model-error, out-of-memory);
* 503 with ``Retry-After``: ``--max-pending`` requests are already waiting (nothing sent), or the broker refused
  the event; 504: no prediction within ``--timeout-ms`` (``input_partition``/``input_offset`` say where the event
  is when the broker acknowledged it: it will still be predicted, into the output topic).

``/healthz``: 200 while the client's thread runs; ``/readyz``: 200 while the brokers answer, else 503;
``/metrics``: Prometheus text (``stream_gateway_*``).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from stream.gateway.client import (
    DeadLettered,
    NotSent,
    Overloaded,
    Oversized,
    Prediction,
    PredictionClient,
    Refused,
    RequestTimeout,
)
from stream.ops.gc_pauses import GcPauses

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class GatewayMetrics:
    def __init__(self, client: PredictionClient) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("stream_gateway_requests", "HTTP requests to /v1/predict, by status.", ["status"],
                                registry=r)
        self.latency = Histogram("stream_gateway_request_seconds",
                                 "Time from a /v1/predict request's arrival to its answer.",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.embeddings = Counter("stream_gateway_embeddings_requests",
                                  "HTTP requests to /v1/embeddings (OpenAI's API), by status.", ["status"], registry=r)
        self.infer = Counter("stream_gateway_infer_requests",
                             "HTTP requests to /v2/models/*/infer (the Open Inference Protocol), by status.",
                             ["status"], registry=r)
        self.infer_latency = Histogram("stream_gateway_infer_request_seconds",
                                       "Time from a v2 infer request's arrival to its answer.",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.embeddings_latency = Histogram("stream_gateway_embeddings_request_seconds",
                                            "Time from a /v1/embeddings request's arrival to its answer.",
                                            buckets=LATENCY_BUCKETS, registry=r)
        self.pending = Gauge("stream_gateway_pending", "Events sent and waiting for their predictions.",
                             registry=r)
        self.pending.set_function(lambda: client.pending)
        self.replies = Gauge("stream_gateway_replies_read", "Replies read from this gateway's reply partition.",
                             registry=r)
        self.replies.set_function(lambda: client.replies_read)
        self.foreign = Gauge("stream_gateway_replies_unmatched",
                             "Replies read that answer no pending request of this gateway's (expired ones, or "
                             "another gateway's on the same reply partition).", registry=r)
        self.foreign.set_function(lambda: client.foreign_replies)
        # The collector's pauses hold back every request waiting through them (docs/gateway.md).
        self.gc_pauses = GcPauses("stream_gateway")
        r.register(self.gc_pauses)


def _respond(status: int, body: dict[str, Any]) -> JSONResponse:
    """A failure's answer: a 503 says when to come back."""
    return JSONResponse(body, status_code=status, headers={"Retry-After": "1"} if status == 503 else None)


def _error(status: int, message: str, **more: Any) -> JSONResponse:
    return _respond(status, {"error": message, **more})


def _failure(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """An event's failure as (status, body)."""
    if isinstance(exc, DeadLettered):
        return (422 if exc.stage == "decode" else 500), {
            "error": str(exc), "stage": exc.stage, "reason": exc.reason, "input_partition": exc.partition,
            "input_offset": exc.offset}
    if isinstance(exc, RequestTimeout):
        return 504, {"error": str(exc), "input_partition": exc.partition, "input_offset": exc.offset,
                     "may_still_be_predicted": exc.offset is not None}
    if isinstance(exc, NotSent | Overloaded):
        return 503, {"error": str(exc)}
    return 500, {"error": f"{type(exc).__name__}: {exc}"}


async def read_body(request: Request, max_body_bytes: int) -> bytes | None:
    """The body, or None once it passes ``max_body_bytes`` (not read further)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_body_bytes:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def timed(handler: Callable[[Request], Awaitable[Response]], requests: Counter, latency: Histogram
          ) -> Callable[[Request], Awaitable[Response]]:
    """``handler`` counting its answers by status and timing them."""
    async def route(request: Request) -> Response:
        started = time.perf_counter()
        response = await handler(request)
        latency.observe(time.perf_counter() - started)
        requests.labels(str(response.status_code)).inc()
        return response

    return route


def build_app(client: PredictionClient, metrics: GatewayMetrics, max_body_bytes: int,
              more: Sequence[Route] = ()) -> Starlette:
    """The gateway's routes (``more``: another protocol's, `stream.gateway.openai`)."""
    async def answer(request: Request) -> Response:
        body = await read_body(request, max_body_bytes)
        if body is None:
            return _error(413, f"the request body is over --max-input-bytes ({max_body_bytes})")
        try:
            payload = json.loads(body)
        except ValueError as exc:
            return _error(400, f"the body is not JSON: {exc}")
        single = not isinstance(payload, list)
        events = [payload] if single else payload
        if not events:
            return _error(422, "an empty list has no event to predict")
        if len(events) > client.max_pending:
            return _error(413, f"{len(events)} events in one request, over --max-pending ({client.max_pending})")
        values = []
        for i, event in enumerate(events):
            try:
                values.append(client.encode(event))
            except Refused as exc:
                return _error(422, str(exc), problems=exc.problems, **({} if single else {"index": i}))
            except Oversized as exc:
                return _error(413, str(exc), **({} if single else {"index": i}))
        if client.pending + len(values) > client.max_pending:
            return _error(503, f"{client.pending} requests are waiting for their predictions (--max-pending "
                               f"{client.max_pending}): try again shortly")
        futures: list[Awaitable[Any]] = []
        for value in values:
            try:
                futures.append(asyncio.wrap_future(client.submit_encoded(value)))
            except Overloaded as exc:
                if not futures:
                    return _error(503, str(exc))
                futures.append(_failed(exc))
        results = await asyncio.gather(*futures, return_exceptions=True)
        if single:
            result = results[0]
            if isinstance(result, Prediction):
                return JSONResponse(result.record)
            return _respond(*_failure(result))
        items = [r.record if isinstance(r, Prediction) else dict(zip(("status", "error"), _failure(r), strict=True))
                 for r in results]
        return JSONResponse(items)

    async def healthz(_request: Request) -> Response:
        alive = client.alive()
        return JSONResponse({"alive": alive}, status_code=200 if alive else 503)

    async def readyz(_request: Request) -> Response:
        ready = client.ready()
        return JSONResponse({"ready": ready, **({} if ready else {"why": "the brokers do not answer, or the "
                                                                         "gateway is stopping"})},
                            status_code=200 if ready else 503)

    async def prometheus(_request: Request) -> Response:
        return Response(generate_latest(metrics.registry), media_type="text/plain; version=0.0.4")

    routes = [Route("/v1/predict", timed(answer, metrics.requests, metrics.latency), methods=["POST"]),
              Route("/healthz", healthz), Route("/readyz", readyz), Route("/metrics", prometheus), *more]
    return Starlette(routes=routes)


def _failed(exc: BaseException) -> Awaitable[Any]:
    future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    future.set_exception(exc)
    return future

