"""OpenAI's embeddings API on the gateway: ``POST /v1/embeddings``, ``GET /v1/models`` (and ``/v1/models/{id}``),
for a model whose prediction holds one float vector per event (``--embedding-field``, default ``embedding``:
``--model minilm``'s). The OpenAI SDKs, LangChain and LlamaIndex call it unmodified. Beside it, TEI's
(text-embeddings-inference) ``POST /embed``.

Each text becomes one event of the input schema (`stream.gateway.texts`) and goes through the gateway's one request
path (`stream.gateway.door`): checked as the workers will check it, sent with the rest or not at all, answered when
every text's prediction is back. Errors have each API's body shape, from one table each (`OPENAI_ERRORS`:
``{"error": {"message", "type", "param", "code"}}``; `TEI_ERRORS`: ``{"error", "error_type"}``):

* OpenAI: 400 a malformed request (token ids instead of text, an empty text, more than ``--max-texts`` inputs,
  ``dimensions`` other than the model's, a text the input schema or the model refuses); 404 ``model_not_found``;
  408 a body too slow; 413 a body or a text too large; 429 with ``Retry-After``: ``--max-pending`` texts already
  wait (nothing sent); 500 the model failed on a text; 503 no worker serves (``Retry-After``) or the broker did not
  take a text; 504 no prediction within ``--timeout-ms``.
* TEI: 413 too large, 422 a request or a text it cannot take, 424 the model failed, 429 overloaded, 503 no worker,
  504 too late.

Every answer after a text reached the topic carries ``x-should-retry: false``: the SDKs retry 408, 429, 5xx and
timeouts (twice by default), and each retry would put the texts on the topic again while the first ones are
still predicted. ``usage`` counts the tokens the model took of each text, as the worker reports them with each
reply (``stream.usage.tokens``; 0 for a model that reports none)."""

from __future__ import annotations

import base64
import time
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response

from stream import __version__
from stream.gateway.client import Prediction
from stream.gateway.door import Context, Door, trace_context
from stream.gateway.errors import (
    BadReply,
    BadRequest,
    BodyTimeout,
    DeadLetteredAtDecode,
    DeadLetteredAtModel,
    EmptyInput,
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
from stream.gateway.http import JSON, ErrorTable, Operation, error_responses, json_response, parse_json, validated
from stream.gateway.openapi import schema_of
from stream.gateway.server import BodyBudget
from stream.gateway.texts import TextEvents

NO_RETRY = {"x-should-retry": "false"}
_TYPES = {400: "invalid_request_error", 404: "invalid_request_error", 408: "timeout", 413: "invalid_request_error",
          429: "rate_limit_exceeded", 500: "server_error", 503: "server_error", 504: "timeout"}
_CODES = {NotFound: "model_not_found", Unavailable: "not_available", Oversized: "request_too_large",
          Overloaded: "rate_limit_exceeded", NoWorkers: "service_unavailable"}


class EmbeddingsRequest(BaseModel):
    """OpenAI's embeddings request (fields it may add later are ignored)."""

    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1, description="the served model's name (GET /v1/models)")
    input: str | list[str] | list[int] | list[list[int]] = Field(
        description="a text or a list of texts; token ids are refused (send the text)")
    encoding_format: Literal["float", "base64"] | None = "float"
    dimensions: int | None = Field(default=None, description="only the model's own")
    user: str | None = None


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    embedding: list[float] | str
    index: int


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIError(BaseModel):
    error: OpenAIErrorDetail


class EmbedRequest(BaseModel):
    """TEI's ``/embed`` request."""

    model_config = ConfigDict(extra="ignore")
    inputs: str | list[str]
    normalize: bool = True
    truncate: bool | None = None
    truncation_direction: Literal["Left", "Right", "left", "right"] | None = None
    prompt_name: str | None = None


class TeiInfo(BaseModel):
    """TEI's ``GET /info``, with what this gateway knows: the worker's dtype and batching are its own (``auto``,
    null), the client batch size is ``--max-texts``, concurrent requests ``--max-pending``."""

    model_id: str
    model_sha: str | None = None
    model_dtype: str
    model_type: dict[str, dict[str, str]]
    max_concurrent_requests: int
    max_input_length: int | None
    max_batch_tokens: int | None = None
    max_batch_requests: int | None = None
    max_client_batch_size: int
    auto_truncate: bool
    tokenization_workers: int | None = None
    version: str
    sha: str | None = None
    docker_label: str | None = None


class TeiError(BaseModel):
    error: str
    error_type: str


def _where(error: GatewayError, name: str) -> str:
    return f"{name}[{error.index}]: " if error.index is not None else ""


def _openai_body(error: GatewayError, status: int) -> dict[str, Any]:
    code = next((c for cls, c in _CODES.items() if isinstance(error, cls)), None)
    if isinstance(error, Oversized) and error.index is not None:
        code = "context_length_exceeded"
    param = error.field or ("input" if error.index is not None or isinstance(error, Refused | TooManyEvents)
                            else None)
    problems = f": {'; '.join(error.problems)}" if error.problems and error.problems[0] not in str(error) else ""
    return {"error": {"message": f"{_where(error, 'input')}{error}{problems}",
                      "type": _TYPES.get(status, "server_error"), "param": param, "code": code}}


OPENAI_ERRORS = ErrorTable(
    {BadRequest: 400, Refused: 400, TooManyEvents: 400, DeadLetteredAtDecode: 400, NotFound: 404, Unavailable: 404,
     BodyTimeout: 408, Oversized: 413, Overloaded: 429, DeadLetteredAtModel: 500, BadReply: 500, NoWorkers: 503,
     NotSent: 503, RequestTimeout: 504},
    _openai_body, lambda error, status: NO_RETRY if error.sent else {})

_TEI_TYPES = {EmptyInput: "empty", BadRequest: "validation", Refused: "validation", TooManyEvents: "validation",
              Oversized: "validation", BodyTimeout: "validation", Overloaded: "overloaded", NoWorkers: "unhealthy",
              NotFound: "validation", Unavailable: "validation"}
TEI_ERRORS = ErrorTable(
    {BadRequest: 422, Refused: 422, TooManyEvents: 422, DeadLetteredAtDecode: 422, NotFound: 404, Unavailable: 404,
     BodyTimeout: 408, Oversized: 413, Overloaded: 429, DeadLetteredAtModel: 424, BadReply: 500, NoWorkers: 503,
     NotSent: 503, RequestTimeout: 504},
    lambda error, status: {"error": f"{_where(error, 'inputs')}{error}",
                           "error_type": next((t for cls, t in _TEI_TYPES.items() if isinstance(error, cls)),
                                              "backend")})


class EmbeddingsApi:
    """The routes, over the gateway's `Door`."""

    def __init__(self, door: Door, budget: BodyBudget, texts: TextEvents, *, model_name: str, embedding_field: str,
                 dimensions: int | None, max_texts: int, pooling: str | None = None,
                 max_tokens: int | None = None) -> None:
        self.door = door
        self.budget = budget
        self.texts = texts
        self.model_name = model_name
        self.embedding_field = embedding_field
        self.dimensions = dimensions
        self.max_texts = max_texts
        self.created = int(time.time())
        self.info = TeiInfo(model_id=model_name, model_dtype="auto",
                            model_type={"embedding": {"pooling": pooling} if pooling else {}},
                            max_concurrent_requests=door.max_events, max_input_length=max_tokens,
                            max_client_batch_size=max_texts, auto_truncate=True,
                            version=__version__).model_dump()

    def operations(self, components: dict[str, Any], counted: Any = None) -> list[Operation]:
        openai_error = schema_of(OpenAIError, components)
        return [
            Operation("POST", "/v1/embeddings", self.embeddings, OPENAI_ERRORS, "OpenAI's embeddings", "openai",
                      request=schema_of(EmbeddingsRequest, components),
                      responses={200: ("the embeddings", {JSON: schema_of(EmbeddingsResponse, components)}),
                                 **error_responses(OPENAI_ERRORS, openai_error, 401)}, counted=counted),
            Operation("GET", "/v1/models", self.models, OPENAI_ERRORS, "OpenAI's model list", "openai",
                      responses={200: ("the served model", {JSON: schema_of(ModelList, components)}),
                                 401: ("no API key", {JSON: openai_error})}),
            Operation("GET", "/v1/models/{model:path}", self.model, OPENAI_ERRORS, "OpenAI's model card", "openai",
                      responses={200: ("the model", {JSON: schema_of(ModelCard, components)}),
                                 401: ("no API key", {JSON: openai_error}),
                                 404: ("another model", {JSON: openai_error})},
                      path_params={"model": {"type": "string", "enum": [self.model_name]}}),
            *(Operation("POST", path, self.tei_embed, TEI_ERRORS, f"text-embeddings-inference's {path}", "tei",
                        request=schema_of(EmbedRequest, components),
                        responses={200: ("a vector per input", {JSON: schema_of(list[list[float]], components)}),
                                   **error_responses(TEI_ERRORS, schema_of(TeiError, components), 401)})
              # TEI answers POST / as /embed for an embedding model: huggingface_hub's InferenceClient(model=URL)
              # posts there
              for path in ("/embed", "/")),
            Operation("GET", "/info", self.tei_info, TEI_ERRORS, "text-embeddings-inference's /info", "tei",
                      responses={200: ("the served model and the gateway's limits",
                                       {JSON: schema_of(TeiInfo, components)}),
                                 401: ("no API key", {JSON: schema_of(TeiError, components)})}),
        ]

    async def tei_info(self, _request: Request) -> Response:
        return json_response(self.info)

    def _card(self) -> dict[str, Any]:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "stream"}

    async def models(self, _request: Request) -> Response:
        return json_response({"object": "list", "data": [self._card()]})

    async def model(self, request: Request) -> Response:
        name = request.path_params["model"]
        if name != self.model_name:
            raise self._not_found(name)
        return json_response(self._card())

    def _not_found(self, name: str) -> NotFound:
        return NotFound(f"The model `{name[:200]}` does not exist: this gateway serves `{self.model_name}`",
                        field="model")

    async def embeddings(self, request: Request) -> Response:
        given = validated(EmbeddingsRequest, parse_json(await self.budget.read(request)))
        if given.model != self.model_name:
            raise self._not_found(given.model)
        texts = [given.input] if isinstance(given.input, str) else given.input
        if not texts:
            raise BadRequest("input must be a string or a non-empty list of strings", field="input")
        if not all(isinstance(t, str) for t in texts):
            raise BadRequest("token ids are not accepted: send the text (this gateway's model tokenizes it itself; "
                             "LangChain's OpenAIEmbeddings sends them unless check_embedding_ctx_length=False)",
                             field="input")
        if given.dimensions is not None and (self.dimensions is None or given.dimensions != self.dimensions):
            raise BadRequest(f"dimensions {given.dimensions}: this model's embeddings have "
                             f"{self.dimensions or 'a fixed number of'} dimensions and are not shortened",
                             field="dimensions")
        predictions = await self._predict(texts, trace_context(request.headers))
        vectors = self._vectors(predictions)
        if given.dimensions is not None and any(len(v) != given.dimensions for v in vectors):
            raise BadReply(f"the model's embeddings do not have {given.dimensions} dimensions", sent=True)
        as_base64 = given.encoding_format == "base64"
        data = [{"object": "embedding", "index": i,
                 "embedding": base64.b64encode(np.asarray(v, dtype="<f4").tobytes()).decode() if as_base64 else v}
                for i, v in enumerate(vectors)]
        tokens = sum(p.tokens or 0 for p in predictions)
        return json_response({"object": "list", "data": data, "model": self.model_name,
                              "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def tei_embed(self, request: Request) -> Response:
        """TEI's ``POST /embed`` (and ``POST /``): ``inputs`` a string or strings, ``normalize`` (true: this model's
        are; false is refused), ``truncate`` (accepted: the worker cuts every text to its ``--max-tokens``, at its
        end: ``truncation_direction`` Right, Left refused); a list of vectors back."""
        given = validated(EmbedRequest, parse_json(await self.budget.read(request)))
        texts = [given.inputs] if isinstance(given.inputs, str) else given.inputs
        if not texts:
            raise BadRequest("inputs must be a string or a non-empty list of strings")
        if not given.normalize:
            raise BadRequest("normalize=false is not served: this gateway answers the model's own vectors")
        if given.truncation_direction is not None and given.truncation_direction.lower() == "left":
            raise BadRequest("truncation_direction Left is not served: the model cuts a long text at its end "
                             "(Right)")
        return json_response(self._vectors(await self._predict(texts, trace_context(request.headers))))

    async def _predict(self, texts: list[str], context: Context) -> list[Prediction]:
        if len(texts) > self.max_texts:
            raise TooManyEvents(f"{len(texts)} inputs in one request: at most {self.max_texts} (--max-texts)")
        for i, text in enumerate(texts):
            if not text.strip():
                raise EmptyInput("the text is empty", index=i)
        return await self.door.predict(await self.door.admit([self.texts.event(t) for t in texts]), context)

    def _vectors(self, predictions: list[Prediction]) -> list[list[float]]:
        vectors = [p.record.get(self.embedding_field) for p in predictions]
        for vector in vectors:
            if not isinstance(vector, list):
                raise BadReply(f"the prediction has no float vector {self.embedding_field!r} (it has "
                               f"{', '.join(predictions[0].record)}): set --embedding-field", sent=True)
        return vectors  # type: ignore[return-value]


def unavailable_operations(why: str) -> list[Operation]:
    """The API's routes on a gateway whose input schema cannot take a text: each answers 404 saying why."""
    async def off(_request: Request) -> Response:
        raise Unavailable(f"the embeddings API is off on this gateway: {why}")

    return [Operation(method, path, off, OPENAI_ERRORS, "off on this gateway", "openai",
                      responses={404: ("off on this gateway", {})})
            for method, path in (("POST", "/v1/embeddings"), ("POST", "/embed"), ("POST", "/"), ("GET", "/info"),
                                 ("GET", "/v1/models"), ("GET", "/v1/models/{model:path}"))]
