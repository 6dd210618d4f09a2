"""The reference decoder: a field plan run record by record in Python, into columns. The C interpreter
(`stream.codec.program`, stream/codec/_nativecodec.c) must give the same answers; the tests hold the two, and fastavro,
to that, and the worker uses this one where the extension is not built."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
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
    ZERO_SIZE_ITEMS_BASE,
    ZERO_SIZE_ITEMS_PER_BYTE,
    FieldPlan,
    Op,
    min_size,
    zero_size_budget,
)
from stream.errors import DecodeError

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
            return Column(spec, values, None, valid, np.isfinite(values) if real_column(spec) else None)
        offsets = np.zeros(len(self.ends) + 1, dtype=np.int64)
        offsets[1:] = self.ends
        finite = None
        if spec.kind == "array":
            values = np.asarray(self.values, dtype=spec.dtype)
            if real_column(spec):
                ok = np.isfinite(values)
                finite = np.asarray([bool(ok[a:b].all()) for a, b in itertools.pairwise(offsets)],
                                    dtype=bool)
        else:
            values = np.frombuffer(bytes(self.data), dtype=np.uint8)
        return Column(spec, values, offsets, valid, finite)


class _Reader:
    __slots__ = ("buf", "pos", "zero_items_left")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0
        self.zero_items_left = zero_size_budget(len(buf))  # the record's work budget

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
            least = min_size(op.items)
            if least and count > (len(r.buf) - r.pos) // least:
                raise DecodeError("corrupt-avro", "a block count larger than the record")
            if not least:
                if count > r.zero_items_left:
                    raise DecodeError("over-budget", "more items that take no bytes than the record's work budget "
                                                     f"({ZERO_SIZE_ITEMS_BASE} + {ZERO_SIZE_ITEMS_PER_BYTE} a byte)")
                r.zero_items_left -= count
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


