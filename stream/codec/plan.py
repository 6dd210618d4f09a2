"""Avro schema resolution into field plans, and the columns a plan decodes a batch into.

A *reader schema* says what the worker needs (the record layout a model's inputs and copied fields are bound
to); a *writer schema* is what a producer used, found by the id in each record's header. `resolve` matches the
two by the Avro specification's resolution rules (fields by name or alias, in any order; fields the writer lacks
take the reader's default; fields the reader lacks are skipped; int -> long -> float -> double and string <->
bytes promotion; enum symbols by name; unions branch by branch) and builds a `FieldPlan`: one operation per
writer field, each reading its bytes into a reader column or skipping them. A plan is built once per writer
schema id and run over whole batches (`decode_columns` here; the C extension runs the same program).

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

import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from stream.errors import ConfigError, DecodeError

PRIMITIVES = ("null", "boolean", "int", "long", "float", "double", "bytes", "string")
SCALARS = {"boolean": np.bool_, "int": np.int32, "long": np.int64, "float": np.float32, "double": np.float64}
NUMERIC = ("boolean", "int", "long", "float", "double")
# writer type -> the reader types it may be read as (the specification's promotions)
PROMOTIONS: dict[str, tuple[str, ...]] = {
    "null": ("null",), "boolean": ("boolean",), "int": ("int", "long", "float", "double"),
    "long": ("long", "float", "double"), "float": ("float", "double"), "double": ("double",),
    "string": ("string", "bytes"), "bytes": ("bytes", "string"),
}


MAX_ZERO_SIZE_ITEMS = 65536  # items of an array or map whose values take no bytes (nulls), per block


class SchemaMismatch(ConfigError):
    """The writer schema cannot be resolved to the reader schema (one line per reason)."""


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


def _short(name: str) -> str:
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


# -- the plan --------------------------------------------------------------------------------------------------

# Operations, one per writer value. ``col`` is the reader column written (-1: read and skip).
NULL, BOOLEAN, INT, LONG, FLOAT, DOUBLE, BYTES, STRING, FIXED, ENUM, ARRAY, MAP, UNION, RECORD, FAIL = range(15)
_OP_OF = {"null": NULL, "boolean": BOOLEAN, "int": INT, "long": LONG, "float": FLOAT, "double": DOUBLE,
          "bytes": BYTES, "string": STRING, "fixed": FIXED, "enum": ENUM, "array": ARRAY, "map": MAP,
          "union": UNION, "record": RECORD}


@dataclass
class Op:
    code: int
    col: int = -1
    to: str = ""  # the reader type a promoted value is stored as
    size: int = 0  # FIXED: bytes
    table: tuple[int, ...] = ()  # ENUM: writer symbol index -> reader code (-1: not in the reader, an error)
    items: Op | None = None  # ARRAY items, MAP values
    branches: tuple[Op, ...] = ()  # UNION: one per writer branch
    fields: tuple[Op, ...] = ()  # RECORD: the writer's fields in order, then defaults
    nulls: tuple[int, ...] = ()  # columns set null (valid False, empty value) when this op runs (a null branch)
    defaults: tuple[tuple[int, Any], ...] = ()  # RECORD: (column, value) for reader fields the writer lacks
    why: str = ""  # FAIL: what the record holds that the reader cannot take


@dataclass
class FieldPlan:
    """How records of one writer schema become rows of the reader's columns."""

    writer_id: int
    columns: tuple[ColumnSpec, ...]
    root: Op

    def decode(self, payloads: Sequence[bytes]) -> tuple[Columns, list[tuple[int, DecodeError]]]:
        return decode_columns(self, payloads)


def resolve(writer: Any, reader: Any, columns: Sequence[ColumnSpec], writer_id: int = -1) -> FieldPlan:
    """The plan reading records of ``writer`` into ``columns`` of ``reader`` (both normalised records);
    SchemaMismatch naming every field that cannot be resolved."""
    index = {c.path: i for i, c in enumerate(columns)}
    problems: list[str] = []
    root = _resolve_record(writer, reader, "", index, columns, problems)
    if problems:
        raise SchemaMismatch("; ".join(problems))
    return FieldPlan(writer_id, tuple(columns), root)


def _names_match(writer: Mapping[str, Any], reader: Mapping[str, Any]) -> bool:
    names = {reader["name"], *reader.get("aliases", ())}
    return writer["name"] in names or _short(writer["name"]) in {_short(n) for n in names}


def _resolve_record(writer: Any, reader: Any, prefix: str, index: Mapping[str, int], columns: Sequence[ColumnSpec],
                    problems: list[str]) -> Op:
    by_name: dict[str, dict[str, Any]] = {}
    for rf in reader["fields"]:
        by_name[rf["name"]] = rf
    taken: set[str] = set()
    fields: list[Op] = []
    for wf in writer["fields"]:
        rf = by_name.get(wf["name"])
        if rf is None:  # a reader alias naming this writer field
            rf = next((r for r in reader["fields"] if wf["name"] in r.get("aliases", ())), None)
        if rf is None or rf["name"] in taken:
            fields.append(_skip(wf["type"]))
            continue
        taken.add(rf["name"])
        fields.append(_resolve(wf["type"], rf["type"], f"{prefix}{rf['name']}", index, columns, problems))
    defaults: list[tuple[int, Any]] = []
    for rf in reader["fields"]:
        if rf["name"] in taken:
            continue
        path = f"{prefix}{rf['name']}"
        if "default" not in rf:
            problems.append(f"{path}: the writer has no such field and the reader gives it no default")
            continue
        _default_values(rf["type"], rf["default"], path, index, defaults, problems)
    return Op(RECORD, fields=tuple(fields), defaults=tuple(defaults))


def _default_values(t: Any, value: Any, path: str, index: Mapping[str, int], out: list[tuple[int, Any]],
                    problems: list[str]) -> None:
    """(column, value) pairs for a reader field filled from its default (a record's default fills its fields)."""
    if isinstance(t, list):  # a union's default is of its first branch
        t = t[0]
    kind = type_name(t)
    if kind == "record":
        if not isinstance(value, Mapping):
            problems.append(f"{path}: default {value!r} is not a record")
            return
        for f in t["fields"]:
            if f["name"] in value:
                v = value[f["name"]]
            elif "default" in f:
                v = f["default"]
            else:
                problems.append(f"{path}.{f['name']}: no default")
                continue
            _default_values(f["type"], v, f"{path}.{f['name']}", index, out, problems)
        return
    if path in index:
        out.append((index[path], None if kind == "null" else _default_value(t, value)))


def _default_value(t: Any, value: Any) -> Any:
    kind = type_name(t)
    if kind == "enum":
        return t["symbols"].index(value)
    if kind in ("bytes", "fixed"):
        return value.encode("latin-1")  # JSON defaults of bytes are code points 0-255
    if kind == "string":
        return value.encode("utf-8")
    return value


def _col(path: str, index: Mapping[str, int]) -> int:
    return index.get(path, -1)


def _cols_under(path: str, index: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(i for p, i in index.items() if p == path or p.startswith(path + "."))


def _resolve(w: Any, r: Any, path: str, index: Mapping[str, int], columns: Sequence[ColumnSpec],
             problems: list[str]) -> Op:
    wk, rk = type_name(w), type_name(r)
    if wk == "union":
        branches = []
        for wb in w:
            try:
                sub: list[str] = []
                op = _resolve(wb, r, path, index, columns, sub)
                if sub:
                    raise SchemaMismatch("; ".join(sub))
                branches.append(op)
            except SchemaMismatch as exc:  # decided per record: only records on this branch fail
                branches.append(Op(FAIL, why=f"{path}: a {type_name(wb)} value cannot be read as {rk} ({exc})"))
        if all(b.code == FAIL for b in branches):
            problems.append(f"{path}: no branch of the writer's union can be read as {rk}")
        return Op(UNION, branches=tuple(branches))
    if rk == "union":
        for rb in r:  # the first reader branch that the writer's type matches
            if type_name(rb) == "null" and wk == "null":
                return Op(NULL, nulls=_cols_under(path, index))
            if _matches(w, rb):
                return _resolve(w, rb, path, index, columns, problems)
        problems.append(f"{path}: the writer's {wk} matches no branch of the reader's union")
        return _skip(w)
    if wk == "null" and rk == "null":
        return Op(NULL)
    if wk == "record" and rk == "record":
        if not _names_match(w, r):
            problems.append(f"{path}: record {w['name']} is not {r['name']}")
            return _skip(w)
        return _resolve_record(w, r, path + ".", index, columns, problems)
    if wk == "enum" and rk == "enum":
        if not _names_match(w, r):
            problems.append(f"{path}: enum {w['name']} is not {r['name']}")
            return _skip(w)
        symbols = r["symbols"]
        fallback = symbols.index(r["default"]) if r.get("default") in symbols else -1
        table = tuple(symbols.index(s) if s in symbols else fallback for s in w["symbols"])
        return Op(ENUM, col=_col(path, index), table=table)
    if wk == "fixed" and rk == "fixed":
        if not _names_match(w, r) or w["size"] != r["size"]:
            problems.append(f"{path}: fixed {w['name']}[{w['size']}] is not {r['name']}[{r['size']}]")
            return _skip(w)
        return Op(FIXED, col=_col(path, index), size=w["size"])
    if wk == "array" and rk == "array":
        # The items write no column of their own: each returns its value, and the array's column takes them.
        items = _resolve(w["items"], r["items"], path + "[]", {}, columns, problems)
        return Op(ARRAY, col=_col(path, index), items=items)
    if wk == "map" and rk == "map":
        return Op(MAP, items=_resolve(w["values"], r["values"], path + "{}", {}, columns, problems))
    if wk in PROMOTIONS and rk in PROMOTIONS[wk]:
        return Op(_OP_OF[wk], col=_col(path, index), to=rk)
    problems.append(f"{path}: the writer's {wk} cannot be read as {rk}")
    return _skip(w)


def _matches(w: Any, r: Any) -> bool:
    """Whether a (non-union) writer type may resolve to reader branch ``r`` (the specification's first-match rule:
    same named type, or a primitive promotion)."""
    wk, rk = type_name(w), type_name(r)
    if wk in ("record", "enum", "fixed"):
        return wk == rk and _names_match(w, r)
    if wk in ("array", "map"):
        return wk == rk
    return wk in PROMOTIONS and rk in PROMOTIONS[wk]


def _skip(t: Any) -> Op:
    kind = type_name(t)
    if kind == "union":
        return Op(UNION, branches=tuple(_skip(b) for b in t))
    if kind == "record":
        return Op(RECORD, fields=tuple(_skip(f["type"]) for f in t["fields"]))
    if kind == "array":
        return Op(ARRAY, items=_skip(t["items"]))
    if kind == "map":
        return Op(MAP, items=_skip(t["values"]))
    if kind == "fixed":
        return Op(FIXED, size=t["size"])
    if kind == "enum":
        return Op(ENUM, table=tuple(range(len(t["symbols"]))))
    return Op(_OP_OF[kind])


# -- decoded columns -------------------------------------------------------------------------------------------

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
            finite = np.concatenate([c.finite for c in cols if c.finite is not None]) if _real(spec) else None
            out.columns[spec.path] = Column(spec, values, offsets, valid, finite)
        return out


def _real(spec: ColumnSpec) -> bool:
    return (spec.items if spec.kind == "array" else spec.kind) in ("float", "double")


def empty_columns(specs: Sequence[ColumnSpec]) -> Columns:
    out = Columns(np.zeros(0, dtype=np.int64))
    for spec in specs:
        variable = spec.kind in ("string", "bytes", "fixed", "array")
        out.columns[spec.path] = Column(spec, np.zeros(0, dtype=spec.dtype),
                                        np.zeros(1, dtype=np.int64) if variable else None,
                                        np.zeros(0, dtype=bool) if spec.nullable else None,
                                        np.zeros(0, dtype=bool) if _real(spec) else None)
    return out


# -- the reference decoder -------------------------------------------------------------------------------------

class _Builder:
    """Column values appended row by row (the reference decoder; the C one writes into arrays)."""

    def __init__(self, spec: ColumnSpec) -> None:
        self.spec = spec
        self.variable = spec.kind in ("string", "bytes", "fixed", "array")
        self.values: list[Any] = []
        self.data = bytearray()
        self.ends: list[int] = []
        self.valid: list[bool] = []
        self.row_value: Any = None
        self.row_null = False
        self.written = False

    def begin(self) -> None:
        self.row_value, self.row_null, self.written = None, False, False

    def commit(self) -> None:
        if not self.written:  # a null branch or an absent default never wrote it: the empty value
            self.row_null = True
        if self.variable:
            if self.spec.kind == "array":
                self.values.extend(self.row_value or [])
                self.ends.append(len(self.values))
            else:
                self.data += self.row_value or b""
                self.ends.append(len(self.data))
        else:
            self.values.append(0 if self.row_value is None else self.row_value)
        self.valid.append(not self.row_null)

    def column(self) -> Column:
        spec = self.spec
        valid = np.asarray(self.valid, dtype=bool) if spec.nullable else None
        if not self.variable:
            values = np.asarray(self.values, dtype=spec.dtype)
            return Column(spec, values, None, valid, np.isfinite(values) if _real(spec) else None)
        offsets = np.zeros(len(self.ends) + 1, dtype=np.int64)
        offsets[1:] = self.ends
        finite = None
        if spec.kind == "array":
            values = np.asarray(self.values, dtype=spec.dtype)
            if _real(spec):
                ok = np.isfinite(values)
                finite = np.asarray([bool(ok[a:b].all()) for a, b in itertools.pairwise(offsets)],
                                    dtype=bool)
        else:
            values = np.frombuffer(bytes(self.data), dtype=np.uint8)
        return Column(spec, values, offsets, valid, finite)


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def long(self) -> int:
        shift = raw = 0
        buf = self.buf
        while True:
            if self.pos >= len(buf):
                raise DecodeError("corrupt-avro", "the record ends inside a varint")
            b = buf[self.pos]
            self.pos += 1
            if shift == 63 and b > 1:
                raise DecodeError("corrupt-avro", "a varint longer than 64 bits")
            raw |= (b & 0x7F) << shift
            if b < 0x80:
                return (raw >> 1) ^ -(raw & 1)
            shift += 7

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise DecodeError("corrupt-avro", f"{n} bytes wanted, {len(self.buf) - self.pos} left")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out


_FLOAT = np.dtype("<f4")
_DOUBLE = np.dtype("<f8")


def _convert(value: Any, to: str) -> Any:
    if to == "int":
        if not -(2**31) <= value < 2**31:
            raise DecodeError("corrupt-avro", f"int {value} out of range")
        return value
    if to in ("float", "double") and not isinstance(value, float):
        return float(value)
    return value


def _run(op: Op, r: _Reader, b: list[_Builder]) -> Any:
    """Run one operation; returns the value read (for array items), writing columns as it goes."""
    code = op.code
    if code == NULL:
        for c in op.nulls:
            b[c].row_null, b[c].written = True, True
        return None
    if code == RECORD:
        for f in op.fields:
            _run(f, r, b)
        for c, default in op.defaults:
            if default is None:
                b[c].row_null = True
            else:
                b[c].row_value = default
            b[c].written = True
        return None
    if code == BOOLEAN:
        raw = r.take(1)[0]
        if raw > 1:
            raise DecodeError("corrupt-avro", f"boolean byte {raw}")
        value: Any = bool(raw)
    elif code in (INT, LONG):
        value = _convert(r.long(), "int" if code == INT else "long")
        value = _convert(value, op.to) if op.to else value
    elif code == FLOAT:  # kept a float32 unless promoted: its bits as written (a signalling NaN stays one)
        value = np.frombuffer(r.take(4), dtype=_FLOAT)[0]
        if op.to == "double":
            value = float(value)
    elif code == DOUBLE:
        value = float(np.frombuffer(r.take(8), dtype=_DOUBLE)[0])
    elif code in (BYTES, STRING):
        value = r.take(r.long())
        if op.col >= 0 and (code == STRING or op.to == "string"):
            try:
                value.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DecodeError("corrupt-avro", f"a string that is not UTF-8: {exc}") from None
    elif code == FIXED:
        value = r.take(op.size)
    elif code == ENUM:
        i = r.long()
        if not 0 <= i < len(op.table):
            raise DecodeError("corrupt-avro", f"enum index {i} of {len(op.table)} symbols")
        value = op.table[i]
        if value < 0:
            raise DecodeError("incompatible-schema", "an enum symbol the reader does not have (and no default)")
    elif code in (ARRAY, MAP):
        assert op.items is not None
        items: list[Any] = []
        while True:
            count = r.long()
            if count == 0:
                break
            if count < 0:
                count = -count
                r.long()  # the block's size in bytes
            least = _min_size(op.items)
            if (least and count > (len(r.buf) - r.pos) // least) or (not least and count > MAX_ZERO_SIZE_ITEMS):
                raise DecodeError("corrupt-avro", "a block count larger than the record")
            for _ in range(count):
                if code == MAP:
                    r.take(r.long())
                items.append(_run(op.items, r, b))
        value = items
    elif code == UNION:
        i = r.long()
        if not 0 <= i < len(op.branches):
            raise DecodeError("corrupt-avro", f"union branch {i} of {len(op.branches)}")
        return _run(op.branches[i], r, b)
    elif code == FAIL:
        raise DecodeError("incompatible-schema", op.why)
    else:  # pragma: no cover - every code is handled above
        raise AssertionError(code)
    if op.col >= 0:
        b[op.col].row_value, b[op.col].written = value, True
    return value


def decode_columns(plan: FieldPlan, payloads: Sequence[bytes]) -> tuple[Columns, list[tuple[int, DecodeError]]]:
    """Decode Avro record bodies (no header) with ``plan``: the reference implementation, record by record."""
    builders = [_Builder(spec) for spec in plan.columns]
    index: list[int] = []
    errors: list[tuple[int, DecodeError]] = []
    for i, payload in enumerate(payloads):
        for builder in builders:
            builder.begin()
        r = _Reader(payload)
        try:
            _run(plan.root, r, builders)
            if r.pos != len(payload):
                raise DecodeError("corrupt-avro", f"{len(payload) - r.pos} trailing bytes after the record")
            for builder in builders:
                if not builder.written and not builder.spec.nullable:
                    raise DecodeError("incompatible-schema", f"{builder.spec.path} is null")
                if builder.row_null and not builder.spec.nullable:
                    raise DecodeError("incompatible-schema", f"{builder.spec.path} is null")
        except DecodeError as exc:
            errors.append((i, exc))
            continue
        for builder in builders:
            builder.commit()
        index.append(i)
    return Columns(np.asarray(index, dtype=np.int64), {s.path: bld.column() for s, bld in
                                                      zip(plan.columns, builders, strict=True)}), errors


# -- the native decoder ----------------------------------------------------------------------------------------

_STORAGE = {"boolean": 0, "int": 1, "enum": 1, "long": 2, "float": 3, "double": 4}
_BYTE_STORAGE = 5


def _storage(spec: ColumnSpec) -> int:
    if spec.kind == "array":
        assert spec.items is not None
        return _STORAGE[spec.items]
    return _STORAGE.get(spec.kind, _BYTE_STORAGE)


def _variable(spec: ColumnSpec) -> bool:
    return spec.kind in ("string", "bytes", "fixed", "array")


def _min_size(op: Op) -> int:
    """The fewest bytes a value of this operation takes on the wire."""
    if op.code in (NULL, FAIL):
        return 0
    if op.code == FLOAT:
        return 4
    if op.code == DOUBLE:
        return 8
    if op.code == FIXED:
        return op.size
    if op.code == RECORD:
        return sum(_min_size(f) for f in op.fields)
    return 1


@dataclass(frozen=True)
class _Layout:
    """How ``run_native`` allocates and hands over one column."""

    spec: ColumnSpec
    storage: int
    variable: bool
    dtype: np.dtype[Any]
    real: bool
    item_bytes: int  # the fewest wire bytes one stored item takes (bounds a variable column's capacity)


@dataclass(frozen=True)
class Program:
    """A plan flattened for the C interpreter (stream/_nativecodec.c, ``run_plan``)."""

    code: np.ndarray  # int32
    defaults: list[bytes | None]  # the reader's default values, as their columns store them
    fails: list[str]  # why a FAIL branch fails
    layouts: tuple[_Layout, ...] = ()


def flatten(plan: FieldPlan) -> Program:
    out: list[int] = []
    defaults: list[bytes | None] = []
    fails: list[str] = []
    _flatten(plan.root, plan.columns, out, defaults, fails, -1)
    least = _least_item_bytes(plan.root, {})
    layouts = tuple(_Layout(spec, _storage(spec), _variable(spec), spec.dtype, _real(spec),
                            max(1, least.get(i, 1)) if spec.kind == "array" else 1)
                    for i, spec in enumerate(plan.columns))
    return Program(np.asarray(out, dtype=np.int32), defaults, fails, layouts)


def _least_item_bytes(op: Op, out: dict[int, int]) -> dict[int, int]:
    """Array column -> the fewest wire bytes one of its items takes (a column with a default array: 1)."""
    if op.code == ARRAY and op.col >= 0 and op.items is not None:
        out[op.col] = min(out.get(op.col, 1 << 30), _min_size(op.items) or 1)
    for child in (*op.fields, *op.branches, *([op.items] if op.items is not None else [])):
        _least_item_bytes(child, out)
    for col, _ in op.defaults:
        out[col] = 1
    return out


def _encode_default(spec: ColumnSpec, value: Any) -> bytes | None:
    if value is None:
        return None
    if spec.kind in ("string", "bytes", "fixed"):
        return bytes(value)
    return np.asarray(value, dtype=spec.dtype).tobytes()


def _flatten(op: Op, specs: Sequence[ColumnSpec], out: list[int], defaults: list[bytes | None], fails: list[str],
             item_col: int) -> None:
    col = op.col if item_col < 0 else item_col
    code = op.code
    if code == NULL:
        out += [NULL, len(op.nulls), *op.nulls]
    elif code in (BOOLEAN, INT, LONG, FLOAT, DOUBLE, STRING):
        out += [code, col]
    elif code == BYTES:
        out += [BYTES, col, int(op.to == "string")]
    elif code == FIXED:
        out += [FIXED, col, op.size]
    elif code == ENUM:
        out += [ENUM, col, len(op.table), *op.table]
    elif code in (ARRAY, MAP):
        assert op.items is not None
        item: list[int] = []
        _flatten(op.items, specs, item, defaults, fails, op.col if code == ARRAY and op.col >= 0 else -1)
        out += ([ARRAY, op.col] if code == ARRAY else [MAP]) + [_min_size(op.items), len(item), *item]
    elif code == UNION:
        out += [UNION, len(op.branches)]
        for branch in op.branches:
            part: list[int] = []
            _flatten(branch, specs, part, defaults, fails, item_col)
            out += [len(part), *part]
    elif code == RECORD:
        out += [RECORD, len(op.fields)]
        for f in op.fields:
            _flatten(f, specs, out, defaults, fails, -1)
        out.append(len(op.defaults))
        for c, value in op.defaults:
            out += [c, len(defaults)]
            defaults.append(_encode_default(specs[c], value))
    elif code == FAIL:
        out += [FAIL, len(fails)]
        fails.append(op.why)
    else:  # pragma: no cover
        raise AssertionError(code)


def run_native(native: Any, program: Program, specs: Sequence[ColumnSpec], source: Any, rows: np.ndarray,
               skip: int, total_bytes: int) -> tuple[Columns, list[tuple[int, DecodeError]]]:
    """Run ``program`` in C over the records at raw positions ``rows`` of ``source`` (a list of bytes, or
    ``(buffer, starts, lengths)``), each read from byte ``skip``; ``total_bytes`` bounds what a variable column
    can receive (the selected records' bytes)."""
    n = len(rows)
    columns: list[Column] = []
    args = []
    assert len(program.layouts) == len(specs), "a program of another plan"
    for layout in program.layouts:
        spec = layout.spec
        values = np.empty(total_bytes // layout.item_bytes + 1 if layout.variable else n, dtype=layout.dtype)
        valid = np.empty(n, dtype=np.uint8) if spec.nullable else None
        offsets = np.empty(n + 1, dtype=np.int64) if layout.variable else None
        finite = np.empty(n, dtype=np.uint8) if layout.real else None
        columns.append(Column(spec, values, offsets, valid, finite))
        args.append((layout.storage, layout.variable, spec.nullable, values, valid, offsets, finite))
    index = np.empty(n, dtype=np.int64)
    taken, raw_errors = native.run_plan(program.code, program.defaults, source,
                                        np.ascontiguousarray(rows, dtype=np.int64), skip, args, index)
    out = Columns(index[:taken])
    for column in columns:
        if column.offsets is not None:
            column.offsets = column.offsets[: taken + 1]
            column.values = column.values[: int(column.offsets[-1])]
        else:
            column.values = column.values[:taken]
        if column.valid is not None:
            column.valid = column.valid[:taken].view(bool)
        if column.finite is not None:
            column.finite = column.finite[:taken].view(bool)
        out.columns[column.spec.path] = column
    errors = []
    for position, reason, what in raw_errors:
        message = program.fails[what] if isinstance(what, int) else what
        errors.append((int(position), DecodeError("corrupt-avro" if reason == 1 else "incompatible-schema", message)))
    return out, errors
