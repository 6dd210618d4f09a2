"""The Open Inference Protocol (KServe v2, Triton's HTTP API) on the gateway, so that ``tritonclient.http`` and
KServe's clients call the workers unmodified.

Routes: ``GET /v2`` (server metadata), ``/v2/health/live``, ``/v2/health/ready``, ``/v2/models/{name}`` (model
metadata), ``/v2/models/{name}/ready``, ``POST /v2/models/{name}/infer``; each also under
``/v2/models/{name}/versions/{version}`` (any version: the workers' model is the one that answers, and each
output's ``model_version`` says which).

A request's input tensors are fields of the input schema, the events along their first dimension: a tensor of
shape ``[n]`` (or ``[n, 1]``) fills a scalar or string field of n events, ``[n, k]`` an array field; its datatype
is the one the model metadata gives the field. A field no tensor names gets what the text routes give it
(`stream.gateway.texts.auto_fill`: a fresh id, the time, its default); a required one with none of these is a 400.
The events go through the gateway's one request path (`stream.gateway.door`: checked as the workers will check
them, all sent or none, all answered or the request fails naming the event). The outputs are the prediction's
fields (the requested ones, checked against the output schema before anything is sent; else all), stacked the
same way.

Tensors travel as JSON (``data``, row-major, nested or flat) or in the binary tensor extension
(``Inference-Header-Content-Length``: the JSON header's size; each binary input's ``binary_data_size`` bytes follow
it in order; outputs are binary when asked for by ``parameters.binary_data`` or the request's
``binary_data_output``), which ``tritonclient.http`` uses by default. Errors are the protocol's ``{"error": "..."}``
(`V2_ERRORS`): 400 a bad request, a refused event or one dead-lettered while decoding; 404 another model; 408 a body
too slow; 413 too large; 500 dead-lettered at the model; 503 (``Retry-After``) no worker serves, ``--max-pending``
events waiting, or the broker refused one; 504 no prediction within ``--timeout-ms``."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import numpy as np
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from stream.gateway.client import Prediction
from stream.gateway.door import Door, trace_context
from stream.gateway.errors import (
    BadReply,
    BadRequest,
    BodyTimeout,
    DeadLetteredAtDecode,
    DeadLetteredAtModel,
    NotFound,
    NotSent,
    NoWorkers,
    Overloaded,
    Oversized,
    Refused,
    RequestTimeout,
    TooManyEvents,
)
from stream.gateway.http import JSON, ErrorTable, Operation, error_responses, json_response
from stream.gateway.openapi import schema_of
from stream.gateway.server import BodyBudget
from stream.gateway.texts import auto_fill
from stream.gateway.v2_wire import (
    HEADER_LENGTH,
    InferenceRequest,
    InferenceResponse,
    Live,
    ModelMetadata,
    Ready,
    ServerMetadata,
    TensorField,
    bytes_blob,
    parse_request,
    stack,
    tensor_fields,
)


class V2Error(BaseModel):
    error: str


def _v2_body(error: Any, _status: int) -> dict[str, Any]:
    where = f"event {error.index}: " if error.index is not None else ""
    problems = f": {'; '.join(error.problems)}" if error.problems and error.problems[0] not in str(error) else ""
    return {"error": f"{where}{error}{problems}"}


V2_ERRORS = ErrorTable(
    {BadRequest: 400, Refused: 400, TooManyEvents: 400, DeadLetteredAtDecode: 400, NotFound: 404, BodyTimeout: 408,
     Oversized: 413, DeadLetteredAtModel: 500, BadReply: 500, Overloaded: 503, NoWorkers: 503, NotSent: 503,
     RequestTimeout: 504},
    _v2_body)


class InferenceApi:
    """The routes over the gateway's `Door` (see the module's docstring)."""

    def __init__(self, door: Door, budget: BodyBudget, input_schema: Mapping[str, Any],
                 output_schema: Mapping[str, Any] | None, *, model_name: str, probes: Any) -> None:
        """``probes``: what answers ``alive()`` and ``ready()`` (the gateway's client)."""
        self.door = door
        self.budget = budget
        self.probes = probes
        self.model_name = model_name
        self.inputs, unsupported = tensor_fields(input_schema)
        self.outputs = tensor_fields(output_schema)[0] if output_schema else []
        self._outputs = {f.name: f for f in self.outputs}
        # fields no tensor can carry: filled by their defaults, or they make every request impossible
        fields = {f["name"]: f for f in input_schema.get("fields", [])}
        self._other_fills = [fill for fill in (auto_fill(fields[name]) for name in unsupported) if fill is not None]
        self.blocking = [name for name in unsupported if auto_fill(fields[name]) is None]
        self._by_name = {f.name: f for f in self.inputs}
        try:
            self.version = version("kafka-microbatch-inference")
        except PackageNotFoundError:
            self.version = "0"

    def operations(self, components: dict[str, Any], counted: Any = None) -> list[Operation]:
        error = {JSON: schema_of(V2Error, components)}
        missing = (error_responses(V2_ERRORS, error[JSON], 401)[404][0], error)
        ready = {200: ("ready", {JSON: schema_of(Ready, components)}),
                 503: ("not ready", {JSON: schema_of(Ready, components)}), 404: missing}
        ops = [Operation("GET", "/v2", self.server, V2_ERRORS, "Server metadata", "v2",
                         responses={200: ("the server", {JSON: schema_of(ServerMetadata, components)}),
                                    401: ("no API key", error)}),
               Operation("GET", "/v2/health/live", self.live, V2_ERRORS, "Server liveness", "v2",
                         responses={200: ("live", {JSON: schema_of(Live, components)}),
                                    503: ("not live", {JSON: schema_of(Live, components)})}, open=True),
               Operation("GET", "/v2/health/ready", self.ready, V2_ERRORS, "Server readiness", "v2",
                         responses={k: v for k, v in ready.items() if k != 404}, open=True)]
        infer = {200: ("the outputs (binary ones after the JSON header, Inference-Header-Content-Length long)",
                       {JSON: schema_of(InferenceResponse, components),
                        "application/octet-stream": {"type": "string", "format": "binary"}}),
                 **error_responses(V2_ERRORS, error[JSON], 401)}
        request = schema_of(InferenceRequest, components)
        # The document names this model's tensors: its clients (and the tests' fuzzer) see which are valid.
        components["RequestInput"]["properties"]["name"]["enum"] = [f.name for f in self.inputs]
        if self.outputs:
            components["RequestOutput"]["properties"]["name"]["enum"] = [f.name for f in self.outputs]
        model = {"model": {"type": "string", "enum": [self.model_name]}}  # the one this gateway serves
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            ops += [Operation("GET", prefix, self.metadata, V2_ERRORS, "Model metadata", "v2",
                              responses={200: ("the model", {JSON: schema_of(ModelMetadata, components)}),
                                         404: missing, 401: ("no API key", error)}, path_params=model),
                    Operation("GET", f"{prefix}/ready", self.model_ready, V2_ERRORS, "Model readiness", "v2",
                              responses={**ready, 401: ("no API key", error)}, path_params=model),
                    Operation("POST", f"{prefix}/infer", self.infer, V2_ERRORS, "Inference", "v2",
                              request=request, responses=infer, counted=counted, path_params=model)]
        return ops

    async def server(self, _request: Request) -> Response:
        return json_response({"name": "stream-gateway", "version": self.version,
                              "extensions": ["binary_tensor_data"]})

    async def live(self, _request: Request) -> Response:
        alive = self.probes.alive()
        return json_response({"live": alive}, 200 if alive else 503)

    async def ready(self, _request: Request) -> Response:
        ready = not self.probes.ready()
        return json_response({"ready": ready}, 200 if ready else 503)

    def _check_model(self, request: Request) -> None:
        name = request.path_params["model"]
        if name != self.model_name:
            raise NotFound(f"unknown model {name[:200]!r}: this gateway serves {self.model_name!r}")

    async def metadata(self, request: Request) -> Response:
        self._check_model(request)
        return json_response({"name": self.model_name, "versions": [], "platform": "stream",
                              "inputs": [f.metadata() for f in self.inputs],
                              "outputs": [f.metadata() for f in self.outputs]})

    async def model_ready(self, request: Request) -> Response:
        self._check_model(request)
        return await self.ready(request)

    async def infer(self, request: Request) -> Response:
        self._check_model(request)
        body = await self.budget.read(request)
        parsed, tensors = parse_request(body, request.headers.get(HEADER_LENGTH))
        wanted = self._wanted(parsed)
        predictions = await self.door.predict(await self.door.admit(self._events(tensors)),
                                              trace_context(request.headers))
        return self._answer(parsed, wanted, predictions)

    def _wanted(self, request: InferenceRequest) -> list[tuple[str, bool]] | None:
        """The outputs asked for, checked against the prediction schema (None: every field)."""
        binary_all = bool(request.parameters and request.parameters.binary_data_output)
        if not request.outputs:
            return None
        if not self.outputs:
            raise BadRequest("this gateway does not know the prediction's fields, so outputs cannot be asked for by "
                             "name: leave outputs out (every field comes back), or start it with --output-schema")
        wanted = []
        for output in request.outputs:
            field = self._outputs.get(output.name)
            if field is None:
                raise BadRequest(f"no output {output.name[:200]!r}: the prediction's tensors are "
                                 f"{', '.join(self._outputs)}")
            if field.nullable:
                raise BadRequest(f"output {output.name} may be null, which a tensor cannot hold")
            binary = output.parameters.binary_data if output.parameters and output.parameters.binary_data is not None \
                else binary_all
            wanted.append((output.name, binary))
        return wanted

    def _events(self, tensors: dict[str, Any]) -> list[dict[str, Any]]:
        if self.blocking:
            raise BadRequest(f"the input schema's required fields {', '.join(self.blocking)} cannot be given as "
                             "tensors (records, maps, enums or unions), and have no default")
        unknown = sorted(set(tensors) - set(self._by_name))
        if unknown:
            raise BadRequest(f"no input {', '.join(n[:100] for n in unknown[:5])}: the inputs are "
                             f"{', '.join(self._by_name)} (the input schema's fields)")
        missing = [f.name for f in self.inputs if f.name not in tensors and f.fill is None]
        if missing:
            raise BadRequest(f"inputs {', '.join(missing)} are required (the input schema's fields without a "
                             "default)")
        rows = {shape[0] for shape, _, _ in tensors.values()}
        if len(rows) != 1 or 0 in rows:
            raise BadRequest(f"every input's first dimension counts the events; they differ or are 0: {sorted(rows)}")
        n = rows.pop()
        if n > self.door.max_events:
            raise TooManyEvents(f"{n} events in one request, over --max-pending ({self.door.max_events})")
        columns = {name: self._column(self._by_name[name], shape, datatype, data)
                   for name, (shape, datatype, data) in tensors.items()}
        now = time.time()
        fills = [f.fill for f in self.inputs if f.name not in tensors and f.fill is not None] + self._other_fills
        return [{**{name: column[i] for name, column in columns.items()}, **{f.name: f.make(now) for f in fills}}
                for i in range(n)]

    @staticmethod
    def _column(field: TensorField, shape: list[int], datatype: str, data: Any) -> list[Any]:
        """One field's values, one per event."""
        if datatype != field.datatype:
            raise BadRequest(f"input {field.name}: datatype {datatype}, the model's metadata says {field.datatype}")
        n = shape[0]
        if field.avro == "array":
            width = math.prod(shape[1:]) if len(shape) > 1 else 1
            return np.asarray(data).reshape(n, width).tolist()
        if math.prod(shape[1:]) != 1:
            raise BadRequest(f"input {field.name}: one value per event (shape [{n}] or [{n}, 1]), not {shape}")
        if field.avro in ("string", "bytes"):
            if field.avro == "bytes":
                return list(data)
            try:
                return [v.decode("utf-8") for v in data]
            except UnicodeDecodeError:
                raise BadRequest(f"input {field.name}: a string field takes UTF-8 text") from None
        values = np.asarray(data).reshape(n).tolist()
        if field.avro == "boolean":
            return [bool(v) for v in values]
        if field.avro in ("int", "long") or field.avro.startswith("timestamp"):
            return [int(v) for v in values]
        return [float(v) for v in values]

    def _answer(self, request: InferenceRequest, wanted: list[tuple[str, bool]] | None,
                results: list[Prediction]) -> Response:
        records = [p.record for p in results]
        binary_all = bool(request.parameters and request.parameters.binary_data_output)
        every = wanted is None
        names = [(name, binary_all) for name in records[0]] if wanted is None else wanted
        outputs, blobs = [], []
        for name, binary in names:
            try:
                datatype, shape, array = stack(name, [r.get(name) for r in records])
            except BadReply:
                if every:
                    continue  # all outputs: those with no tensor form (a null, a map) are left out
                raise
            tensor: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
            if binary:
                blob = bytes_blob(array) if datatype == "BYTES" else np.ascontiguousarray(array).tobytes()
                tensor["parameters"] = {"binary_data_size": len(blob)}
                blobs.append(blob)
            else:
                tensor["data"] = ([v.decode("utf-8", "replace") for v in array] if datatype == "BYTES"
                                  else array.reshape(-1).tolist())
            outputs.append(tensor)
        version_of = records[0].get("model_version")
        head: dict[str, Any] = {"model_name": self.model_name, "model_version": str(version_of or ""),
                                "outputs": outputs}
        if request.id is not None:
            head["id"] = request.id
        if not blobs:
            return json_response(head)
        header = json.dumps(head, allow_nan=False).encode()
        return Response(header + b"".join(blobs), media_type="application/octet-stream",
                        headers={"Inference-Header-Content-Length": str(len(header))})
