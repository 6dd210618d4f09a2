"""The load generator's framing of demo events: a block's framed values back to back in one buffer, each with a
slot for its timestamp, so a block framed ahead of time costs only the stamping and the send when it goes out."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stream.codec import HEADER_SIZE, RegisteredSchema, avro_long, strip_logical_types, utf8_column

_VARINT_LIMITS = np.asarray([2 ** (7 * k) - 1 for k in range(1, 10)], dtype=np.uint64)  # largest of k bytes


def _zigzag_varints(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Avro longs for a column: (n, k) bytes, row i's varint in its first ``lengths[i]`` bytes; lengths."""
    v = np.asarray(values, dtype=np.int64)
    zz = (v.astype(np.uint64) << np.uint64(1)) ^ (v >> np.int64(63)).astype(np.uint64)
    lengths = np.searchsorted(_VARINT_LIMITS, zz, side="left") + 1  # 7 bits per byte; at least one byte
    k = int(lengths.max()) if len(zz) else 1
    groups = ((zz[:, None] >> (np.uint64(7) * np.arange(k, dtype=np.uint64))) & np.uint64(0x7F)).astype(np.uint8)
    groups[np.arange(k) < (lengths - 1)[:, None]] |= 0x80  # continuation bit on all but the last byte
    return groups, lengths


def _packed(groups: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Rows of ``groups`` cut to their lengths, back to back."""
    return groups[np.arange(groups.shape[1]) < lengths[:, None]]


def _scatter(out: np.ndarray, dest: np.ndarray, packed: np.ndarray, lengths: np.ndarray) -> None:
    """Copy variable-length rows (``packed`` back to back) to ``out`` at offsets ``dest``."""
    src_start = np.cumsum(lengths) - lengths
    out[np.repeat(dest - src_start, lengths) + np.arange(len(packed))] = packed


def _copy_rows(out: np.ndarray, dest: np.ndarray, src: np.ndarray, src_start: np.ndarray, lengths: np.ndarray) -> None:
    """Copy ``src[src_start[i] : src_start[i] + lengths[i]]`` to ``out`` at ``dest[i]``, for every row i."""
    step = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)  # offset in its row
    out[np.repeat(dest, lengths) + step] = src[np.repeat(src_start, lengths) + step]


_EVENT_LAYOUT = ["string", "string", {"type": "long"}, {"type": "array", "items": "float"}]  # EventFrames



class EventFrames:
    """Framed input-event values of a block, back to back in one buffer, each with a ``ts_len``-byte slot for its
    ts_ms at ``ts_at[i]``: the load generator stamps a burst of events in place as it hands them over, so a block
    framed ahead of time costs only the stamping and the send when it goes out."""

    values: np.ndarray  # uint8, every value back to back (written by the stamping)
    ends: np.ndarray  # int64 (n,): where value i ends in ``values``
    ts_at: np.ndarray  # int64 (n,): where value i's ts_ms slot starts in ``values``
    ts_len: int

    def __init__(self, values: np.ndarray, ends: np.ndarray, ts_at: np.ndarray, ts_len: int) -> None:
        self.values, self.ends, self.ts_at, self.ts_len = values, ends, ts_at, ts_len
        self._ts_columns = np.arange(ts_len, dtype=np.int64)

    @classmethod
    def build(cls, schema: RegisteredSchema, event_ids: Sequence[str], keys: Sequence[str], features: np.ndarray,
              ts_len: int) -> EventFrames:
        """Frames for the event layout (string event_id, string key, long ts_ms, array<float> features);
        ValueError for a schema of any other layout."""
        if [strip_logical_types(f["type"]) for f in schema.raw["fields"]] != _EVENT_LAYOUT:
            raise ValueError(f"schema {schema.name} is not the event layout (event_id, key, ts_ms, features)")
        n, n_features = features.shape
        columns = [utf8_column(event_ids), utf8_column(keys)]
        varints = [_zigzag_varints(lengths) for _, lengths in columns]
        heads = HEADER_SIZE + sum(v[1] + c[1] for v, c in zip(varints, columns, strict=True))
        # Avro array: one block holding all the floats, then the 0 that ends the array (just the 0 when empty).
        count = avro_long(n_features) if n_features else b""
        tail = len(count) + 4 * n_features + 1
        # Framed first as right-aligned rows, so that the ts slot and the feature array of every value sit in the
        # same columns and are written as slices; then the rows are joined without their left padding.
        width = (int(heads.max()) if n else HEADER_SIZE) + ts_len + tail
        rows = np.zeros((n, width), dtype=np.uint8)
        ts_column = width - tail - ts_len
        rows[:, width - tail : width - tail + len(count)] = np.frombuffer(count, dtype=np.uint8)
        rows[:, width - tail + len(count) : width - 1] = np.ascontiguousarray(features, dtype="<f4").view(
            np.uint8).reshape(n, 4 * n_features)
        starts = ts_column - heads
        flat = rows.reshape(-1)
        at = np.arange(n, dtype=np.int64) * width + starts
        flat[at[:, None] + np.arange(HEADER_SIZE)] = np.frombuffer(schema.header, dtype=np.uint8)
        at = at + HEADER_SIZE
        for (groups, varint_len), (text, text_len) in zip(varints, columns, strict=True):
            _scatter(flat, at, _packed(groups, varint_len), varint_len)
            at = at + varint_len
            _copy_rows(flat, at, text, np.cumsum(text_len) - text_len, text_len)
            at = at + text_len
        ends = np.cumsum(width - starts, dtype=np.int64)
        return cls(rows[np.arange(width) >= starts[:, None]], ends, ends - (width - ts_column), ts_len)

    def __len__(self) -> int:
        return len(self.ends)

    @property
    def nbytes(self) -> int:
        return int(self.values.nbytes + self.ends.nbytes + self.ts_at.nbytes)

    def stamped(self, start: int, stop: int, ts: bytes) -> list[bytes]:
        """Values ``start:stop``, with ``ts`` (an Avro long of exactly ``ts_len`` bytes) as their ts_ms."""
        blob, ends = self.stamped_joined(start, stop, ts)
        bounds = ends.tolist()
        return [blob[a:b] for a, b in zip([0, *bounds[:-1]] if bounds else [], bounds, strict=True)]

    def stamped_joined(self, start: int, stop: int, ts: bytes) -> tuple[bytes, np.ndarray]:
        """Values ``start:stop`` stamped as in `stamped`, back to back in one buffer, with each value's end offset
        in it (the layout `stream.kafka.native.NativeProducer.produce` takes)."""
        if len(ts) != self.ts_len:
            raise ValueError(f"{len(ts)}-byte timestamp for a {self.ts_len}-byte slot")
        if stop <= start:
            return b"", np.zeros(0, dtype=np.int64)
        self.values[self.ts_at[start:stop, None] + self._ts_columns] = np.frombuffer(ts, dtype=np.uint8)
        low = int(self.ends[start - 1]) if start else 0
        return self.values[low : int(self.ends[stop - 1])].tobytes(), self.ends[start:stop] - low
