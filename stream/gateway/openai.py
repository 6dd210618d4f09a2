"""OpenAI's embeddings API on the gateway: ``POST /v1/embeddings``, ``GET /v1/models`` (and ``/v1/models/{id}``),
for a model whose prediction holds one float vector per event (``--embedding-field``, default ``embedding``:
``--model minilm``'s). The OpenAI SDKs, LangChain and LlamaIndex call it unmodified. Beside it, TEI's
(text-embeddings-inference) ``POST /embed`` (`EmbeddingsApi.tei_embed`).

Each text becomes one event of the input schema (`stream.gateway.texts`) on the input topic, batched by the
workers with everything else there; the answer waits for every text's prediction. All or nothing: one text
refused, dead-lettered or late fails the request, naming its index. Errors have the API's body shape
(``{"error": {"message", "type", "param", "code"}}``):

* 400: not JSON, a missing or malformed field, token ids instead of text, an empty text, more than
  ``--max-texts`` inputs, ``dimensions`` other than the model's, a text the input schema refuses or one over
  ``--max-input-bytes`` encoded, a text the worker could not read (dead-lettered at its decode stage);
* 404 ``model_not_found``: ``model`` is not the served one (``--served-model-name``);
* 429 with ``Retry-After``: ``--max-pending`` texts already wait (nothing of the request was sent);
* 500: the model failed on a text (dead-lettered at the model stage);
* 503: the broker did not take a text; 504: no prediction within ``--timeout-ms``.

Every answer after a text reached the topic carries ``x-should-retry: false``: the SDKs retry 429, 5xx and
timeouts (twice by default), and each retry would put the texts on the topic again while the first ones are
still predicted. ``usage`` counts the tokens the model took of each text, as the worker reports them with each
reply (``stream.usage.tokens``; 0 for a model that reports none)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import numpy as np
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
from stream.gateway.texts import TextEvents

NO_RETRY = {"x-should-retry": "false"}


class ErrorShape(Protocol):
    """How a protocol answers a request that fails (`EmbeddingsApi._predict`); nothing was sent for ``refused``,
    ``oversized`` and ``busy``."""

    def refused(self, i: int, message: str) -> Response: ...
    def oversized(self, i: int, message: str) -> Response: ...
    def busy(self, message: str) -> Response: ...
    def failed(self, i: int, exc: BaseException) -> Response: ...


class OpenAIErrors:
    def __init__(self, api: EmbeddingsApi) -> None:
        self.api = api

    def refused(self, i: int, message: str) -> Response:
        return openai_error(400, f"input[{i}]: {message}", param="input")

    def oversized(self, i: int, message: str) -> Response:
        return openai_error(400, f"input[{i}]: {message}", param="input", code="context_length_exceeded")

    def busy(self, message: str) -> Response:
        return openai_error(429, message, type_="rate_limit_exceeded", code="rate_limit_exceeded",
                            headers={"Retry-After": "1"})

    def failed(self, i: int, exc: BaseException) -> Response:
        if isinstance(exc, DeadLettered):
            if exc.stage == "decode":
                return openai_error(400, f"input[{i}]: the model cannot take this text: {exc}", param="input",
                                    headers=NO_RETRY)
            return openai_error(500, f"input[{i}]: {exc}", type_="server_error", headers=NO_RETRY)
        if isinstance(exc, RequestTimeout):
            return openai_error(504, f"input[{i}]: {exc}", type_="timeout", headers=NO_RETRY)
        if isinstance(exc, NotSent | Overloaded):
            return openai_error(503, f"input[{i}]: {exc}", type_="server_error", headers=NO_RETRY)
        return openai_error(500, f"input[{i}]: {type(exc).__name__}: {exc}", type_="server_error", headers=NO_RETRY)


def tei_error(status: int, message: str, error_type: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": message, "error_type": error_type}, status_code=status, headers=headers)


class TeiErrors:
    """TEI's statuses: 413 too long, 422 a text it cannot take, 424 the model failed, 429 overloaded."""

    def refused(self, i: int, message: str) -> Response:
        return tei_error(422, f"inputs[{i}]: {message}", "validation")

    def oversized(self, i: int, message: str) -> Response:
        return tei_error(413, f"inputs[{i}]: {message}", "validation")

    def busy(self, message: str) -> Response:
        return tei_error(429, message, "overloaded", {"Retry-After": "1"})

    def failed(self, i: int, exc: BaseException) -> Response:
        if isinstance(exc, DeadLettered):
            if exc.stage == "decode":
                return tei_error(422, f"inputs[{i}]: the model cannot take this text: {exc}", "validation")
            return tei_error(424, f"inputs[{i}]: {exc}", "backend")
        if isinstance(exc, RequestTimeout):
            return tei_error(504, f"inputs[{i}]: {exc}", "backend")
        return tei_error(503, f"inputs[{i}]: {exc}", "backend")


def unavailable_routes(why: str) -> list[Route]:
    """The API's routes on a gateway whose input schema cannot take a text: each answers 404 saying why."""
    async def off(_request: Request) -> Response:
        return openai_error(404, f"the embeddings API is off on this gateway: {why}", code="not_available")

    return [Route("/v1/embeddings", off, methods=["POST"]), Route("/embed", off, methods=["POST"]),
            Route("/v1/models", off, methods=["GET"]),
            Route("/v1/models/{model:path}", off, methods=["GET"])]


def openai_error(status: int, message: str, *, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}},
                        status_code=status, headers=headers)


class EmbeddingsApi:
    """The routes, over one `PredictionClient`; ``read_body(request)`` is the gateway's bounded body reader."""

    def __init__(self, client: PredictionClient, texts: TextEvents, *, model_name: str, embedding_field: str,
                 dimensions: int | None, max_texts: int,
                 read_body: Callable[[Request], Awaitable[bytes | None]]) -> None:
        self.client = client
        self.texts = texts
        self.model_name = model_name
        self.embedding_field = embedding_field
        self.dimensions = dimensions
        self.max_texts = max_texts
        self.created = int(time.time())
        self._read_body = read_body

    def routes(self, wrap: Callable[[Callable[[Request], Awaitable[Response]]],
                                    Callable[[Request], Awaitable[Response]]]) -> list[Route]:
        """The routes, ``/v1/embeddings``'s handler passed through ``wrap`` (the gateway's metrics)."""
        return [Route("/v1/embeddings", wrap(self.embeddings), methods=["POST"]),
                Route("/embed", self.tei_embed, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/models/{model:path}", self.model, methods=["GET"])]

    def _card(self) -> dict[str, Any]:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "stream"}

    async def models(self, _request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._card()]})

    async def model(self, request: Request) -> Response:
        if request.path_params["model"] != self.model_name:
            return self._not_found(request.path_params["model"], "model")
        return JSONResponse(self._card())

    def _not_found(self, name: str, param: str) -> JSONResponse:
        return openai_error(404, f"The model `{name}` does not exist: this gateway serves `{self.model_name}`",
                            param=param, code="model_not_found")

    async def embeddings(self, request: Request) -> Response:
        body = await self._read_body(request)
        if body is None:
            return openai_error(413, "the request body is over --max-input-bytes", code="request_too_large")
        try:
            payload = json.loads(body)
        except ValueError as exc:
            return openai_error(400, f"the body is not JSON: {exc}")
        if not isinstance(payload, dict):
            return openai_error(400, "the body must be a JSON object")
        checked = self._check(payload)
        if isinstance(checked, Response):
            return checked
        texts, as_base64 = checked
        results = await self._predict(texts, OpenAIErrors(self))
        if isinstance(results, Response):
            return results
        return self._answer(results, as_base64, payload)

    async def tei_embed(self, request: Request) -> Response:
        """TEI's ``POST /embed``: ``inputs`` a string or strings, ``normalize`` (true: this model's are; false
        is refused), ``truncate`` (accepted: the worker cuts every text to its ``--max-tokens``); a list of
        vectors back, errors as TEI's ``{"error", "error_type"}``."""
        body = await self._read_body(request)
        if body is None:
            return tei_error(413, "the request body is over --max-input-bytes", "validation")
        try:
            payload = json.loads(body)
        except ValueError as exc:
            return tei_error(422, f"the body is not JSON: {exc}", "validation")
        given = payload.get("inputs") if isinstance(payload, dict) else None
        texts = [given] if isinstance(given, str) else given
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            return tei_error(422, "inputs must be a string or a non-empty list of strings", "validation")
        if len(texts) > self.max_texts:
            return tei_error(422, f"{len(texts)} inputs: at most {self.max_texts} (--max-texts)", "validation")
        empty = next((i for i, t in enumerate(texts) if not t.strip()), None)
        if empty is not None:
            return tei_error(422, f"inputs[{empty}] is empty", "empty")
        if payload.get("normalize", True) is not True:
            return tei_error(422, "normalize=false is not served: this gateway answers the model's own vectors",
                             "validation")
        results = await self._predict(texts, TeiErrors())
        if isinstance(results, Response):
            return results
        vectors = [p.record.get(self.embedding_field) for p in results]
        if not all(isinstance(v, list) for v in vectors):
            return tei_error(500, f"the prediction has no float vector {self.embedding_field!r}: set "
                                  "--embedding-field", "backend")
        return JSONResponse(vectors)

    async def _predict(self, texts: list[str], errors: ErrorShape) -> list[Prediction] | Response:
        """Each text's prediction, in order, or the answer that fails the request (in ``errors``' shape)."""
        values = []
        for i, text in enumerate(texts):
            try:
                values.append(self.client.encode(self.texts.event(text)))
            except Refused as exc:
                return errors.refused(i, f"{exc}: {'; '.join(exc.problems)}")
            except Oversized as exc:
                return errors.oversized(i, str(exc))
        if self.client.pending + len(values) > self.client.max_pending:
            return errors.busy(f"{self.client.pending} texts are waiting for their embeddings (--max-pending "
                               f"{self.client.max_pending}): try again shortly")
        futures: list[Awaitable[Prediction]] = []
        for value in values:
            try:
                futures.append(asyncio.wrap_future(self.client.submit_encoded(value)))
            except Overloaded as exc:
                if not futures:
                    return errors.busy(str(exc))
                for f in futures:  # the ones sent are still predicted; this request fails as a whole
                    f.cancel()  # type: ignore[attr-defined]
                return errors.failed(len(futures), exc)
        results = await asyncio.gather(*futures, return_exceptions=True)
        for i, result in enumerate(results):
            if not isinstance(result, Prediction):
                return errors.failed(i, result)
        return results  # type: ignore[return-value]

    def _check(self, payload: dict[str, Any]) -> tuple[list[str], bool] | Response:
        """The request's texts and whether to answer in base64, or its 400/404."""
        model = payload.get("model")
        if not isinstance(model, str) or not model:
            return openai_error(400, "you must provide a model parameter", param="model")
        if model != self.model_name:
            return self._not_found(model, "model")
        given = payload.get("input")
        texts = [given] if isinstance(given, str) else given
        if not isinstance(texts, list) or not texts:
            return openai_error(400, "input must be a string or a non-empty list of strings", param="input")
        if not all(isinstance(t, str) for t in texts):
            if all(isinstance(t, int) or (isinstance(t, list) and all(isinstance(x, int) for x in t))
                   for t in texts):
                return openai_error(400, "token ids are not accepted: send the text (this gateway's model "
                                         "tokenizes it itself)", param="input")
            return openai_error(400, "input must be a string or a list of strings", param="input")
        if len(texts) > self.max_texts:
            return openai_error(400, f"{len(texts)} inputs in one request: at most {self.max_texts} (--max-texts)",
                                param="input")
        empty = next((i for i, t in enumerate(texts) if not t.strip()), None)
        if empty is not None:
            return openai_error(400, f"input[{empty}] is empty", param="input")
        encoding = payload.get("encoding_format") or "float"
        if encoding not in ("float", "base64"):
            return openai_error(400, f"encoding_format {encoding!r}: float or base64", param="encoding_format")
        dimensions = payload.get("dimensions")
        if dimensions is not None and (not isinstance(dimensions, int) or isinstance(dimensions, bool) or (
                self.dimensions is not None and dimensions != self.dimensions)):
            return openai_error(400, f"dimensions {dimensions!r}: this model's embeddings have "
                                     f"{self.dimensions or 'a fixed number of'} dimensions and are not shortened",
                                param="dimensions")
        return texts, encoding == "base64"

    def _answer(self, results: list[Prediction], as_base64: bool, payload: dict[str, Any]) -> Response:
        data = []
        tokens = 0
        for i, p in enumerate(results):
            vector = p.record.get(self.embedding_field)
            if not isinstance(vector, list):
                return openai_error(500, f"the prediction has no float vector {self.embedding_field!r} (it has "
                                         f"{', '.join(p.record)}): set --embedding-field", type_="server_error",
                                    headers=NO_RETRY)
            wanted = payload.get("dimensions")
            if wanted is not None and wanted != len(vector):
                return openai_error(400, f"dimensions {wanted}: this model's embeddings have {len(vector)}",
                                    param="dimensions", headers=NO_RETRY)
            embedding: Any = (base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode() if as_base64
                              else vector)
            data.append({"object": "embedding", "embedding": embedding, "index": i})
            tokens += p.tokens or 0
        return JSONResponse({"object": "list", "data": data, "model": self.model_name,
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
