"""Avro with the Confluent wire format (magic byte 0, 4-byte big-endian schema id, Avro binary).

The worker decodes input of any schema with `stream.codec.decoder` (field plans, `stream.codec.plan`; schema
sources, `stream.codec.registry`) and writes predictions with `stream.codec.encoder`. This module keeps the wire
format, the local schema folder (``schemas/registry.json``), one-record `encode`/`decode` (tests, the verifier, slow
paths) and the Avro primitives the encoders share. The load generator's framing of demo events is in
`producers.frames`. The C decoder and encoder are `_nativecodec.c`.

Layer: imports `stream.errors`, `stream.config`, `stream.models` (the output types) and `stream.kafka` (a consumed
batch); ops, the pipeline, the local launchers and the gateway import it.
"""

from __future__ import annotations

import io
import json
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from stream.errors import ConfigError, DecodeError

MAGIC = 0
_HEADER = struct.Struct(">bI")
HEADER_SIZE = _HEADER.size
# The repository's schemas/ folder; an installed package (the image) has none beside it: STREAM_SCHEMAS_DIR names it.
DEFAULT_SCHEMAS_DIR = Path(os.environ.get("STREAM_SCHEMAS_DIR") or Path(__file__).resolve().parents[2] / "schemas")


def strip_logical_types(schema: Any) -> Any:
    """Same binary encoding, but timestamps stay ints (no datetime objects on the hot path)."""
    if isinstance(schema, dict):
        return {k: strip_logical_types(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [strip_logical_types(s) for s in schema]
    return schema


def read_schema_folder(path: Path | None = None) -> tuple[Path, list[tuple[int, Any]]]:
    """(the folder, [(schema id, schema JSON)]) from a folder's ``registry.json`` (id -> ``.avsc`` file)."""
    folder = DEFAULT_SCHEMAS_DIR if path is None else Path(path)
    index = folder / "registry.json"
    try:
        listing = json.loads(index.read_text())["schemas"]
        return folder, [(int(k), json.loads((folder / v).read_text())) for k, v in listing.items()]
    except (OSError, KeyError, ValueError) as exc:
        raise ConfigError(f"cannot load the schema registry from {index}: {exc}") from exc


@dataclass(frozen=True)
class RegisteredSchema:
    schema_id: int
    name: str
    raw: Mapping[str, Any]
    parsed: Any
    header: bytes


class SchemaRegistry:
    """Schema id <-> schema, from a folder holding ``registry.json`` and ``.avsc`` files."""

    def __init__(self, schemas: Sequence[tuple[int, Mapping[str, Any]]]) -> None:
        self._by_id: dict[int, RegisteredSchema] = {}
        self._by_name: dict[str, RegisteredSchema] = {}
        for schema_id, raw in schemas:
            if not 0 <= schema_id < 2**31:
                raise ConfigError(f"schema id {schema_id} out of range")
            name = f"{raw.get('namespace', '')}.{raw['name']}".lstrip(".")
            entry = RegisteredSchema(
                schema_id, name, raw, parse_schema(strip_logical_types(dict(raw))), _HEADER.pack(MAGIC, schema_id)
            )
            if schema_id in self._by_id:
                raise ConfigError(f"schema id {schema_id} registered twice")
            self._by_id[schema_id] = entry
            # The highest id of a name is its current writer schema.
            if name not in self._by_name or self._by_name[name].schema_id < schema_id:
                self._by_name[name] = entry

    @classmethod
    def from_dir(cls, path: Path | None = None) -> SchemaRegistry:
        return cls(read_schema_folder(path)[1])

    def by_id(self, schema_id: int) -> RegisteredSchema | None:
        return self._by_id.get(schema_id)

    def by_name(self, name: str) -> RegisteredSchema:
        try:
            return self._by_name[name]
        except KeyError:
            raise ConfigError(f"schema {name!r} is not in the registry") from None


def encode(schema: RegisteredSchema, record: Mapping[str, Any]) -> bytes:
    buf = io.BytesIO()
    buf.write(schema.header)
    schemaless_writer(buf, schema.parsed, record)
    return buf.getvalue()


def decode(registry: SchemaRegistry, value: bytes | None) -> tuple[RegisteredSchema, Any]:
    """One framed value -> (schema, record); raises DecodeError with a reason category."""
    if value is None:
        raise DecodeError("null-value", "record has no value (tombstone)")
    if len(value) < HEADER_SIZE:
        raise DecodeError("truncated", f"{len(value)} bytes is shorter than the {HEADER_SIZE}-byte header")
    magic, schema_id = _HEADER.unpack_from(value)
    if magic != MAGIC:
        raise DecodeError("bad-magic", f"magic byte {magic & 0xFF} is not {MAGIC}")
    schema = registry.by_id(schema_id)
    if schema is None:
        raise DecodeError("unknown-schema", f"schema id {schema_id} is not registered")
    buf = io.BytesIO(value)
    buf.seek(HEADER_SIZE)
    try:
        record = schemaless_reader(buf, schema.parsed, None)
    except Exception as exc:  # fastavro raises EOFError, ValueError, UnicodeDecodeError, ...
        raise DecodeError("corrupt-avro", f"{type(exc).__name__}: {exc}") from None
    if buf.tell() != len(value):
        raise DecodeError("corrupt-avro", f"{len(value) - buf.tell()} trailing bytes after the record")
    return schema, record


_SHORT_LENGTHS = [bytes([2 * k]) for k in range(64)]  # zigzag varints of 0..63: one byte


def avro_string(text: str) -> bytes:
    """Avro string: zigzag-varint length, then UTF-8."""
    raw = text.encode("utf-8")
    length = len(raw)
    return (_SHORT_LENGTHS[length] if length < 64 else avro_long(length)) + raw


def avro_long(value: int) -> bytes:
    """One Avro long (zigzag varint)."""
    zz = ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while zz > 0x7F:
        out.append((zz & 0x7F) | 0x80)
        zz >>= 7
    out.append(zz)
    return bytes(out)


def utf8_column(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Strings as one UTF-8 buffer and each one's byte length."""
    joined = "".join(texts).encode("utf-8")
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    if len(joined) != int(lengths.sum()):  # some are not ASCII: byte lengths are not character counts
        parts = [t.encode("utf-8") for t in texts]
        joined = b"".join(parts)
        lengths = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
    return np.frombuffer(joined, dtype=np.uint8), lengths


@dataclass(frozen=True)
class InputSource:
    """Where each row of a batch was read: the input topic and, per row, its partition and offset."""

    topic: str
    partitions: np.ndarray  # int (n,)
    offsets: np.ndarray  # int64 (n,)


