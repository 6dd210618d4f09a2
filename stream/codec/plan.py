"""Avro schema resolution into field plans.

A *reader schema* says what the worker needs (the record layout a model's inputs and copied fields are bound
to); a *writer schema* is what a producer used, found by the id in each record's header. `resolve` matches the
two by the Avro specification's resolution rules (fields by name or alias, in any order; fields the writer lacks
take the reader's default; fields the reader lacks are skipped; int -> long -> float -> double and string <->
bytes promotion; enum symbols by name; unions branch by branch) and builds a `FieldPlan`: one operation per
writer field, each reading its bytes into a reader column (`stream.codec.columns`) or skipping them. A plan is
built once per writer schema id and run over whole batches: by the reference decoder in Python
(`stream.codec.reference`) or, flattened (`stream.codec.program`), by the C extension.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stream.codec.columns import ColumnSpec, short_name, type_name
from stream.errors import ConfigError

# writer type -> the reader types it may be read as (the specification's promotions)
PROMOTIONS: dict[str, tuple[str, ...]] = {
    "null": ("null",), "boolean": ("boolean",), "int": ("int", "long", "float", "double"),
    "long": ("long", "float", "double"), "float": ("float", "double"), "double": ("double",),
    "string": ("string", "bytes"), "bytes": ("bytes", "string"),
}



# A record's work budget, the same in C (stream/codec/_nativecodec.c) and in the reference decoder: the items of
# arrays and maps that take no bytes on the wire (nulls, empty records; a 3-byte block can claim 65,536 of them)
# are at most ZERO_SIZE_ITEMS_BASE + ZERO_SIZE_ITEMS_PER_BYTE per byte of the record; a record over it is
# dead-lettered as ``over-budget``. (Items that take bytes are bounded by the record's bytes already.)
ZERO_SIZE_ITEMS_BASE = 1024
ZERO_SIZE_ITEMS_PER_BYTE = 8


def zero_size_budget(record_bytes: int) -> int:
    return ZERO_SIZE_ITEMS_BASE + ZERO_SIZE_ITEMS_PER_BYTE * record_bytes


def depth(op: Op) -> int:
    """How many operations deep the plan nests (a record of scalars: 2)."""
    children = (*op.fields, *op.branches, *([op.items] if op.items is not None else []))
    return 1 + max((depth(c) for c in children), default=0)


class SchemaMismatch(ConfigError):
    """The writer schema cannot be resolved to the reader schema (one line per reason)."""


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
    return writer["name"] in names or short_name(writer["name"]) in {short_name(n) for n in names}


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
    if not _default_fits(t, value):
        problems.append(f"{path}: default {value!r} is not a value of {t if isinstance(t, str) else kind}")
        return
    if path in index:
        out.append((index[path], None if kind == "null" else _default_value(t, value)))


_INT_RANGES = {"int": 2**31, "long": 2**63}


def _default_fits(t: Any, value: Any) -> bool:
    """Whether a JSON default is a value of type ``t`` (the Avro specification's encoding of defaults): a schema
    whose default is not is refused when its plan is built, never met while a record decodes."""
    kind = type_name(t)
    if isinstance(t, list):
        return bool(t) and _default_fits(t[0], value)
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind in _INT_RANGES:
        return isinstance(value, int) and not isinstance(value, bool) and \
            -_INT_RANGES[kind] <= value < _INT_RANGES[kind]
    if kind in ("float", "double"):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "string":
        return isinstance(value, str)
    if kind in ("bytes", "fixed"):
        return isinstance(value, str) and all(ord(c) < 256 for c in value) and (
            kind == "bytes" or len(value) == t["size"])
    if kind == "enum":
        return value in t["symbols"]
    if kind == "array":
        return isinstance(value, list) and all(_default_fits(t["items"], v) for v in value)
    if kind == "map":
        return isinstance(value, Mapping) and all(isinstance(k, str) and _default_fits(t["values"], v)
                                                  for k, v in value.items())
    if kind == "record":
        return isinstance(value, Mapping)
    return True


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


def min_size(op: Op) -> int:
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
        return sum(min_size(f) for f in op.fields)
    return 1
