"""How decoded columns become a model's inputs.

A handler declares its inputs (`stream.models.InputSpec`: a name, a dtype, a per-row shape) and outputs
(`stream.models.OutputSpec`). Each
input is bound to a column of the reader schema: the column of the same name, or the one ``--input-map
name=field.path`` names. `InputBinder` checks the bindings once at start-up (one line per mismatch) and then turns
every decoded batch into the handler's arrays, sending the rows it cannot take to the dead-letter topic: a null
where the model needs a value (``null-input``), a vector of the wrong length (``shape``), NaN or infinity in a
float input (``non-finite``), an empty or blank string where the input is declared ``nonempty`` (``empty-input``).
A string that is not UTF-8 never gets here: the decoder dead-letters its record (``corrupt-avro``).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from stream.codec.columns import Column, Columns, ColumnSpec, reader_columns
from stream.codec.decoder import ColumnDecoder
from stream.codec.registry import SchemaSource, WriterSchema
from stream.errors import ConfigError, DecodeError
from stream.models.spec import InputSpec
from stream.models.text_buffer import TextBuffer

log = logging.getLogger(__name__)

# input dtype -> the column types that convert to it without loss of meaning
_FROM: dict[str, tuple[str, ...]] = {
    "float32": ("float", "double", "int", "long", "boolean"),
    "float64": ("float", "double", "int", "long", "boolean"),
    "int32": ("int", "boolean", "enum"),
    "int64": ("int", "long", "boolean", "enum"),
    "bool": ("boolean",),
    "string": ("string",),
    "bytes": ("bytes", "fixed", "string"),
}

def parse_input_map(items: Sequence[str] | str | None) -> dict[str, str]:
    """``["features=payload.vector", ...]`` (or one comma-separated string) -> {input name: column path}."""
    if items is None:
        return {}
    if isinstance(items, str):
        items = [p for p in items.split(",") if p.strip()]
    out: dict[str, str] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise ConfigError(f"--input-map {item!r}: expected INPUT=FIELD (a dotted path for a nested field)")
        if name.strip() in out:
            raise ConfigError(f"--input-map: input {name.strip()!r} mapped twice")
        out[name.strip()] = path.strip()
    return out


@dataclass(frozen=True)
class _Binding:
    spec: InputSpec
    column: ColumnSpec


class InputBinder:
    """Checks a handler's inputs against the reader schema's columns, then binds decoded batches to them."""

    def __init__(self, inputs: Sequence[InputSpec], columns: Sequence[ColumnSpec],
                 input_map: Mapping[str, str] | None = None, schema: str = "the input schema") -> None:
        by_path = {c.path: c for c in columns}
        input_map = dict(input_map or {})
        names = {i.name for i in inputs}
        problems = [f"--input-map names {name!r}, which is not an input of the model (its inputs: "
                    f"{', '.join(sorted(names)) or 'none'})" for name in input_map if name not in names]
        bindings: list[_Binding] = []
        for spec in inputs:
            path = input_map.get(spec.name, spec.name)
            column = by_path.get(path)
            if column is None:
                problems.append(f"input {spec.name} ({spec.describe()}): {schema} has no field {path!r}"
                                + ("" if spec.name in input_map else f"; bind one with --input-map {spec.name}=FIELD"))
                continue
            problem = _mismatch(spec, column)
            if problem:
                problems.append(f"input {spec.name} ({spec.describe()}) <- {path} ({column.describe()}): {problem}")
                continue
            bindings.append(_Binding(spec, column))
        if problems:
            raise ConfigError("the model's inputs do not fit the input schema:\n  " + "\n  ".join(problems))
        self._bindings = bindings

    @property
    def columns(self) -> list[ColumnSpec]:
        """The columns the inputs are read from."""
        return [b.column for b in self._bindings]

    def bind(self, decoded: Columns) -> tuple[dict[str, Any], np.ndarray, list[tuple[int, DecodeError]]]:
        """(the inputs of the good rows, the good rows' positions in ``decoded``, [(row, error)] for the others:
        ``row`` indexes ``decoded``)."""
        n = len(decoded)
        bad = np.zeros(n, dtype=bool)
        errors: list[tuple[int, DecodeError]] = []
        arrays: dict[str, Any] = {}
        for b in self._bindings:
            column = decoded[b.column.path]
            array, rejected = _as_input(b.spec, column, n)
            for reason, rows, message in rejected:
                fresh = rows[~bad[rows]]
                bad[fresh] = True
                errors += [(int(r), DecodeError(reason, f"input {b.spec.name} ({b.column.path}): {message}"))
                           for r in fresh.tolist()]
            arrays[b.spec.name] = array
        if not errors:
            return arrays, np.arange(n), []
        good = np.flatnonzero(~bad)
        errors.sort(key=lambda e: e[0])
        return {k: _take(v, good) for k, v in arrays.items()}, good, errors


def input_side(inputs: Sequence[InputSpec], source: SchemaSource, reader: WriterSchema,
               input_map: Mapping[str, str] | None = None, copies: Sequence[tuple[str, str]] = (),
               ) -> tuple[ColumnDecoder, InputBinder]:
    """A decoder for the columns a model's ``inputs`` and the copied fields (``copies``: (output field, input
    path)) read from ``reader``, and the binder from those columns to the inputs. ConfigError with one line per
    mismatch."""
    columns, _ = reader_columns(reader.normalized)
    what = f"input schema {reader.name}" + (f" (id {reader.schema_id})" if reader.schema_id >= 0 else "")
    binder = InputBinder(inputs, columns, input_map, what)
    by_path = {c.path: c for c in columns}
    needed = {c.path: c for c in binder.columns}
    for field, path in copies:
        if path not in by_path:
            raise ConfigError(f"copied field {field} <- {path}: {what} has no field {path!r}")
        needed[path] = by_path[path]
    log.info("reading %s from %s; model inputs: %s", what, source.description,
             ", ".join(f"{i.name} <- {b.path}" for i, b in zip(inputs, binder.columns, strict=True)))
    return ColumnDecoder(source, reader, list(needed.values())), binder


def _take(value: Any, rows: np.ndarray) -> Any:
    if isinstance(value, np.ndarray):
        return value[rows]
    if isinstance(value, TextBuffer):
        return value.take(rows)
    return [value[i] for i in rows.tolist()]


def take_inputs(inputs: Mapping[str, Any], start: int, stop: int) -> dict[str, Any]:
    """Rows ``start:stop`` of every input (arrays and lists)."""
    return {k: v[start:stop] for k, v in inputs.items()}


def input_rows(inputs: Mapping[str, Any]) -> int:
    for value in inputs.values():
        return len(value)
    return 0


def _mismatch(spec: InputSpec, column: ColumnSpec) -> str:
    kind = column.items if column.kind == "array" else column.kind
    if spec.shape and column.kind != "array":
        return f"a vector needs an array field, not {column.kind}"
    if not spec.shape and column.kind == "array":
        return "an array field needs a vector input (shape (k,))"
    if kind not in _FROM[spec.dtype]:
        return f"{kind} values cannot be read as {spec.dtype}"
    return ""


def _as_input(spec: InputSpec, column: Column, n: int) -> tuple[Any, list[tuple[str, np.ndarray, str]]]:
    rejected: list[tuple[str, np.ndarray, str]] = []
    if column.valid is not None and not column.valid.all():
        rejected.append(("null-input", np.flatnonzero(~column.valid), "null where the model needs a value"))
    if spec.dtype in ("string", "bytes"):
        offsets = column.offsets
        assert offsets is not None
        if spec.text_buffer:  # no str per text (the decoder sent a string that is not UTF-8 to the dead letters)
            texts = TextBuffer.from_offsets(column.values, offsets)
            if spec.nonempty:
                empty_rows = texts.blank()
                if len(empty_rows):
                    rejected.append(("empty-input", empty_rows, "an empty value where the model needs one"))
            return texts, rejected
        raw = column.values.tobytes()
        values: list[Any] = [raw[a:b] for a, b in itertools.pairwise(offsets.tolist())]
        if spec.dtype == "string":  # the decoder sent a string that is not UTF-8 to the dead letters already
            values = [v.decode("utf-8") for v in values]
        if spec.nonempty:
            empty = [i for i, v in enumerate(values) if not (v.strip() if spec.dtype == "string" else v)]
            if empty:
                rejected.append(("empty-input", np.asarray(empty), "an empty value where the model needs one"))
        return values, rejected
    dtype = np.dtype(spec.dtype if spec.dtype != "bool" else np.bool_)
    if spec.shape:
        k = spec.shape[0]
        offsets = column.offsets
        assert offsets is not None
        lengths = np.diff(offsets)
        fits = lengths == k
        wrong = ~fits if column.valid is None else ~fits & column.valid  # a null has no values: not a shape error
        if wrong.any():
            rows = np.flatnonzero(wrong)
            rejected.append(("shape", rows, f"{int(lengths[rows[0]])} values, the model needs {k}"))
        if fits.all():  # every row k values, back to back: a view
            array = column.values[: n * k].reshape(n, k).astype(dtype, copy=False)
        else:  # the rows of k values to their places, zeros elsewhere (those rows are rejected)
            array = np.zeros((n, k), dtype=dtype)
            ok = np.flatnonzero(fits)
            array[ok] = column.values[offsets[:-1][ok][:, None] + np.arange(k)]
    else:
        array = column.values.astype(dtype, copy=False)
    if dtype.kind == "f":
        if column.finite is not None:  # checked by the decoder as it copied the values
            finite = column.finite if column.valid is None else (column.finite | ~column.valid)
        else:
            finite = np.isfinite(array) if array.ndim == 1 else np.isfinite(array).all(axis=1)
        if not finite.all():
            rejected.append(("non-finite", np.flatnonzero(~finite), "NaN or infinity"))
    return array, rejected
