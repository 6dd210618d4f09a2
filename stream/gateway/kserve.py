"""The Open Inference Protocol (KServe v2, Triton's HTTP API) on the gateway, so that ``tritonclient.http`` and
KServe's clients call the workers unmodified.

Routes: ``GET /v2`` (server metadata), ``/v2/health/live``, ``/v2/health/ready``, ``/v2/models/{name}`` (model
metadata), ``/v2/models/{name}/ready``, ``POST /v2/models/{name}/infer``; each also under
``/v2/models/{name}/versions/{version}`` (any version: the workers' model is the one that answers, and each
output's ``model_version`` says which).

A request's input tensors are fields of the input schema, the events along their first dimension: a tensor of
shape ``[n]`` (or ``[n, 1]``) fills a scalar or string field of n events, ``[n, k]`` an array field. A field no
tensor names gets what the text routes give it (`stream.gateway.texts.auto_fill`: a fresh id, the time, its
default); a required one with none of these is a 400. Each event goes to the input topic like ``/v1/predict``'s;
the answer waits for all of them (all or nothing: one refused, dead-lettered or late fails the request, naming
its index). The outputs are the prediction's fields (the requested ones, else all), stacked the same way.

Tensors travel as JSON (``data``, row-major) or in the binary tensor extension (``Inference-Header-Content-Length``:
the JSON header's size; each binary input's ``binary_data_size`` bytes follow it in order; outputs are binary when
asked for by ``parameters.binary_data`` or the request's ``binary_data_output``), which ``tritonclient.http`` uses
by default. Errors are the protocol's ``{"error": "..."}`` with 400 (a bad request, a refused event, one
dead-lettered while decoding), 404 (another model), 500 (dead-lettered at the model), 503 (``--max-pending``
events waiting, or the broker refused one: ``Retry-After``) and 504 (no prediction within ``--timeout-ms``)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

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
from stream.gateway.texts import Fill, auto_fill, kind_of

HEADER_LENGTH = "inference-header-content-length"
# Avro types to the protocol's datatypes (a timestamp is its long; an array is its items' type)
DATATYPES = {"float": "FP32", "double": "FP64", "int": "INT32", "long": "INT64", "boolean": "BOOL",
             "string": "BYTES", "bytes": "BYTES", "timestamp-millis": "INT64", "timestamp-micros": "INT64"}
NUMPY = {"FP16": "<f2", "FP32": "<f4", "FP64": "<f8", "INT8": "<i1", "INT16": "<i2", "INT32": "<i4",
         "INT64": "<i8", "UINT8": "<u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8", "BOOL": "|b1"}
NUMERIC = {"float", "double", "int", "long", "timestamp-millis", "timestamp-micros"}


class BadRequest(ValueError):
    """The request cannot be served as it is (400)."""


def error(status: int, message: str, retry: bool = False) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers={"Retry-After": "1"} if retry else None)


@dataclass(frozen=True)
class TensorField:
    """A top-level field of a schema as a tensor: its name, its datatype, its shape with the events first (-1:
    any), and for an input, what fills it when no tensor does."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    avro: str  # the field's type (its non-null branch's; an array: array)
    items: str | None = None  # an array's items' type
    fill: Fill | None = None

    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


def tensor_fields(schema: Mapping[str, Any]) -> tuple[list[TensorField], list[str]]:
    """The fields of a record schema that tensors can carry (scalars, strings, bytes, arrays of numbers), and the
    names of those they cannot (records, maps, enums, unions of several types)."""
    fields, others = [], []
    for f in schema.get("fields", []):
        kind = kind_of(f["type"])
        items = None
        if kind == "array":
            rest = [b for b in (f["type"] if isinstance(f["type"], list) else [f["type"]]) if b != "null"]
            items = kind_of(rest[0]["items"])
            if items not in NUMERIC or items.startswith("timestamp"):
                others.append(f["name"])
                continue
            fields.append(TensorField(f["name"], DATATYPES[items], (-1, -1), "array", items, auto_fill(f)))
        elif kind in DATATYPES:
            fields.append(TensorField(f["name"], DATATYPES[kind], (-1,), kind, None, auto_fill(f)))
        else:
            others.append(f["name"])
    return fields, others


def _bytes_elements(raw: bytes, count: int | None) -> list[bytes]:
    """A BYTES tensor's binary form: each element a 4-byte little-endian length, then its bytes."""
    out, at = [], 0
    while at < len(raw):
        if at + 4 > len(raw):
            raise BadRequest("a BYTES tensor ends inside an element's length")
        size = int.from_bytes(raw[at:at + 4], "little")
        at += 4
        if at + size > len(raw):
            raise BadRequest("a BYTES tensor ends inside an element")
        out.append(raw[at:at + size])
        at += size
    if count is not None and len(out) != count:
        raise BadRequest(f"a BYTES tensor holds {len(out)} elements, its shape says {count}")
    return out


def _bytes_blob(values: Sequence[bytes]) -> bytes:
    return b"".join(len(v).to_bytes(4, "little") + v for v in values)


def parse_request(body: bytes, header_length: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the request's JSON, {input name: its elements, flat, row-major: a numpy array or a list of bytes/str})."""
    if header_length is not None:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise BadRequest(f"Inference-Header-Content-Length {header_length} is not within the body's "
                             f"{len(body)} bytes")
        head, blob = body[:int(header_length)], body[int(header_length):]
    else:
        head, blob = body, b""
    try:
        request = json.loads(head)
    except ValueError as exc:
        raise BadRequest(f"the request header is not JSON: {exc}") from None
    if not isinstance(request, dict) or not isinstance(request.get("inputs"), list) or not request["inputs"]:
        raise BadRequest("the request needs a non-empty list of inputs")
    values: dict[str, Any] = {}
    at = 0
    for tensor in request["inputs"]:
        if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
            raise BadRequest("each input needs a name, a datatype and a shape")
        name, datatype, shape = tensor["name"], tensor.get("datatype"), tensor.get("shape")
        if not isinstance(shape, list) or not shape or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise BadRequest(f"input {name}: shape {shape!r} is not a list of sizes, the events first")
        if datatype != "BYTES" and datatype not in NUMPY:
            raise BadRequest(f"input {name}: datatype {datatype!r} is not one of the protocol's")
        count = int(np.prod(shape))
        size = (tensor.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or size < 0 or at + size > len(blob):
                raise BadRequest(f"input {name}: binary_data_size {size!r} is past the body's end")
            raw = blob[at:at + size]
            at += size
            if datatype == "BYTES":
                data: Any = _bytes_elements(raw, count)
            else:
                dtype = np.dtype(NUMPY[datatype])
                if len(raw) != count * dtype.itemsize:
                    raise BadRequest(f"input {name}: {len(raw)} bytes for {count} {datatype} values")
                data = np.frombuffer(raw, dtype=dtype)
        else:
            flat = np.asarray(tensor.get("data"), dtype=object).reshape(-1).tolist() if "data" in tensor else None
            if flat is None or len(flat) != count:
                raise BadRequest(f"input {name}: {0 if flat is None else len(flat)} values in data, its shape "
                                 f"{shape} says {count}")
            data = flat if datatype == "BYTES" else np.asarray(flat, dtype=NUMPY[datatype])
        if name in values:
            raise BadRequest(f"input {name} given twice")
        values[name] = (shape, datatype, data)
    if at != len(blob):
        raise BadRequest(f"{len(blob) - at} bytes after the last binary input")
    return request, values


class InferenceApi:
    """The routes over one `PredictionClient` (see the module's docstring)."""

    def __init__(self, client: PredictionClient, input_schema: Mapping[str, Any],
                 output_schema: Mapping[str, Any] | None, *, model_name: str,
                 read_body: Callable[[Request], Awaitable[bytes | None]]) -> None:
        self.client = client
        self.model_name = model_name
        self.inputs, unsupported = tensor_fields(input_schema)
        self.outputs = tensor_fields(output_schema)[0] if output_schema else []
        # fields no tensor can carry: filled by their defaults, or they make every request impossible
        fields = {f["name"]: f for f in input_schema.get("fields", [])}
        self._other_fills = [fill for fill in (auto_fill(fields[name]) for name in unsupported) if fill is not None]
        self.blocking = [name for name in unsupported if auto_fill(fields[name]) is None]
        self._by_name = {f.name: f for f in self.inputs}
        self._read_body = read_body
        try:
            self.version = version("kafka-microbatch-inference")
        except PackageNotFoundError:
            self.version = "0"

    def routes(self, wrap: Callable[[Callable[[Request], Awaitable[Response]]],
                                    Callable[[Request], Awaitable[Response]]]) -> list[Route]:
        model = "/v2/models/{model}"
        versioned = "/v2/models/{model}/versions/{version}"
        return [Route("/v2", self.server, methods=["GET"]),
                Route("/v2/health/live", self.live, methods=["GET"]),
                Route("/v2/health/ready", self.ready, methods=["GET"]),
                *(r for prefix in (model, versioned) for r in (
                    Route(prefix, self.metadata, methods=["GET"]),
                    Route(f"{prefix}/ready", self.model_ready, methods=["GET"]),
                    Route(f"{prefix}/infer", wrap(self.infer), methods=["POST"])))]

    async def server(self, _request: Request) -> Response:
        return JSONResponse({"name": "stream-gateway", "version": self.version,
                             "extensions": ["binary_tensor_data"]})

    async def live(self, _request: Request) -> Response:
        return Response(status_code=200 if self.client.alive() else 503)

    async def ready(self, _request: Request) -> Response:
        return Response(status_code=200 if self.client.ready() else 503)

    def _unknown(self, request: Request) -> Response | None:
        name = request.path_params["model"]
        if name != self.model_name:
            return error(404, f"unknown model {name!r}: this gateway serves {self.model_name!r}")
        return None

    async def metadata(self, request: Request) -> Response:
        unknown = self._unknown(request)
        if unknown is not None:
            return unknown
        return JSONResponse({"name": self.model_name, "versions": [], "platform": "stream",
                             "inputs": [f.metadata() for f in self.inputs],
                             "outputs": [f.metadata() for f in self.outputs]})

    async def model_ready(self, request: Request) -> Response:
        return self._unknown(request) or Response(status_code=200 if self.client.ready() else 503)

    async def infer(self, request: Request) -> Response:
        unknown = self._unknown(request)
        if unknown is not None:
            return unknown
        body = await self._read_body(request)
        if body is None:
            return error(413, "the request body is over --max-input-bytes")
        try:
            parsed, tensors = parse_request(body, request.headers.get(HEADER_LENGTH))
            events = self._events(tensors)
        except BadRequest as exc:
            return error(400, str(exc))
        values = []
        for i, event in enumerate(events):
            try:
                values.append(self.client.encode(event))
            except Refused as exc:
                return error(400, f"event {i}: {exc}: {'; '.join(exc.problems)}")
            except Oversized as exc:
                return error(400, f"event {i}: {exc}")
        if self.client.pending + len(values) > self.client.max_pending:
            return error(503, f"{self.client.pending} events are waiting for their predictions (--max-pending "
                              f"{self.client.max_pending}): try again shortly", retry=True)
        futures: list[Awaitable[Prediction]] = []
        for value in values:
            try:
                futures.append(asyncio.wrap_future(self.client.submit_encoded(value)))
            except Overloaded as exc:
                if not futures:
                    return error(503, str(exc), retry=True)
                return error(503, f"event {len(futures)}: {exc}")
        results = await asyncio.gather(*futures, return_exceptions=True)
        for i, result in enumerate(results):
            if not isinstance(result, Prediction):
                return _failure(i, result)
        try:
            return self._answer(parsed, results)  # type: ignore[arg-type]
        except BadRequest as exc:
            return error(400, str(exc))

    def _events(self, tensors: dict[str, Any]) -> list[dict[str, Any]]:
        if self.blocking:
            raise BadRequest(f"the input schema's required fields {', '.join(self.blocking)} cannot be given as "
                             "tensors (records, maps, enums or unions), and have no default")
        unknown = sorted(set(tensors) - set(self._by_name))
        if unknown:
            raise BadRequest(f"no input {', '.join(unknown)}: the inputs are "
                             f"{', '.join(self._by_name)} (the input schema's fields)")
        missing = [f.name for f in self.inputs if f.name not in tensors and f.fill is None]
        if missing:
            raise BadRequest(f"inputs {', '.join(missing)} are required (the input schema's fields without a "
                             "default)")
        rows = {shape[0] for shape, _, _ in tensors.values()}
        if len(rows) != 1 or 0 in rows:
            raise BadRequest(f"every input's first dimension counts the events; they differ or are 0: {sorted(rows)}")
        n = rows.pop()
        if n > self.client.max_pending:
            raise BadRequest(f"{n} events in one request, over --max-pending ({self.client.max_pending})")
        columns = {name: self._column(self._by_name[name], shape, datatype, data)
                   for name, (shape, datatype, data) in tensors.items()}
        now = time.time()
        fills = [f.fill for f in self.inputs if f.name not in tensors and f.fill is not None] + self._other_fills
        return [{**{name: column[i] for name, column in columns.items()}, **{f.name: f.make(now) for f in fills}}
                for i in range(n)]

    @staticmethod
    def _column(field: TensorField, shape: list[int], datatype: str, data: Any) -> list[Any]:
        """One field's values, one per event."""
        n = shape[0]
        if field.avro == "array":
            if datatype == "BYTES" or datatype == "BOOL":
                raise BadRequest(f"input {field.name}: an array of numbers, not {datatype}")
            width = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            return np.asarray(data).reshape(n, width).tolist()
        if int(np.prod(shape[1:])) != 1:
            raise BadRequest(f"input {field.name}: one value per event (shape [{n}] or [{n}, 1]), not {shape}")
        if field.avro in ("string", "bytes"):
            if datatype != "BYTES":
                raise BadRequest(f"input {field.name}: a {field.avro} field takes BYTES, not {datatype}")
            items = [v if isinstance(v, bytes) else str(v).encode() for v in data]
            if field.avro == "bytes":
                return items
            try:
                return [v.decode("utf-8") for v in items]
            except UnicodeDecodeError:
                raise BadRequest(f"input {field.name}: a string field takes UTF-8 text") from None
        if datatype == "BYTES":
            raise BadRequest(f"input {field.name}: a {field.avro} field takes a number, not BYTES")
        values = np.asarray(data).reshape(n)
        if field.avro == "boolean":
            return [bool(v) for v in values.tolist()]
        if field.avro in ("int", "long") or field.avro.startswith("timestamp"):
            if values.dtype.kind == "f" and not np.all(np.mod(values, 1) == 0):
                raise BadRequest(f"input {field.name}: an {field.avro} field takes whole numbers")
            return [int(v) for v in values.tolist()]
        return [float(v) for v in values.tolist()]

    def _answer(self, request: dict[str, Any], results: list[Prediction]) -> Response:
        records = [p.record for p in results]
        asked = request.get("outputs")
        binary_all = bool((request.get("parameters") or {}).get("binary_data_output"))
        if asked:
            wanted = [(o.get("name"), bool((o.get("parameters") or {}).get("binary_data", binary_all)))
                      for o in asked if isinstance(o, dict)]
        else:
            wanted = [(name, binary_all) for name in records[0]]  # every field the prediction has
        outputs, blobs = [], []
        for name, binary in wanted:
            if not isinstance(name, str) or any(name not in r for r in records):
                raise BadRequest(f"no output {name!r}: the prediction has {', '.join(records[0])}")
            try:
                datatype, shape, array = _stack(name, [r[name] for r in records])
            except BadRequest:
                if asked:
                    raise
                continue  # all outputs: those with no tensor form (a null, a map) are left out
            tensor: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
            if binary:
                blob = _bytes_blob(array) if datatype == "BYTES" else np.ascontiguousarray(array).tobytes()
                tensor["parameters"] = {"binary_data_size": len(blob)}
                blobs.append(blob)
            else:
                tensor["data"] = ([v.decode("utf-8", "replace") for v in array] if datatype == "BYTES"
                                  else array.reshape(-1).tolist())
            outputs.append(tensor)
        version_of = records[0].get("model_version")
        head: dict[str, Any] = {"model_name": self.model_name, "model_version": str(version_of or ""),
                                "outputs": outputs}
        if "id" in request:
            head["id"] = request["id"]
        if not blobs:
            return JSONResponse(head)
        header = json.dumps(head).encode()
        return Response(header + b"".join(blobs), media_type="application/octet-stream",
                        headers={"Inference-Header-Content-Length": str(len(header))})


def _stack(name: str, values: list[Any]) -> tuple[str, list[int], Any]:
    """One output field's values across the events as (datatype, shape, a little-endian array or a list of
    bytes): a float column is FP32 when every value is a float32 (an Avro float), else FP64."""
    n = len(values)
    first = values[0]
    if any(v is None for v in values):
        raise BadRequest(f"output {name} is null for some events: it has no tensor form")
    if isinstance(first, str | bytes):
        return "BYTES", [n], [v.encode() if isinstance(v, str) else v for v in values]
    if isinstance(first, list):
        widths = {len(v) for v in values}
        if len(widths) != 1:
            raise BadRequest(f"output {name}: arrays of different lengths have no tensor form")
        array = np.asarray(values)
        shape = [n, widths.pop()]
    else:
        array = np.asarray(values)
        shape = [n]
    if array.dtype == np.bool_:
        return "BOOL", shape, array
    if array.dtype.kind in "iu":
        return "INT64", shape, array.astype("<i8")
    if array.dtype.kind == "f":
        as32 = array.astype("<f4")
        if np.array_equal(as32.astype(np.float64), array.astype(np.float64), equal_nan=True):
            return "FP32", shape, as32
        return "FP64", shape, array.astype("<f8")
    raise BadRequest(f"output {name} has no tensor form")


def _failure(i: int, exc: BaseException) -> Response:
    if isinstance(exc, DeadLettered):
        return error(400 if exc.stage == "decode" else 500, f"event {i}: {exc}")
    if isinstance(exc, RequestTimeout):
        return error(504, f"event {i}: {exc}")
    if isinstance(exc, NotSent | Overloaded):
        return error(503, f"event {i}: {exc}")
    return error(500, f"event {i}: {type(exc).__name__}: {exc}")
