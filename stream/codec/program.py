"""A field plan flattened into an int32 program for the C interpreter (stream/codec/_nativecodec.c, ``run_plan``),
and the call that runs it over a batch into columns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stream.codec.columns import Column, Columns, ColumnSpec, real_column
from stream.codec.plan import (
    ARRAY,
    BOOLEAN,
    BYTES,
    DOUBLE,
    ENUM,
    FAIL,
    FIXED,
    FLOAT,
    INT,
    LONG,
    MAP,
    NULL,
    RECORD,
    STRING,
    UNION,
    FieldPlan,
    Op,
    min_size,
)
from stream.errors import DecodeError

# -- the native decoder ----------------------------------------------------------------------------------------

_STORAGE = {"boolean": 0, "int": 1, "enum": 1, "long": 2, "float": 3, "double": 4}
_REASONS = {1: "corrupt-avro", 2: "incompatible-schema", 3: "over-budget"}  # run_plan's reason codes
_BYTE_STORAGE = 5


def _storage(spec: ColumnSpec) -> int:
    if spec.kind == "array":
        assert spec.items is not None
        return _STORAGE[spec.items]
    return _STORAGE.get(spec.kind, _BYTE_STORAGE)


def _variable(spec: ColumnSpec) -> bool:
    return spec.kind in ("string", "bytes", "fixed", "array")


@dataclass(frozen=True)
class _Layout:
    """How ``run_native`` allocates and hands over one column."""

    spec: ColumnSpec
    storage: int
    variable: bool
    dtype: np.dtype[Any]
    real: bool
    item_bytes: int  # the fewest wire bytes one stored item takes (bounds a variable column's capacity)
    default_items: int  # items a record's reader defaults can add (outside arrays; those inside grow the room)


@dataclass(frozen=True)
class Program:
    """A plan flattened for the C interpreter (stream/codec/_nativecodec.c, ``run_plan``)."""

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
    added = _default_items(plan.root, plan.columns, {})
    layouts = tuple(_Layout(spec, _storage(spec), _variable(spec), spec.dtype, real_column(spec),
                            max(1, least.get(i, 1)) if spec.kind == "array" else 1, added.get(i, 0))
                    for i, spec in enumerate(plan.columns))
    return Program(np.asarray(out, dtype=np.int32), defaults, fails, layouts)


def _default_items(op: Op, specs: Sequence[ColumnSpec], out: dict[int, int]) -> dict[int, int]:
    """Variable column -> the most items one record's reader defaults outside arrays and maps can write to it (a
    default of 300 characters in every row needs room the records' own bytes do not give)."""
    for col, value in op.defaults:
        if value is not None and _variable(specs[col]):
            out[col] = out.get(col, 0) + (len(value) if specs[col].kind != "array" else len(list(value)))
    for child in (*op.fields, *op.branches):
        _default_items(child, specs, out)
    return out


def _least_item_bytes(op: Op, out: dict[int, int]) -> dict[int, int]:
    """Array column -> the fewest wire bytes one of its items takes (a column with a default array: 1)."""
    if op.code == ARRAY and op.col >= 0 and op.items is not None:
        out[op.col] = min(out.get(op.col, 1 << 30), min_size(op.items) or 1)
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
        out += ([ARRAY, op.col] if code == ARRAY else [MAP]) + [min_size(op.items), len(item), *item]
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
    index = np.empty(n, dtype=np.int64)
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    assert len(program.layouts) == len(specs), "a program of another plan"
    room = 1  # a variable column's capacity, as a multiple of what the records' bytes can hold
    while True:
        columns: list[Column] = []
        args = []
        for layout in program.layouts:
            spec = layout.spec
            capacity = room * (total_bytes // layout.item_bytes + 1 + n * layout.default_items)
            values = np.empty(capacity if layout.variable else n, dtype=layout.dtype)
            valid = np.empty(n, dtype=np.uint8) if spec.nullable else None
            offsets = np.empty(n + 1, dtype=np.int64) if layout.variable else None
            finite = np.empty(n, dtype=np.uint8) if layout.real else None
            columns.append(Column(spec, values, offsets, valid, finite))
            args.append((layout.storage, layout.variable, spec.nullable, values, valid, offsets, finite))
        taken, raw_errors, short = native.run_plan(program.code, program.defaults, source, rows, skip, args, index)
        if not short:
            break
        # Reader defaults (a long default string in every row) or items that take no bytes outgrew the records'
        # bytes: again, with twice the room. A record's work budget bounds what it can need.
        room *= 2
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
        errors.append((int(position), DecodeError(_REASONS[reason], message)))
    return out, errors
