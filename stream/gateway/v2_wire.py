"""The Open Inference Protocol's wire format (KServe v2, Triton's HTTP API), for `stream.gateway.kserve`'s routes:
the request and response documents as typed models (the OpenAPI document is built from them), a schema's fields
as tensors, and a request's tensors read from JSON ``data`` or the binary tensor extension
(``Inference-Header-Content-Length``: the JSON header's size; each binary input's ``binary_data_size`` bytes follow
it in order), checked as they are read (`BadRequest` naming the input); an output field's values stacked back into
a tensor (`stack`)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PlainValidator, StrictBool, WithJsonSchema

from stream.gateway.errors import BadReply, BadRequest
from stream.gateway.http import parse_json, validated
from stream.gateway.texts import Fill, auto_fill, kind_of

HEADER_LENGTH = "inference-header-content-length"
# Avro types to the protocol's datatypes (a timestamp is its long; an array is its items' type)
DATATYPES = {"float": "FP32", "double": "FP64", "int": "INT32", "long": "INT64", "boolean": "BOOL",
             "string": "BYTES", "bytes": "BYTES", "timestamp-millis": "INT64", "timestamp-micros": "INT64"}
NUMPY = {"FP16": "<f2", "FP32": "<f4", "FP64": "<f8", "INT8": "<i1", "INT16": "<i2", "INT32": "<i4",
         "INT64": "<i8", "UINT8": "<u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8", "BOOL": "|b1"}
NUMERIC = {"float", "double", "int", "long", "timestamp-millis", "timestamp-micros"}
Datatype = Literal["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16",
                   "FP32", "FP64", "BYTES"]


def _size(value: Any) -> int:
    """A size: a JSON integer (1.0 is one too) of 0 or more, never a boolean or a string."""
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            isinstance(value, float) and not value.is_integer()) or value < 0:
        raise ValueError("a size is a whole number, 0 or more")
    return int(value)


Size = Annotated[int, PlainValidator(_size), WithJsonSchema({"type": "integer", "minimum": 0})]
_DIGITS = re.compile(r"[0-9]{1,12}")
_MAX_NESTING = 32


class TensorParameters(BaseModel):
    model_config = ConfigDict(extra="allow")
    binary_data_size: Size | None = None
    binary_data: StrictBool | None = None


class RequestInput(BaseModel):
    # data in JSON, or parameters.binary_data_size bytes of it after the header
    model_config = ConfigDict(extra="ignore", json_schema_extra={"anyOf": [
        {"required": ["data"]},
        {"required": ["parameters"], "properties": {"parameters": {"required": ["binary_data_size"]}}}]})
    name: str
    shape: list[Size] = Field(min_length=1, description="the events first")
    datatype: Datatype
    parameters: TensorParameters | None = None
    data: list[Any] | None = None


class RequestOutput(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    parameters: TensorParameters | None = None


class RequestParameters(BaseModel):
    model_config = ConfigDict(extra="allow")
    binary_data_output: StrictBool | None = None


class InferenceRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str | None = None
    parameters: RequestParameters | None = None
    inputs: list[RequestInput] = Field(min_length=1)
    outputs: list[RequestOutput] | None = None


class ResponseOutput(BaseModel):
    name: str
    datatype: str
    shape: list[int]
    data: list[Any] | None = None
    parameters: dict[str, Any] | None = None


class InferenceResponse(BaseModel):
    model_name: str
    model_version: str
    id: str | None = None
    outputs: list[ResponseOutput]


class TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int]


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class Live(BaseModel):
    live: bool


class Ready(BaseModel):
    ready: bool


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
    nullable: bool = False

    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


def tensor_fields(schema: Mapping[str, Any]) -> tuple[list[TensorField], list[str]]:
    """The fields of a record schema that tensors can carry (scalars, strings, bytes, arrays of numbers), and the
    names of those they cannot (records, maps, enums, unions of several types)."""
    fields, others = [], []
    for f in schema.get("fields", []):
        kind = kind_of(f["type"])
        nullable = isinstance(f["type"], list) and "null" in f["type"]
        items = None
        if kind == "array":
            rest = [b for b in (f["type"] if isinstance(f["type"], list) else [f["type"]]) if b != "null"]
            items = kind_of(rest[0]["items"])
            if items not in NUMERIC or items.startswith("timestamp"):
                others.append(f["name"])
                continue
            fields.append(TensorField(f["name"], DATATYPES[items], (-1, -1), "array", items, auto_fill(f), nullable))
        elif kind in DATATYPES:
            fields.append(TensorField(f["name"], DATATYPES[kind], (-1,), kind, None, auto_fill(f), nullable))
        else:
            others.append(f["name"])
    return fields, others


def _bytes_elements(raw: bytes, count: int) -> list[bytes]:
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
        if len(out) > count:
            break
    if len(out) != count:
        raise BadRequest(f"a BYTES tensor holds {len(out)} elements or more, its shape says {count}")
    return out


def bytes_blob(values: Sequence[bytes]) -> bytes:
    return b"".join(len(v).to_bytes(4, "little") + v for v in values)


def _flat(data: list[Any], name: str) -> list[Any]:
    """``data`` row-major and flat: nested lists of scalars (nested at most _MAX_NESTING deep)."""
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                if len(stack) >= _MAX_NESTING:
                    raise BadRequest(f"input {name}: data nests too deep")
                stack.append(iter(item))
                break
            if isinstance(item, dict) or item is None:
                raise BadRequest(f"input {name}: data holds {type(item).__name__}, not a tensor's values")
            out.append(item)
        else:
            stack.pop()
    return out


def _typed(name: str, datatype: str, values: list[Any]) -> Any:
    """JSON values of a tensor as its datatype: BYTES strings as UTF-8, numbers as a numpy array; `BadRequest`
    for one that is not of the datatype."""
    if datatype == "BYTES":
        if not all(isinstance(v, str) for v in values):
            raise BadRequest(f"input {name}: BYTES data are strings")
        return [v.encode("utf-8") for v in values]
    if datatype == "BOOL":
        if not all(isinstance(v, bool) for v in values):
            raise BadRequest(f"input {name}: BOOL data are true or false")
        return np.asarray(values, dtype=np.bool_)
    dtype = np.dtype(NUMPY[datatype])
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if not all(isinstance(v, int) and not isinstance(v, bool) and info.min <= v <= info.max for v in values):
            raise BadRequest(f"input {name}: {datatype} data are whole numbers from {info.min} to {info.max}")
        return np.asarray(values, dtype=dtype)
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise BadRequest(f"input {name}: {datatype} data are numbers")
    with np.errstate(over="ignore"):
        array = np.asarray(values, dtype=dtype)
    if not np.isfinite(array).all():
        raise BadRequest(f"input {name}: a value is out of {datatype}'s range")
    return array


def parse_request(body: bytes, header_length: str | None) -> tuple[InferenceRequest, dict[str, Any]]:
    """(the request's JSON header, {input name: (shape, datatype, its elements flat: a numpy array or a list of
    bytes)})."""
    if header_length is not None:
        if not _DIGITS.fullmatch(header_length) or int(header_length) > len(body):
            raise BadRequest(f"Inference-Header-Content-Length {header_length[:20]!r} is not a size within the "
                             f"body's {len(body)} bytes")
        head, blob = body[:int(header_length)], body[int(header_length):]
    else:
        head, blob = body, b""
    request: InferenceRequest = validated(InferenceRequest, parse_json(head, "the request header"),
                                          "the request header")
    values: dict[str, Any] = {}
    at = 0
    for tensor in request.inputs:
        name, datatype, shape = tensor.name, tensor.datatype, tensor.shape
        if name in values:
            raise BadRequest(f"input {name} given twice")
        count = math.prod(shape)
        size = tensor.parameters.binary_data_size if tensor.parameters is not None else None
        if size is not None:
            if count > len(blob):  # every binary value takes a byte at least
                raise BadRequest(f"input {name}: shape {shape} says {count} values, more than the body holds")
            if at + size > len(blob):
                raise BadRequest(f"input {name}: binary_data_size {size} is past the body's end")
            raw = blob[at:at + size]
            at += size
            if datatype == "BYTES":
                data: Any = _bytes_elements(raw, count)
            else:
                dtype = np.dtype(NUMPY[datatype])
                if len(raw) != count * dtype.itemsize:
                    raise BadRequest(f"input {name}: {len(raw)} bytes for {count} {datatype} values")
                data = np.frombuffer(raw, dtype=dtype)
                if dtype.kind == "f" and not np.isfinite(data).all():
                    raise BadRequest(f"input {name}: NaN or infinity in {datatype} data")
        else:
            if tensor.data is None:
                raise BadRequest(f"input {name}: no data (and no binary_data_size)")
            flat = _flat(tensor.data, name)
            data = _typed(name, datatype, flat)
            if len(flat) != count:
                raise BadRequest(f"input {name}: {len(flat)} values in data, its shape {shape} says {count}")
        values[name] = (shape, datatype, data)
    if at != len(blob):
        raise BadRequest(f"{len(blob) - at} bytes after the last binary input")
    return request, values


def stack(name: str, values: list[Any]) -> tuple[str, list[int], Any]:
    """One output field's values across the events as (datatype, shape, a little-endian array or a list of
    bytes): a float column is FP32 when every value is a float32 (an Avro float), else FP64. `BadReply` when they
    have no tensor form."""
    n = len(values)
    first = values[0]
    if any(v is None for v in values):
        raise BadReply(f"output {name} is null for some events: it has no tensor form", sent=True)
    if isinstance(first, str | bytes):
        return "BYTES", [n], [v.encode() if isinstance(v, str) else v for v in values]
    if isinstance(first, list):
        widths = {len(v) if isinstance(v, list) else -1 for v in values}
        if len(widths) != 1 or -1 in widths:
            raise BadReply(f"output {name}: arrays of different lengths have no tensor form", sent=True)
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
    raise BadReply(f"output {name} has no tensor form", sent=True)
