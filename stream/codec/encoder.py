"""Predictions of any layout: an output schema (given, or derived from the model's outputs, the copied fields and
the lineage fields) and an encoder that writes a batch of them from columns, in C where the extension is built.

Every field of the output schema is filled from one of:

- a copied input field (``--copy-fields out=in.path``; the caller's own id, a timestamp, ...);
- a model output (`OutputSpec`: a scalar, a string, or a vector such as an embedding);
- a lineage field: ``model_name``, ``model_version``, ``predicted_ts_ms``, ``batch_size``, ``input_topic``,
  ``input_partition``, ``input_offset`` (the input record each prediction answers);
- its default, for any other field that has one.

A field that none of them fills, or fills with a type Avro cannot write there, is refused at start-up, one line
per field.
"""

from __future__ import annotations

import io
import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastavro import parse_schema, schemaless_writer

from stream.codec import HEADER_SIZE, InputSource, avro_long, avro_string, utf8_column
from stream.codec.columns import Column, Columns, ColumnSpec, type_name
from stream.codec.registry import WriterSchema
from stream.errors import ConfigError
from stream.models.spec import OutputSpec

try:
    from stream.codec import _nativecodec
except ImportError:
    _nativecodec = None  # type: ignore[assignment]

LINEAGE: dict[str, str] = {
    "model_name": "string", "model_version": "string", "predicted_ts_ms": "long", "batch_size": "int",
    "input_topic": "string", "input_partition": "int", "input_offset": "long",
}
SOURCE_FIELDS = ("input_topic", "input_partition", "input_offset")
# Operations of the C encoder (stream/codec/_nativecodec.c, encode_rows)
EN_CONST, EN_LONG, EN_INT, EN_FLOAT, EN_DOUBLE, EN_BOOL, EN_BYTES, EN_REALS, EN_LONGS, EN_INTS, EN_NULLABLE = range(11)
_SCALAR_OP = {"long": EN_LONG, "int": EN_INT, "float": EN_FLOAT, "double": EN_DOUBLE, "boolean": EN_BOOL}
_DTYPE = {"long": np.int64, "int": np.int32, "float": np.float32, "double": np.float64, "boolean": np.uint8}
# what a value of one Avro type may be written as (the specification's promotions)
_WRITABLE_AS = {"int": ("int", "long", "float", "double"), "long": ("long", "float", "double"),
                "float": ("float", "double"), "double": ("double",), "boolean": ("boolean",),
                "string": ("string", "bytes"), "bytes": ("bytes",), "fixed": ("bytes",), "enum": ()}


def parse_copy_fields(items: Sequence[str] | str | None) -> list[tuple[str, str]]:
    """``"order_id,amount=payment.amount"`` -> [(output field, input field path), ...]."""
    if items is None:
        return []
    if isinstance(items, str):
        items = [p for p in items.split(",") if p.strip()]
    out: list[tuple[str, str]] = []
    for item in items:
        name, sep, path = item.partition("=")
        name, path = name.strip(), (path.strip() if sep else name.strip())
        if not name or not path or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ConfigError(f"--copy-fields {item!r}: expected FIELD or OUTPUT=FIELD (an Avro field name, then a "
                              "dotted path in the input schema)")
        if name in dict(out):
            raise ConfigError(f"--copy-fields: {name!r} given twice")
        out.append((name, path))
    return out


def _column_avro(spec: ColumnSpec) -> Any:
    if spec.kind == "array":
        return {"type": "array", "items": spec.items}
    if spec.kind == "enum":
        raise ConfigError(f"copying the enum field {spec.path} is not supported; copy another field")
    return "bytes" if spec.kind == "fixed" else spec.kind


def derive_schema(name: str, namespace: str, copies: Sequence[tuple[str, ColumnSpec]],
                  outputs: Sequence[OutputSpec]) -> dict[str, Any]:
    """The output schema of a model: the copied fields, its outputs, then the lineage fields."""
    fields: list[dict[str, Any]] = []
    for field, spec in copies:
        avro = _column_avro(spec)
        fields.append({"name": field, "type": ["null", avro], "default": None} if spec.nullable else
                      {"name": field, "type": avro})
    fields += [{"name": o.name, "type": o.avro} for o in outputs]
    fields += [{"name": f, "type": t} for f, t in LINEAGE.items()]
    seen: set[str] = set()
    for f in fields:
        if f["name"] in seen:
            raise ConfigError(f"output field {f['name']!r} comes from two places (a copied field, a model output "
                              "or a lineage field): rename one with --copy-fields NEW=FIELD")
        seen.add(f["name"])
    return {"type": "record", "name": re.sub(r"\W", "_", name) or "Prediction", "namespace": namespace,
            "doc": "Predictions written by the stream worker: copied input fields, model outputs, lineage.",
            "fields": fields}


@dataclass(frozen=True)
class _Field:
    name: str
    source: str  # copy | output | lineage | default
    key: str  # the column path, output name or lineage name
    avro: str  # the Avro type written (the union's non-null branch for a nullable field)
    items: str | None  # arrays: the item type
    nullable: tuple[int, int] | None  # (null branch, value branch) of a union field
    default: bytes = b""  # source "default": the encoded default


class OutputEncoder:
    """Encodes a batch of predictions into ``schema`` (a registered output schema: its id goes in each header)."""

    def __init__(self, schema: WriterSchema, copies: Sequence[tuple[str, ColumnSpec]],
                 outputs: Sequence[OutputSpec], native: bool = True) -> None:
        self.schema = schema
        self.header = b"\x00" + schema.schema_id.to_bytes(4, "big")
        self._parsed = parse_schema(schema.raw)
        record = schema.normalized
        if type_name(record) != "record":
            raise ConfigError(f"the output schema {schema.name} is not a record")
        copied = dict(copies)
        out_specs = {o.name: o for o in outputs}
        problems: list[str] = []
        fields: list[_Field] = []
        for f in record["fields"]:
            t = f["type"]
            nullable = None
            if isinstance(t, list):
                others = [i for i, b in enumerate(t) if b != "null"]
                if len(t) != 2 or len(others) != 1:
                    problems.append(f"{f['name']}: unions other than [null, T] are not supported")
                    continue
                nullable = (1 - others[0], others[0])
                t = t[others[0]]
            kind = type_name(t)
            items = type_name(t["items"]) if kind == "array" else None
            if f["name"] in copied:
                spec = copied[f["name"]]
                have, have_items = spec.kind, spec.items
                source, key = "copy", spec.path
                if spec.nullable and nullable is None:
                    problems.append(f"{f['name']} <- {spec.path}: the input field can be null, the output field "
                                    "cannot")
                    continue
            elif f["name"] in out_specs:
                o = out_specs[f["name"]]
                have = "array" if o.type.startswith("array<") else o.type
                have_items = o.type[6:-1] if have == "array" else None
                source, key = "output", o.name
            elif f["name"] in LINEAGE:
                have, have_items, source, key = LINEAGE[f["name"]], None, "lineage", f["name"]
            elif "default" in f:
                buf = io.BytesIO()
                schemaless_writer(buf, parse_schema({"type": "record", "name": "D", "fields": [
                    {"name": "v", "type": f["type"]}]}), {"v": f["default"]})
                fields.append(_Field(f["name"], "default", f["name"], kind, items, None, buf.getvalue()))
                continue
            else:
                problems.append(f"{f['name']} ({kind}): no copied field, model output or lineage field fills it, "
                                "and it has no default")
                continue
            if have == "array" and kind == "array":
                ok = have_items in _WRITABLE_AS and items in _WRITABLE_AS[str(have_items)] and items in (
                    "float", "double", "int", "long") and (have_items == items or items in ("long", "double"))
            else:
                ok = kind in _WRITABLE_AS.get(have, ()) and kind in (*_SCALAR_OP, "string", "bytes")
            if not ok:
                got = f"array<{have_items}>" if have == "array" else have
                problems.append(f"{f['name']}: a {got} ({source} {key}) cannot be written as "
                                f"{f'array<{items}>' if kind == 'array' else kind}")
                continue
            fields.append(_Field(f["name"], source, key, kind, items, nullable))
        names = {f["name"] for f in record["fields"]}
        unused = [f"--copy-fields {n}" for n in copied if n not in names] + [
            f"model output {n}" for n in out_specs if n not in names]
        problems += [f"{u}: the output schema {schema.name} has no such field" for u in unused]
        if problems:
            raise ConfigError(f"the output schema {schema.name} (id {schema.schema_id}) does not fit:\n  "
                              + "\n  ".join(problems))
        self._fields = fields
        self.carries_source = all(any(f.source == "lineage" and f.key == s for f in fields) for s in SOURCE_FIELDS)
        self._native = _nativecodec if native else None

    @property
    def copied_paths(self) -> list[str]:
        return [f.key for f in self._fields if f.source == "copy"]

    def encode_joined(self, decoded: Columns, outputs: Mapping[str, Any], *, model_name: str, model_version: str,
                      predicted_ts_ms: int, batch_size: int, source: InputSource) -> tuple[bytes, np.ndarray]:
        """Row i of ``decoded`` (its columns) and of ``outputs`` -> one framed prediction; all of them back to back,
        with each one's end offset."""
        n = len(decoded)
        if n == 0:
            return b"", np.zeros(0, dtype=np.int64)
        lineage = {"model_name": model_name, "model_version": model_version, "predicted_ts_ms": predicted_ts_ms,
                   "batch_size": batch_size, "input_topic": source.topic}
        if self._native is None:
            values = self._encode_slow(decoded, outputs, lineage, source)
            return b"".join(values), np.cumsum(np.fromiter(map(len, values), dtype=np.int64, count=n))
        program: list[int] = []
        consts: list[bytes] = []
        arrays: list[np.ndarray] = []
        ones: np.ndarray | None = None
        last_const = False

        def array(a: np.ndarray) -> int:
            arrays.append(np.ascontiguousarray(a))
            return len(arrays) - 1

        for f in self._fields:
            if f.source == "default" or (f.source == "lineage" and f.key in lineage):
                raw = f.default if f.source == "default" else _encode_const(f, lineage[f.key])
                if f.nullable is not None:
                    raw = avro_long(f.nullable[1]) + raw
                if last_const:
                    consts[-1] += raw  # adjacent constants: one copy
                else:
                    program += [EN_CONST, len(consts)]
                    consts.append(raw)
                last_const = True
                continue
            last_const = False
            if f.nullable is not None:
                valid = None
                if f.source == "copy":
                    valid = decoded[f.key].valid
                if valid is None:
                    ones = ones if ones is not None else np.ones(n, dtype=np.uint8)
                    valid = ones
                nullable_valid = array(valid.view(np.uint8))
            if f.source == "lineage":
                column = source.partitions if f.key == "input_partition" else source.offsets
                op = [_SCALAR_OP[f.avro], array(np.asarray(column, dtype=_DTYPE[f.avro]))]
            elif f.source == "copy":
                op = self._column_op(f, decoded[f.key], array)
            else:
                op = self._output_op(f, outputs[f.key], n, array)
            if f.nullable is not None:  # the union's branch, then the value's op (skipped for a null)
                program += [EN_NULLABLE, nullable_valid, f.nullable[0], f.nullable[1], len(op)]
            program += op
        ends = np.empty(n, dtype=np.int64)
        joined = self._native.encode_rows(self.header, np.asarray(program, dtype=np.int32), consts, arrays, n, ends)
        return joined, ends

    def encode_batch(self, decoded: Columns, outputs: Mapping[str, Any], **fields: Any) -> list[bytes]:
        joined, ends = self.encode_joined(decoded, outputs, **fields)
        bounds = [0, *ends.tolist()]
        return [joined[a:b] for a, b in itertools.pairwise(bounds)]

    @staticmethod
    def _column_op(f: _Field, column: Column, array: Any) -> list[int]:
        if f.avro in ("string", "bytes"):
            assert column.offsets is not None
            return [EN_BYTES, array(column.values), array(column.offsets)]
        if f.avro == "array":
            assert column.offsets is not None and f.items is not None
            return _vector_op(f.items, column.values, column.offsets, array)
        return [_SCALAR_OP[f.avro], array(np.asarray(column.values, dtype=_DTYPE[f.avro]))]

    @staticmethod
    def _output_op(f: _Field, value: Any, n: int, array: Any) -> list[int]:
        if f.avro in ("string", "bytes"):
            if isinstance(value, np.ndarray) and value.dtype.kind in ("S", "U", "O"):
                value = value.tolist()
            parts = [v if isinstance(v, bytes) else str(v) for v in value]
            if parts and isinstance(parts[0], bytes):
                lengths = np.fromiter(map(len, parts), dtype=np.int64, count=n)
                data = np.frombuffer(b"".join(parts), dtype=np.uint8)  # type: ignore[arg-type]
            else:
                data, lengths = utf8_column(parts)  # type: ignore[arg-type]
            offsets = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            return [EN_BYTES, array(data), array(offsets)]
        if f.avro == "array":
            assert f.items is not None
            matrix = np.asarray(value)
            if matrix.ndim != 2 or len(matrix) != n:
                raise ValueError(f"output {f.key}: expected an (n, k) array, got shape {matrix.shape}")
            k = matrix.shape[1]
            return _vector_op(f.items, matrix.reshape(-1), np.arange(n + 1, dtype=np.int64) * k, array)
        return [_SCALAR_OP[f.avro], array(np.asarray(value, dtype=_DTYPE[f.avro]))]

    def _encode_slow(self, decoded: Columns, outputs: Mapping[str, Any], lineage: Mapping[str, Any],
                     source: InputSource) -> list[bytes]:
        """fastavro, record by record (where the C extension is not built)."""
        n = len(decoded)
        columns: dict[str, list[Any]] = {}
        for f in self._fields:
            if f.source == "copy":
                columns[f.name] = [decoded[f.key].row(i) for i in range(n)]
            elif f.source == "output":
                value = outputs[f.key]
                columns[f.name] = value.tolist() if isinstance(value, np.ndarray) else list(value)
        parts, offsets = source.partitions.tolist(), source.offsets.tolist()
        out = []
        for i in range(n):
            record: dict[str, Any] = {name: col[i] for name, col in columns.items()}
            record.update(lineage)
            record["input_partition"], record["input_offset"] = parts[i], offsets[i]
            buf = io.BytesIO()
            buf.write(self.header)
            schemaless_writer(buf, self._parsed, record)
            out.append(buf.getvalue())
        return out


def _vector_op(items: str, values: np.ndarray, offsets: np.ndarray, array: Any) -> list[int]:
    if items in ("float", "double"):
        return [EN_REALS, array(np.asarray(values, dtype=_DTYPE[items])), array(offsets), 4 if items == "float" else 8]
    return [EN_LONGS if items == "long" else EN_INTS, array(np.asarray(values, dtype=_DTYPE[items])), array(offsets)]


def _encode_const(f: _Field, value: Any) -> bytes:
    if f.avro == "string":
        return avro_string(str(value))
    if f.avro in ("long", "int"):
        return avro_long(int(value))
    raise ConfigError(f"lineage field {f.name} cannot be written as {f.avro}")


__all__ = ["HEADER_SIZE", "LINEAGE", "OutputEncoder", "derive_schema", "parse_copy_fields"]
