"""A batch's strings as the decoder left them, for handlers that read bytes (``InputSpec(..., text_buffer=True)``).

A string input reaches a handler as a list of str, one object a text made by the pipeline's prepare thread with
the GIL held (slicing, decoding, the empty check): about a quarter of a microsecond a text, which on a GPU is time
the device thread waits to launch its next kernel. A handler that tokenizes the bytes itself (`MiniLMHandler`,
whose C WordPiece takes them as they are) declares ``text_buffer=True`` and gets a `TextBuffer` instead: the
batch's UTF-8 bytes in one buffer and each text's span, no object per text. It is still a sequence of str (each
text decoded when read), so code written for a list that only indexes, slices, iterates or takes ``len`` works.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np

try:
    from stream.models import _textprep
except ImportError:  # not compiled: the same answers in Python
    _textprep = None  # type: ignore[assignment]


class TextBuffer(Sequence[str]):
    """Texts ``data[starts[i]:ends[i]]`` (UTF-8; ``starts`` and ``ends`` int64 of one length). Read-only; slicing
    and `take` share ``data``."""

    __slots__ = ("data", "ends", "starts")

    def __init__(self, data: np.ndarray | bytes, starts: np.ndarray, ends: np.ndarray) -> None:
        self.data = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes | bytearray) else data
        self.starts = np.ascontiguousarray(starts, dtype=np.int64)
        self.ends = np.ascontiguousarray(ends, dtype=np.int64)
        if self.data.dtype != np.uint8 or self.data.ndim != 1:
            raise TypeError(f"TextBuffer data must be bytes or a 1-d uint8 array, not {self.data.dtype}")
        if self.starts.shape != self.ends.shape or self.starts.ndim != 1:
            raise ValueError(f"TextBuffer starts {self.starts.shape} and ends {self.ends.shape} differ")

    @classmethod
    def from_offsets(cls, data: np.ndarray | bytes, offsets: np.ndarray) -> TextBuffer:
        """Texts back to back: text i is ``data[offsets[i]:offsets[i + 1]]``."""
        return cls(data, offsets[:-1], offsets[1:])

    @classmethod
    def of(cls, texts: Sequence[str]) -> TextBuffer:
        """The texts encoded (tests, and callers holding str)."""
        raw = [t.encode("utf-8") for t in texts]
        ends = np.cumsum([len(r) for r in raw], dtype=np.int64)
        return cls(b"".join(raw), ends - np.asarray([len(r) for r in raw], dtype=np.int64), ends)

    def __len__(self) -> int:
        return len(self.starts)

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> TextBuffer: ...

    def __getitem__(self, i: int | slice) -> str | TextBuffer:
        if isinstance(i, slice):
            return TextBuffer(self.data, self.starts[i], self.ends[i])
        return self.raw(i).decode("utf-8")

    def __iter__(self) -> Iterator[str]:
        data = self.data
        for a, b in zip(self.starts.tolist(), self.ends.tolist(), strict=True):
            yield data[a:b].tobytes().decode("utf-8")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TextBuffer | list | tuple):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        shown = ", ".join(repr(t) for t in self[:3])
        return f"TextBuffer([{shown}{', ...' if len(self) > 3 else ''}], {len(self)} texts)"

    def raw(self, i: int) -> bytes:
        """Text ``i``'s bytes."""
        return self.data[int(self.starts[i]):int(self.ends[i])].tobytes()

    def take(self, rows: np.ndarray) -> TextBuffer:
        """These texts, in this order."""
        return TextBuffer(self.data, self.starts[rows], self.ends[rows])

    def blank(self) -> np.ndarray:
        """The rows whose text is empty or whitespace only (``not text.strip()``), ascending."""
        if _textprep is not None:
            unsure = np.frombuffer(_textprep.unsure_blank(self.data, self.starts, self.ends), dtype=np.int64)
        else:
            unsure = np.arange(len(self))
        # bytes beyond ASCII only, or whitespace: str.strip() says (Unicode spaces such as U+00A0 are whitespace)
        return np.asarray([i for i in unsure.tolist() if not self[i].strip()], dtype=np.int64)

