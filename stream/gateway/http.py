"""What every route of every protocol shares: the operation table the routes and the OpenAPI document are both
made from, the wrapper each handler runs in (its body bounded, its errors answered by its protocol's table, its
answers counted), one JSON parser, and one way to render JSON.

A handler raises `stream.gateway.errors.GatewayError` for everything a caller can get wrong or the pipeline can
refuse; its protocol's `ErrorTable` turns that into the status, headers and body the protocol's clients expect.
Anything else is the gateway's own fault: logged with its traceback, answered 500 without one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pydantic
import pydantic_core
from prometheus_client import Counter, Histogram
from starlette.requests import Request
from starlette.responses import Response

from stream.gateway.errors import BadRequest, GatewayError
from stream.gateway.server import BodyBudget

log = logging.getLogger(__name__)
Handler = Callable[[Request], Awaitable[Response]]
JSON = "application/json"


def render(content: Any) -> bytes:
    """JSON with no NaN or infinity in it (JSON has none: they become null), compact, UTF-8 (pydantic's encoder:
    a fifth of the standard library's time for a prediction's answer)."""
    return pydantic_core.to_json(content, inf_nan_mode="null")


def error_for_path(path: str, message: str, code: str | None = None) -> dict[str, Any]:
    """An error body in the shape of the protocol ``path`` speaks, for what is answered before a route runs (no
    API key, no such route): OpenAI's for ``/v1/embeddings`` and ``/v1/models``, TEI's for ``/embed``, the
    inference protocol's for ``/v2`` and the gateway's own elsewhere (both ``{"error": message}``)."""
    if path.startswith(("/v1/embeddings", "/v1/models")):
        return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    if path.startswith("/embed"):
        return {"error": message, "error_type": code or "validation"}
    return {"error": message}


NOT_READY_RETRY_AFTER = {"Retry-After": "5"}  # a gateway not ready (starting, no worker): when to ask again


def json_response(content: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    return Response(render(content), status_code=status, headers=dict(headers or {}), media_type=JSON)


def parse_json(body: bytes, what: str = "the body") -> Any:
    """``body`` parsed (RFC 8259 JSON: no NaN or infinity literals, nesting bounded, strings valid Unicode);
    `BadRequest` saying why not. A number beyond a double's range parses as infinity, as in most parsers: where a
    value must be finite (the model's inputs, v2's tensors), the check that follows refuses it."""
    if not body.strip():
        raise BadRequest(f"{what} is empty: send JSON")
    try:
        value = pydantic_core.from_json(body, allow_inf_nan=False)
    except ValueError as exc:
        raise BadRequest(f"{what} is not JSON: {exc}") from None
    return value


def validated(model: type[pydantic.BaseModel], value: Any, what: str = "the body") -> Any:
    """``value`` as ``model``; `BadRequest` naming each field that does not fit."""
    try:
        return model.model_validate(value)
    except pydantic.ValidationError as exc:
        errors = exc.errors()
        problems = [f"{'.'.join(str(p) for p in e['loc']) or what}: {e['msg']}" for e in errors[:10]]
        first = errors[0]["loc"][0] if errors and errors[0]["loc"] else None
        raise BadRequest(f"{what} does not fit the request: {'; '.join(problems)}", problems=problems,
                         field=str(first) if first is not None else None) from None


@dataclass(frozen=True)
class ErrorTable:
    """One protocol's answers: ``statuses`` maps each error class (its nearest entry up the class tree) to a status;
    ``body(error, status)`` is the protocol's error body; ``headers(error, status)`` adds headers to it."""

    statuses: Mapping[type[GatewayError], int]
    body: Callable[[GatewayError, int], Any]
    headers: Callable[[GatewayError, int], dict[str, str]] = field(default=lambda error, status: {})

    def status(self, error: GatewayError) -> int:
        for cls in type(error).__mro__:
            if cls in self.statuses:
                return self.statuses[cls]
        return 500

    def respond(self, error: GatewayError) -> Response:
        status = self.status(error)
        headers = dict(self.headers(error, status))
        if error.retry_after_s is not None and status in (429, 503) and not error.sent:
            headers.setdefault("Retry-After", str(error.retry_after_s))
        return json_response(self.body(error, status), status, headers)

    def internal(self) -> Response:
        error = GatewayError("the gateway failed on this request (its log has the details)", sent=False)
        return json_response(self.body(error, 500), 500)


@dataclass(frozen=True)
class Operation:
    """A route, with what the OpenAPI document says of it (``request``: its body's JSON Schema; ``responses``:
    status -> (description, {media type: JSON Schema})."""

    method: str
    path: str
    handler: Handler
    errors: ErrorTable
    summary: str
    tag: str
    request: dict[str, Any] | None = None
    request_media: str = JSON
    responses: Mapping[int, tuple[str, Mapping[str, dict[str, Any]]]] = field(default_factory=dict)
    counted: tuple[Counter, Histogram] | None = None  # requests by status, and their latency
    path_params: Mapping[str, dict[str, Any]] = field(default_factory=dict)  # a path parameter's schema, if not any
    open: bool = False  # answered without an API key (the health probes)


_DESCRIBED = {400: "a malformed request", 401: "no API key, or not one of this gateway's", 404: "not served here",
              408: "the body was too slow", 413: "too large",
              422: "refused by the input schema or the model's contract",
              424: "the model failed", 429: "too many waiting: retry after Retry-After",
              500: "the model failed, or the gateway did", 503: "no worker, too many waiting, or the broker did not "
              "take it: retry after Retry-After", 504: "no prediction in time"}


def error_responses(table: ErrorTable, schema: dict[str, Any], *extra: int
                    ) -> dict[int, tuple[str, Mapping[str, dict[str, Any]]]]:
    """The statuses ``table`` answers, 500 and ``extra`` (401: the API keys'), each with the error body's schema."""
    return {s: (_DESCRIBED.get(s, "an error"), {JSON: schema}) for s in {*table.statuses.values(), 500, *extra}}


def endpoint(op: Operation, budget: BodyBudget) -> Handler:
    """``op``'s handler run as the module's docstring says."""
    async def route(request: Request) -> Response:
        started = time.perf_counter()
        try:
            response = await op.handler(request)
        except GatewayError as exc:
            response = op.errors.respond(exc)
        except Exception:
            log.exception("%s %s failed", op.method, op.path)
            response = op.errors.internal()
        finally:
            budget.release(request)
        if op.counted is not None:
            requests, latency = op.counted
            latency.observe(time.perf_counter() - started)
            requests.labels(str(response.status_code)).inc()
        return response

    return route
