"""Reader schemas, normalised, and the columns a batch is decoded into.

Columns (`Columns`) are named by the reader field's dotted path (``customer.address.city``):

- boolean, int, long, float, double: a numpy array of one value per row (bool, int32, int64, float32, float64);
- string, bytes, fixed: one byte buffer and ``n + 1`` offsets (row i is ``data[offsets[i]:offsets[i + 1]]``);
- enum: int32 codes into the reader's symbols;
- array of boolean/int/long/float/double: values back to back and ``n + 1`` offsets;
- a nullable union (``["null", T]`` in either order) or a field inside a nullable record: T's column and a
  ``valid`` mask (False where the value was null; the value slot then holds 0 or an empty run).

Other reader types (maps, arrays of records or strings, unions of several non-null types, recursive records)
are resolved and skipped; asking for one as a column is a configuration error.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stream.errors import ConfigError

PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")
SCALARS = {"boolean": np.bool_, "int": np.int32, "long": np.int64, "float": np.float32, "double": np.float64}
NUMERIC = ("boolean", "int", "long", "float", "double")

# -- schemas, normalised ---------------------------------------------------------------------------------------

def normalize(schema: Any, named: dict[str, Any] | None = None) -> Any:
    """A parsed Avro schema (JSON text or its object) with every named-type reference replaced by its definition,
    every name made full (``namespace.name``) and logical types dropped (their underlying type is what is on
    the wire). Recursive records are refused. ``named``: types defined before (a registry's references); the
    schema's own named types are added to it."""
    if isinstance(schema, str) and schema.lstrip().startswith(("{", "[", '"')):
        schema = json.loads(schema)
    return _normalize(schema, "", {} if named is None else named, ())


def _fullname(name: str, namespace: str) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _normalize(schema: Any, namespace: str, named: dict[str, Any], stack: tuple[str, ...]) -> Any:
    if isinstance(schema, str):
        if schema in PRIMITIVES:
            return schema
        full = schema if schema in named else _fullname(schema, namespace)
        if full in stack:
            raise ConfigError(f"recursive type {full} is not supported")
        if full not in named:
            raise ConfigError(f"unknown type {schema!r}")
        return named[full]
    if isinstance(schema, list):
        return [_normalize(branch, namespace, named, stack) for branch in schema]
    if not isinstance(schema, Mapping) or "type" not in schema:
        raise ConfigError(f"not an Avro schema: {schema!r}")
    kind = schema["type"]
    if kind in PRIMITIVES:
        return kind
    if kind in ("record", "error", "enum", "fixed"):
        full = _fullname(schema["name"], schema.get("namespace", namespace))
        inner = full.rpartition(".")[0]
        aliases = [_fullname(a, inner) for a in schema.get("aliases", [])]
        if kind == "enum":
            out: dict[str, Any] = {"type": "enum", "name": full, "aliases": aliases,
                                   "symbols": list(schema["symbols"]), "default": schema.get("default")}
            named[full] = out
            return out
        if kind == "fixed":
            out = {"type": "fixed", "name": full, "aliases": aliases, "size": int(schema["size"])}
            named[full] = out
            return out
        out = {"type": "record", "name": full, "aliases": aliases, "fields": []}
        named[full] = out  # visible to its own fields only as a recursion error (stack)
        for f in schema["fields"]:
            entry = {"name": f["name"], "aliases": list(f.get("aliases", [])),
                     "type": _normalize(f["type"], inner, named, (*stack, full))}
            if "default" in f:
                entry["default"] = f["default"]
            out["fields"].append(entry)
        return out
    if kind == "array":
        return {"type": "array", "items": _normalize(schema["items"], namespace, named, stack)}
    if kind == "map":
        return {"type": "map", "values": _normalize(schema["values"], namespace, named, stack)}
    if isinstance(kind, (Mapping, list)) or kind in named or isinstance(kind, str):
        return _normalize(kind, namespace, named, stack)  # {"type": {...}} / {"type": "Name"}
    raise ConfigError(f"unknown type {kind!r}")


def type_name(t: Any) -> str:
    if isinstance(t, str):
        return t
    if isinstance(t, list):
        return "union"
    return str(t["type"])


def short_name(name: str) -> str:
    return name.rpartition(".")[2]


def _nullable(t: Any) -> Any | None:
    """T for a union of null and one other type, else None."""
    if isinstance(t, list) and len(t) == 2 and "null" in t:
        other = t[0] if t[1] == "null" else t[1]
        return None if other == "null" or isinstance(other, list) else other
    return None


# -- columns of the reader -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ColumnSpec:
    """One column of a decoded batch: its dotted path in the reader schema and its type."""

    path: str
    kind: str  # boolean int long float double string bytes fixed enum array
    nullable: bool = False
    items: str | None = None  # array: the item type
    symbols: tuple[str, ...] = ()  # enum: the reader's symbols
    size: int = 0  # fixed

    @property
    def dtype(self) -> np.dtype[Any]:
        if self.kind in SCALARS:
            return np.dtype(SCALARS[self.kind])
        if self.kind == "enum":
            return np.dtype(np.int32)
        if self.kind == "array":
            assert self.items is not None
            return np.dtype(SCALARS[self.items])
        return np.dtype(np.uint8)

    def describe(self) -> str:
        inner = f"array<{self.items}>" if self.kind == "array" else self.kind
        return f"{inner} (nullable)" if self.nullable else inner


def reader_columns(reader: Any) -> tuple[list[ColumnSpec], list[str]]:
    """(the columns a normalised reader record can be decoded into, the paths of fields it cannot)."""
    cols: list[ColumnSpec] = []
    unsupported: list[str] = []
    _collect(reader, "", False, cols, unsupported)
    return cols, unsupported


def _column_of(t: Any, path: str, nullable: bool) -> ColumnSpec | None:
    kind = type_name(t)
    if kind in SCALARS or kind in ("string", "bytes"):
        return ColumnSpec(path, kind, nullable)
    if kind == "enum":
        return ColumnSpec(path, "enum", nullable, symbols=tuple(t["symbols"]))
    if kind == "fixed":
        return ColumnSpec(path, "fixed", nullable, size=int(t["size"]))
    if kind == "array" and type_name(t["items"]) in SCALARS:
        return ColumnSpec(path, "array", nullable, items=type_name(t["items"]))
    return None


def _collect(t: Any, prefix: str, nullable: bool, cols: list[ColumnSpec], unsupported: list[str]) -> None:
    for f in t["fields"]:
        path = f"{prefix}{f['name']}"
        ft, fnull = f["type"], nullable
        inner = _nullable(ft)
        if inner is not None:
            ft, fnull = inner, True
        if type_name(ft) == "record":
            _collect(ft, path + ".", fnull, cols, unsupported)
            continue
        spec = _column_of(ft, path, fnull)
        if spec is None:
            unsupported.append(path)
        else:
            cols.append(spec)


@dataclass
class Column:
    spec: ColumnSpec
    values: np.ndarray  # one per row; for string/bytes/fixed the bytes and for arrays the items, back to back
    offsets: np.ndarray | None = None  # int64 (n + 1,): variable-length kinds
    valid: np.ndarray | None = None  # bool (n,): nullable columns
    finite: np.ndarray | None = None  # bool (n,): float and double columns, False where a row holds NaN or inf

    def __len__(self) -> int:
        return len(self.offsets) - 1 if self.offsets is not None else len(self.values)

    def row(self, i: int) -> Any:
        """Row i as a Python value (tests and slow paths): None where null."""
        if self.valid is not None and not self.valid[i]:
            return None
        if self.offsets is None:
            v = self.values[i].item()
            return self.spec.symbols[v] if self.spec.kind == "enum" else v
        part = self.values[int(self.offsets[i]) : int(self.offsets[i + 1])]
        if self.spec.kind == "string":
            return part.tobytes().decode("utf-8")
        if self.spec.kind in ("bytes", "fixed"):
            return part.tobytes()
        return part.tolist()

    def take(self, rows: np.ndarray) -> Column:
        valid = None if self.valid is None else self.valid[rows]
        finite = None if self.finite is None else self.finite[rows]
        if self.offsets is None:
            return Column(self.spec, self.values[rows], None, valid, finite)
        starts, ends = self.offsets[:-1][rows], self.offsets[1:][rows]
        lengths = ends - starts
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        step = np.arange(int(offsets[-1])) - np.repeat(offsets[:-1], lengths)
        return Column(self.spec, self.values[np.repeat(starts, lengths) + step], offsets, valid, finite)


@dataclass
class Columns:
    """A decoded batch: ``index[i]`` is row i's position in the raw batch; columns by dotted path."""

    index: np.ndarray
    columns: dict[str, Column] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, path: str) -> Column:
        return self.columns[path]

    def rows(self) -> list[dict[str, Any]]:
        return [{p: c.row(i) for p, c in self.columns.items()} for i in range(len(self))]

    def take(self, rows: np.ndarray) -> Columns:
        return Columns(self.index[rows], {p: c.take(rows) for p, c in self.columns.items()})

    @staticmethod
    def concat(parts: Iterable[Columns], specs: Sequence[ColumnSpec]) -> Columns:
        parts = [p for p in parts if len(p)]
        if not parts:
            return empty_columns(specs)
        out = Columns(np.concatenate([p.index for p in parts]))
        for spec in specs:
            cols = [p.columns[spec.path] for p in parts]
            valid = np.concatenate([c.valid for c in cols if c.valid is not None]) if spec.nullable else None
            values = np.concatenate([c.values for c in cols])
            offsets = None
            if cols[0].offsets is not None:
                pieces = [np.zeros(1, dtype=np.int64)]
                base = 0
                for c in cols:
                    assert c.offsets is not None
                    pieces.append(c.offsets[1:] + base)
                    base += int(c.offsets[-1])
                offsets = np.concatenate(pieces)
            finite = np.concatenate([c.finite for c in cols if c.finite is not None]) if real_column(spec) else None
            out.columns[spec.path] = Column(spec, values, offsets, valid, finite)
        return out


def real_column(spec: ColumnSpec) -> bool:
    return (spec.items if spec.kind == "array" else spec.kind) in ("float", "double")


def empty_columns(specs: Sequence[ColumnSpec]) -> Columns:
    out = Columns(np.zeros(0, dtype=np.int64))
    for spec in specs:
        variable = spec.kind in ("string", "bytes", "fixed", "array")
        out.columns[spec.path] = Column(spec, np.zeros(0, dtype=spec.dtype),
                                        np.zeros(1, dtype=np.int64) if variable else None,
                                        np.zeros(0, dtype=bool) if spec.nullable else None,
                                        np.zeros(0, dtype=bool) if real_column(spec) else None)
    return out


