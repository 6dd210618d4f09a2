"""TextBuffer: a batch's strings as one UTF-8 buffer for handlers that read bytes (``text_buffer=True``), bound
from a decoded column as a list of str is, its blank rows refused as the list's are, and read by MiniLM's C
WordPiece as the same ids."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream.codec.columns import Column, Columns, ColumnSpec
from stream.errors import ConfigError
from stream.models import text_buffer
from stream.models.spec import InputSpec
from stream.models.text_buffer import TextBuffer
from stream.pipeline.inputs import InputBinder, take_inputs

# ASCII with every kind of whitespace, and characters beyond it that str.strip() removes (U+00A0, U+2003, U+3000)
# or keeps (é, a CJK character, an emoji)
TEXT = st.text(alphabet=st.sampled_from([*"ab [\t\n\x0b\x0c\r\x1c\x1f\x00\x7f", "\u00a0", "\u2003", "\u3000",
                                         "\u00e9", "\u4e2d", "\U0001f600", "\x85"]), max_size=12)


def test_it_reads_as_the_list_it_was_made_from() -> None:
    texts = ["hello", "", "  \t", "caf\u00e9", "x [SEP] y", "\u4e2d\u6587"]
    buf = TextBuffer.of(texts)
    assert len(buf) == 6 and list(buf) == texts and buf == texts and [buf[i] for i in range(6)] == texts
    assert buf[2:5] == texts[2:5] and isinstance(buf[2:5], TextBuffer) and buf[::2] == texts[::2]
    assert buf.take(np.array([5, 0, 3])) == [texts[5], texts[0], texts[3]]
    assert buf.raw(3) == "caf\u00e9".encode() and buf[-1] == texts[-1]
    assert repr(buf) == "TextBuffer(['hello', '', '  \\t', ...], 6 texts)"
    with pytest.raises(IndexError):
        buf[6]
    with pytest.raises(ValueError, match="differ"):
        TextBuffer(b"ab", np.array([0, 1]), np.array([1]))
    with pytest.raises(TypeError, match="uint8"):
        TextBuffer(np.zeros(3, dtype=np.int32), np.array([0]), np.array([1]))


@settings(max_examples=300, deadline=None)
@given(st.lists(TEXT, max_size=20))
def test_blank_rows_are_those_str_strip_empties_with_and_without_the_c_helper(texts: list[str]) -> None:
    want = [i for i, t in enumerate(texts) if not t.strip()]
    buf = TextBuffer.of(texts)
    assert buf.blank().tolist() == want
    shuffled = np.random.default_rng(len(texts)).permutation(len(texts))
    assert buf.take(shuffled).blank().tolist() == [j for j, i in enumerate(shuffled.tolist()) if i in want]
    saved = text_buffer._textprep
    text_buffer._textprep = None  # type: ignore[assignment]
    try:
        assert buf.blank().tolist() == want
    finally:
        text_buffer._textprep = saved


def test_the_c_helper_refuses_spans_outside_the_buffer() -> None:
    if text_buffer._textprep is None:
        pytest.skip("stream.models._textprep not compiled")
    for starts, ends in (([0], [4]), ([-1], [1]), ([2], [1])):
        with pytest.raises(ValueError, match="not within"):
            text_buffer._textprep.unsure_blank(b"abc", np.array(starts, dtype=np.int64),
                                               np.array(ends, dtype=np.int64))
    with pytest.raises(ValueError, match="int64"):
        text_buffer._textprep.unsure_blank(b"abc", np.array([0], dtype=np.int32), np.array([1], dtype=np.int32))


def _column(texts: list[str | None]) -> Columns:
    raw = [t.encode() if t is not None else b"" for t in texts]
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in raw])]).astype(np.int64)
    valid = np.array([t is not None for t in texts])
    spec = ColumnSpec("text", "string", nullable=True)
    out = Columns(np.arange(len(texts)))
    out.columns["text"] = Column(spec, np.frombuffer(b"".join(raw), dtype=np.uint8).copy(), offsets, valid)
    return out


def test_a_buffer_input_binds_and_refuses_rows_as_a_list_input_does() -> None:
    texts: list[str | None] = ["one", "", None, " \u3000 ", "caf\u00e9", "two", "\t"]
    specs = {flag: InputSpec("text", "string", nonempty=True, text_buffer=flag) for flag in (False, True)}
    columns = [ColumnSpec("text", "string", nullable=True)]
    (as_list, good_l, errors_l), (as_buffer, good_b, errors_b) = (
        InputBinder((specs[flag],), columns).bind(_column(texts)) for flag in (False, True))
    assert isinstance(as_list["text"], list) and isinstance(as_buffer["text"], TextBuffer)
    assert as_buffer["text"] == as_list["text"] == ["one", "caf\u00e9", "two"]
    assert good_b.tolist() == good_l.tolist() == [0, 4, 5]
    assert [(row, e.reason) for row, e in errors_b] == [(row, e.reason) for row, e in errors_l] == [
        (1, "empty-input"), (2, "null-input"), (3, "empty-input"), (6, "empty-input")]
    part = take_inputs(as_buffer, 1, 3)["text"]
    assert isinstance(part, TextBuffer) and part == ["caf\u00e9", "two"]


def test_only_string_inputs_take_a_buffer() -> None:
    with pytest.raises(ConfigError, match="text_buffer applies to string inputs"):
        InputSpec("blob", "bytes", text_buffer=True)
