"""The C codec checks what it is given as a library does (STYLE.md): a program, a row list or a buffer that does
not hold together is a ValueError before any record is read, never a read or a write out of bounds; a reader
default that is not a value of its type is refused when the plan is built, never met while a record decodes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from stream.codec.decoder import _nativecodec
from stream.codec.plan import SchemaMismatch
from stream.codec.program import flatten, run_native
from tests.unit.codec.test_plan import encode, plan_for

pytestmark = pytest.mark.skipif(_nativecodec is None, reason="stream.codec._nativecodec is not built")

SCHEMA = {"type": "record", "name": "T", "namespace": "gen", "fields": [
    {"name": "a", "type": "long"}, {"name": "s", "type": "string"}]}


def run(code: list[int], defaults: list[bytes | None] | None = None, source: Any = None, skip: int = 5,
        rows: np.ndarray | None = None) -> Any:
    """run_plan with SCHEMA's two columns (a long, a string) over one record, with the program ``code``."""
    record = b"\x00\x00\x00\x00\x07" + encode(SCHEMA, {"a": 3, "s": "xy"})
    columns = [(2, 0, 0, np.empty(1, dtype=np.int64), None, None, None),
               (5, 1, 0, np.empty(64, dtype=np.uint8), None, np.empty(2, dtype=np.int64), None)]
    return _nativecodec.run_plan(np.asarray(code, dtype=np.int32), defaults or [], source or [record],
                                 np.zeros(1, dtype=np.int64) if rows is None else rows, skip, columns,
                                 np.empty(1, dtype=np.int64))


def test_the_program_flatten_makes_runs() -> None:
    plan, _ = plan_for(SCHEMA, SCHEMA)
    code = flatten(plan).code.tolist()
    taken, errors, short = run(code)
    assert (taken, errors, short) == (1, [], 0)


@pytest.mark.parametrize(("code", "why"), [
    ([13, 2, 3, 5, 7, 1, 0], "a column"),  # RECORD: LONG into column 5 of 2
    ([13, 2, 3, -2, 7, 1, 0], "a column"),
    ([13, 2, 3, 0, 7], "an operation cut short"),  # the string op cut off
    ([13, 3, 3, 0, 7, 1], "an operation past the end"),  # a third field that is not there
    ([13, 2, 3, 0, 7, 1, 1, 0, 0], "a default's column or value"),  # a default with no value behind it
    ([13, 2, 3, 0, 7, 1, 0, 3, 0], "operations after the root"),
    ([99], "an unknown operation"),
    ([10, 0, 1, 1, 3, 0], "an item op of another length"),  # ARRAY whose item op is 2 long, said 1
    ([10, 0, 1, -1, 3, 0], "an item length"),
    ([12, 1, 7, 3, 0], "a branch length"),  # UNION whose branch says 7 ints
    ([0, -3], "a cut NULL"),  # NULL with a negative count
    ([9, 0, 2147483647], "a cut ENUM"),
], ids=lambda v: str(v) if isinstance(v, str) else None)
def test_a_program_that_does_not_hold_together_is_refused_before_a_record_is_read(code: list[int], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        run(code)


def test_a_program_nested_deeper_than_the_c_decoder_goes_is_refused() -> None:
    depth = _nativecodec.MAX_DEPTH + 2
    nested: list[int] = [3, 0]  # unions in unions around a LONG
    for _ in range(depth):
        nested = [12, 1, len(nested), *nested]
    with pytest.raises(ValueError, match="nested deeper than MAX_DEPTH"):
        run([13, 2, *nested, 7, 1, 0])


def test_rows_skip_and_buffers_out_of_range_are_refused() -> None:
    plan, _ = plan_for(SCHEMA, SCHEMA)
    code = flatten(plan).code.tolist()
    with pytest.raises(ValueError, match="skip"):
        run(code, skip=-5)
    big = np.iinfo(np.int64).max
    joined = (b"\x00" * 16, np.asarray([big - 4], dtype=np.int64), np.asarray([10], dtype=np.int64))
    with pytest.raises(ValueError, match="no value"):  # start + length overflows: not inside the buffer
        run(code, source=joined)
    with pytest.raises(ValueError, match="no value"):
        run(code, rows=np.asarray([7], dtype=np.int64))


def test_an_output_program_whose_null_skips_elsewhere_is_refused() -> None:
    ints = np.asarray([1, 2], dtype=np.int32)
    flags = np.asarray([0, 1], dtype=np.uint8)
    ends = np.empty(2, dtype=np.int64)
    # NULLABLE flags null=0 idx=1 skip, then INT ints: the skip must be exactly that op's length (2)
    good = _nativecodec.encode_rows(b"", np.asarray([10, 1, 0, 1, 2, 2, 0], dtype=np.int32), [], [ints, flags], 2,
                                    ends)
    assert good == b"\x00\x02\x04"
    for skip in (-100, -7, 0, 1, 3, 50):
        with pytest.raises(ValueError, match="not the next one"):
            _nativecodec.encode_rows(b"", np.asarray([10, 1, 0, 1, skip, 2, 0], dtype=np.int32), [],
                                     [ints, flags], 2, ends)
    with pytest.raises(ValueError, match="rows"):
        _nativecodec.encode_rows(b"", np.asarray([2, 0], dtype=np.int32), [], [ints], -1, ends)


@pytest.mark.parametrize(("field", "default"), [
    ({"type": "double"}, []), ({"type": "long"}, "7"), ({"type": "long"}, 2**63), ({"type": "int"}, True),
    ({"type": "string"}, 5), ({"type": "boolean"}, 0), ({"type": {"type": "fixed", "name": "F", "size": 2}}, "abc"),
    ({"type": {"type": "array", "items": "float"}}, ["x"]), ({"type": ["int", "null"]}, None),
])
def test_a_reader_default_that_is_not_a_value_of_its_type_is_refused_with_the_plan(field: dict[str, Any],
                                                                                    default: Any) -> None:
    """A malformed default such as ``[]`` for a double was copied at the double's full size by the C decoder
    (reading past its end)."""
    reader = {**SCHEMA, "fields": [*SCHEMA["fields"], {"name": "extra", **field, "default": default}]}
    with pytest.raises(SchemaMismatch, match=r"extra: default .* is not a value of"):
        plan_for(SCHEMA, reader)


def test_reader_defaults_that_fit_their_types_are_taken() -> None:
    reader = {**SCHEMA, "fields": [*SCHEMA["fields"], {"name": "d", "type": "double", "default": 1},
                                   {"name": "u", "type": ["null", "int"], "default": None},
                                   {"name": "f", "type": {"type": "fixed", "name": "F", "size": 2}, "default": "ab"}]}
    plan, _ = plan_for(SCHEMA, reader)
    decoded, errors = run_native(_nativecodec, flatten(plan), plan.columns,
                                 [b"\x00\x00\x00\x00\x07" + encode(SCHEMA, {"a": 1, "s": ""})],
                                 np.zeros(1, dtype=np.int64), 5, 16)
    assert errors == [] and decoded.rows() == [{"a": 1, "s": "", "d": 1.0, "u": None, "f": b"ab"}]
