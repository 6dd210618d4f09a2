"""Avro with the Confluent wire format (magic byte 0, 4-byte big-endian schema id, Avro binary).

The worker decodes input of any schema with `stream.codec.decoder` (field plans, `stream.codec.plan`; schema
sources, `stream.codec.registry`). This module keeps the local schema folder (``schemas/registry.json``), one-record
`encode`/`decode` (tests, the verifier, slow paths), the prediction encoder, and the load generator's framing of
demo events (`EventFrames`).
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from fastavro import parse_schema, schemaless_reader, schemaless_writer

from stream.errors import ConfigError, DecodeError

try:  # the C fast paths (stream/_nativecodec.c); without them the numpy versions below do the same work
    from stream import _nativecodec
except ImportError:  # not compiled (optional extension)
    _nativecodec = None  # type: ignore[assignment]

MAGIC = 0
_HEADER = struct.Struct(">bI")
HEADER_SIZE = _HEADER.size
DEFAULT_SCHEMAS_DIR = Path(__file__).resolve().parents[2] / "schemas"


def _strip_logical_types(schema: Any) -> Any:
    """Same binary encoding, but timestamps stay ints (no datetime objects on the hot path)."""
    if isinstance(schema, dict):
        return {k: _strip_logical_types(v) for k, v in schema.items() if k != "logicalType"}
    if isinstance(schema, list):
        return [_strip_logical_types(s) for s in schema]
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
                schema_id, name, raw, parse_schema(_strip_logical_types(dict(raw))), _HEADER.pack(MAGIC, schema_id)
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
    """One Avro long (zigzag varint); `encode_longs` does a whole column."""
    zz = ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while zz > 0x7F:
        out.append((zz & 0x7F) | 0x80)
        zz >>= 7
    out.append(zz)
    return bytes(out)


_VARINT_LIMITS = np.asarray([2 ** (7 * k) - 1 for k in range(1, 10)], dtype=np.uint64)  # largest of k bytes


def _zigzag_varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Avro longs for a column: (n, k) bytes, row i's varint in its first ``lengths[i]`` bytes; lengths."""
    v = np.asarray(values, dtype=np.int64)
    zz = (v.astype(np.uint64) << np.uint64(1)) ^ (v >> np.int64(63)).astype(np.uint64)
    lengths = np.searchsorted(_VARINT_LIMITS, zz, side="left") + 1  # 7 bits per byte; at least one byte
    k = int(lengths.max()) if len(zz) else 1
    groups = ((zz[:, None] >> (np.uint64(7) * np.arange(k, dtype=np.uint64))) & np.uint64(0x7F)).astype(np.uint8)
    groups[np.arange(k) < (lengths - 1)[:, None]] |= 0x80  # continuation bit on all but the last byte
    return groups, lengths


def _packed(groups: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Rows of ``groups`` cut to their lengths, back to back."""
    return groups[np.arange(groups.shape[1]) < lengths[:, None]]


def _split(blob: bytes, lengths: np.ndarray) -> list[bytes]:
    ends = np.cumsum(lengths)
    return [blob[a:b] for a, b in zip((ends - lengths).tolist(), ends.tolist(), strict=True)]


def _scatter(out: np.ndarray, dest: np.ndarray, packed: np.ndarray, lengths: np.ndarray) -> None:
    """Copy variable-length rows (``packed`` back to back) to ``out`` at offsets ``dest``."""
    src_start = np.cumsum(lengths) - lengths
    out[np.repeat(dest - src_start, lengths) + np.arange(len(packed))] = packed


def _copy_rows(out: np.ndarray, dest: np.ndarray, src: np.ndarray, src_start: np.ndarray, lengths: np.ndarray) -> None:
    """Copy ``src[src_start[i] : src_start[i] + lengths[i]]`` to ``out`` at ``dest[i]``, for every row i."""
    step = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)  # offset in its row
    out[np.repeat(dest, lengths) + step] = src[np.repeat(src_start, lengths) + step]


def encode_longs(values: np.ndarray) -> list[bytes]:
    """Avro longs (zigzag varints) for a whole column at once."""
    groups, lengths = _zigzag_varints(values)
    return _split(_packed(groups, lengths).tobytes(), lengths)


_EVENT_LAYOUT = ["string", "string", {"type": "long"}, {"type": "array", "items": "float"}]  # EventFrames


def _utf8_column(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Strings as one UTF-8 buffer and each one's byte length."""
    joined = "".join(texts).encode("utf-8")
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    if len(joined) != int(lengths.sum()):  # some are not ASCII: byte lengths are not character counts
        parts = [t.encode("utf-8") for t in texts]
        joined = b"".join(parts)
        lengths = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
    return np.frombuffer(joined, dtype=np.uint8), lengths


class EventFrames:
    """Framed input-event values of a block, back to back in one buffer, each with a ``ts_len``-byte slot for its
    ts_ms at ``ts_at[i]``: the load generator stamps a burst of events in place as it hands them over, so a block
    framed ahead of time costs only the stamping and the send when it goes out."""

    values: np.ndarray  # uint8, every value back to back (written by the stamping)
    ends: np.ndarray  # int64 (n,): where value i ends in ``values``
    ts_at: np.ndarray  # int64 (n,): where value i's ts_ms slot starts in ``values``
    ts_len: int

    def __init__(self, values: np.ndarray, ends: np.ndarray, ts_at: np.ndarray, ts_len: int) -> None:
        self.values, self.ends, self.ts_at, self.ts_len = values, ends, ts_at, ts_len
        self._ts_columns = np.arange(ts_len, dtype=np.int64)

    @classmethod
    def build(cls, schema: RegisteredSchema, event_ids: Sequence[str], keys: Sequence[str], features: np.ndarray,
              ts_len: int) -> EventFrames:
        """Frames for the event layout (string event_id, string key, long ts_ms, array<float> features);
        ValueError for a schema of any other layout."""
        if [_strip_logical_types(f["type"]) for f in schema.raw["fields"]] != _EVENT_LAYOUT:
            raise ValueError(f"schema {schema.name} is not the event layout (event_id, key, ts_ms, features)")
        n, n_features = features.shape
        columns = [_utf8_column(event_ids), _utf8_column(keys)]
        varints = [_zigzag_varints(lengths) for _, lengths in columns]
        heads = HEADER_SIZE + sum(v[1] + c[1] for v, c in zip(varints, columns, strict=True))
        # Avro array: one block holding all the floats, then the 0 that ends the array (just the 0 when empty).
        count = avro_long(n_features) if n_features else b""
        tail = len(count) + 4 * n_features + 1
        # Framed first as right-aligned rows, so that the ts slot and the feature array of every value sit in the
        # same columns and are written as slices; then the rows are joined without their left padding.
        width = (int(heads.max()) if n else HEADER_SIZE) + ts_len + tail
        rows = np.zeros((n, width), dtype=np.uint8)
        ts_column = width - tail - ts_len
        rows[:, width - tail : width - tail + len(count)] = np.frombuffer(count, dtype=np.uint8)
        rows[:, width - tail + len(count) : width - 1] = np.ascontiguousarray(features, dtype="<f4").view(
            np.uint8).reshape(n, 4 * n_features)
        starts = ts_column - heads
        flat = rows.reshape(-1)
        at = np.arange(n, dtype=np.int64) * width + starts
        flat[at[:, None] + np.arange(HEADER_SIZE)] = np.frombuffer(schema.header, dtype=np.uint8)
        at = at + HEADER_SIZE
        for (groups, varint_len), (text, text_len) in zip(varints, columns, strict=True):
            _scatter(flat, at, _packed(groups, varint_len), varint_len)
            at = at + varint_len
            _copy_rows(flat, at, text, np.cumsum(text_len) - text_len, text_len)
            at = at + text_len
        ends = np.cumsum(width - starts, dtype=np.int64)
        return cls(rows[np.arange(width) >= starts[:, None]], ends, ends - (width - ts_column), ts_len)

    def __len__(self) -> int:
        return len(self.ends)

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes + self.ends.nbytes + self.ts_at.nbytes)

    def stamped(self, start: int, stop: int, ts: bytes) -> list[bytes]:
        """Values ``start:stop``, with ``ts`` (an Avro long of exactly ``ts_len`` bytes) as their ts_ms."""
        blob, ends = self.stamped_joined(start, stop, ts)
        bounds = ends.tolist()
        return [blob[a:b] for a, b in zip([0, *bounds[:-1]] if bounds else [], bounds, strict=True)]

    def stamped_joined(self, start: int, stop: int, ts: bytes) -> tuple[bytes, np.ndarray]:
        """Values ``start:stop`` stamped as in `stamped`, back to back in one buffer, with each value's end offset
        in it (the layout `stream.native.NativeProducer.produce` takes)."""
        if len(ts) != self.ts_len:
            raise ValueError(f"{len(ts)}-byte timestamp for a {self.ts_len}-byte slot")
        if stop <= start:
            return b"", np.zeros(0, dtype=np.int64)
        self.values[self.ts_at[start:stop, None] + self._ts_columns] = np.frombuffer(ts, dtype=np.uint8)
        low = int(self.ends[start - 1]) if start else 0
        return self.values[low : int(self.ends[stop - 1])].tobytes(), self.ends[start:stop] - low


@dataclass(frozen=True)
class InputSource:
    """Where each row of a batch was read: the input topic and, per row, its partition and offset."""

    topic: str
    partitions: np.ndarray  # int (n,)
    offsets: np.ndarray  # int64 (n,)


