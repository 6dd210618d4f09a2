"""The gateway's own protocol and the app every protocol's operations are served by.

``POST /v1/predict`` takes one event (a JSON object of the input schema's fields) or a non-empty list of them and
answers with the prediction record, or the list of them in order. All or nothing: one event that fails fails the
request, naming it (``index``). Status codes (`OWN_ERRORS`):

* 200: the prediction(s);
* 400: the body is not JSON, or not an event or a list of them;
* 408: the body did not arrive within ``--body-timeout-s``;
* 413: the body is over ``--max-body-bytes``, an event encoded over ``--max-input-bytes`` (or more than the broker
  takes), or more events than ``--max-pending``;
* 422: the input schema refuses an event, or the workers' decode stage would (``problems``: which field, why);
  nothing of the request is sent;
* 500: a worker dead-lettered the event at its model stage (``reason``), or its reply could not be read;
* 503 with ``Retry-After``: no worker serves the input topic, ``--max-pending`` events already wait, or the
  bodies being read fill ``--max-buffered-bytes`` (nothing sent); or the broker did not take an event;
* 504: no prediction within ``--timeout-ms`` (``input_partition``/``input_offset`` say where the event is when the
  broker acknowledged it: it will still be predicted, into the output topic).

``sent`` in an error says whether any event of the request reached the topic. ``/healthz``: 200 while the
client's thread runs; ``/readyz``: 200 while the brokers answer and a worker serves the input topic, else 503 with
why; ``/metrics``: Prometheus text (``stream_gateway_*``); ``/openapi.json``: the document of every route.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from stream.gateway.client import PredictionClient
from stream.gateway.door import Door, trace_context
from stream.gateway.errors import (
    BadReply,
    BadRequest,
    BodyTimeout,
    DeadLettered,
    DeadLetteredAtDecode,
    DeadLetteredAtModel,
    GatewayError,
    NotFound,
    NotSent,
    NoWorkers,
    Overloaded,
    Oversized,
    Refused,
    RequestTimeout,
    TooManyEvents,
    Unavailable,
)
from stream.gateway.http import (
    JSON,
    NOT_READY_RETRY_AFTER,
    ErrorTable,
    Operation,
    endpoint,
    error_for_path,
    error_responses,
    json_response,
    parse_json,
)
from stream.gateway.openapi import document, schema_of
from stream.gateway.server import BodyBudget
from stream.ops.gc_pauses import GcPauses

LATENCY_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class GatewayMetrics:
    def __init__(self, client: PredictionClient | None) -> None:
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
        if client is not None:
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
        self.buffered = Gauge("stream_gateway_body_bytes",
                              "Bytes of request bodies held by requests in flight (--max-buffered-bytes).", registry=r)
        # The collector's pauses hold back every request waiting through them (docs/gateway.md).
        self.gc_pauses = GcPauses("stream_gateway")
        r.register(self.gc_pauses)


class ErrorBody(BaseModel):
    """The gateway's own error body."""

    error: str
    index: int | None = None  # the event of the request it is about
    problems: list[str] | None = None  # which field, why
    sent: bool = False  # some of the request's events are on the input topic (they will be predicted)
    stage: str | None = None
    reason: str | None = None
    input_partition: int | None = None
    input_offset: int | None = None
    may_still_be_predicted: bool | None = None


class Health(BaseModel):
    alive: bool


class Readiness(BaseModel):
    ready: bool
    why: list[str] | None = None


def own_body(error: GatewayError, _status: int) -> dict[str, Any]:
    body: dict[str, Any] = {"error": str(error), "sent": error.sent}
    if error.index is not None:
        body["index"] = error.index
    if error.problems:
        body["problems"] = error.problems
    if isinstance(error, DeadLettered):
        body.update(stage=error.stage, reason=error.reason, input_partition=error.partition,
                    input_offset=error.offset)
    if isinstance(error, RequestTimeout):
        body.update(input_partition=error.partition, input_offset=error.offset,
                    may_still_be_predicted=error.offset is not None)
    return body


OWN_ERRORS = ErrorTable(
    {BadRequest: 400, NotFound: 404, Unavailable: 404, BodyTimeout: 408, Oversized: 413, TooManyEvents: 413,
     Refused: 422, DeadLetteredAtDecode: 422, DeadLetteredAtModel: 500, BadReply: 500, Overloaded: 503,
     NoWorkers: 503, NotSent: 503, RequestTimeout: 504},
    own_body)


def own_operations(door: Door, client: PredictionClient, budget: BodyBudget, metrics: GatewayMetrics,
                   components: dict[str, Any], output: dict[str, Any] | None) -> list[Operation]:
    """``/v1/predict``, the probes and ``/metrics`` (``output``: the prediction's JSON Schema, when known)."""
    event = door.encoder.json_schema
    prediction = output or {"type": "object"}
    error = schema_of(ErrorBody, components)

    async def predict(request: Request) -> Response:
        payload = parse_json(await budget.read(request))
        listed = isinstance(payload, list)
        events = payload if listed else [payload]
        if not events:
            raise BadRequest("an empty list has no event to predict")
        predictions = await door.predict(await door.admit(events), trace_context(request.headers))
        records = [p.record for p in predictions]
        return json_response(records if listed else records[0])

    async def healthz(_request: Request) -> Response:
        alive = client.alive()
        return json_response({"alive": alive}, 200 if alive else 503)

    async def readyz(_request: Request) -> Response:
        why = client.ready()
        return json_response({"ready": not why, **({"why": why} if why else {})}, 503 if why else 200,
                             NOT_READY_RETRY_AFTER if why else None)

    async def prometheus(_request: Request) -> Response:
        metrics.buffered.set(budget.held)
        return Response(generate_latest(metrics.registry), media_type="text/plain; version=0.0.4")

    health = schema_of(Health, components)
    ready = schema_of(Readiness, components)
    return [
        Operation("POST", "/v1/predict", predict, OWN_ERRORS, "Predict one event, or a list of them", "gateway",
                  request={"oneOf": [event, {"type": "array", "items": event, "minItems": 1,
                                             "maxItems": door.max_events}]},
                  responses={200: ("the prediction, or the predictions in order",
                                   {JSON: {"oneOf": [prediction, {"type": "array", "items": prediction}]}}),
                             **error_responses(OWN_ERRORS, error, 401)},
                  counted=(metrics.requests, metrics.latency)),
        Operation("GET", "/healthz", healthz, OWN_ERRORS, "Liveness", "health",
                  responses={200: ("alive", {JSON: health}), 503: ("not alive", {JSON: health})},
                  open=True),
        Operation("GET", "/readyz", readyz, OWN_ERRORS, "Readiness: the brokers answer and a worker serves",
                  "health", responses={200: ("ready", {JSON: ready}), 503: ("not ready, and why", {JSON: ready})},
                  open=True),
        Operation("GET", "/metrics", prometheus, OWN_ERRORS, "Prometheus metrics", "health",
                  responses={200: ("Prometheus text", {"text/plain": {"type": "string"}}),
                             401: ("no API key", {JSON: error})}),
    ]


def build_app(operations: Sequence[Operation], budget: BodyBudget, components: dict[str, Any], *, version: str,
              secured: bool) -> Starlette:
    """Every operation as a route, and ``/openapi.json``: the document of them all."""
    spec = document(operations, components, title="stream gateway", version=version, secured=secured,
                    description="Predictions through the durable queue: this project's own API, OpenAI's embeddings "
                                "API, text-embeddings-inference's /embed and the Open Inference Protocol (v2).")

    async def openapi(_request: Request) -> Response:
        return json_response(spec)

    async def not_found(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 404
        what = "no such route" if status == 404 else f"{request.method[:20]} is not served on this route"
        path = request.url.path
        return json_response(error_for_path(path, f"{what}: {path[:200]} (GET /openapi.json lists the routes)",
                                            "not_found"), status)

    routes = [Route(op.path, endpoint(op, budget), methods=[op.method]) for op in operations]
    routes.append(Route("/openapi.json", openapi, methods=["GET"]))
    return Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})
