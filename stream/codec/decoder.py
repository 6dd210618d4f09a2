"""Framed Avro records of any schema into named columns: the header's id names the writer schema, a field plan
resolves it to the reader schema, and the plan runs over every record of that id at once (in C where the extension
is built).

A record is dead-lettered when it has no value (``null-value``), is too short for the header (``truncated``), has
another magic byte (``bad-magic``), stands for an offset of a batch the consumer could not decompress
(``unreadable``: `stream.kafka.unreadable`), is larger than the limit (``oversized``), carries an id the registry
does not know (``unknown-schema``) or one met while new ids come faster than the registry is asked about them
(``lookup-limited``: a producer writing ids at random must neither send a request to the registry a record nor
grow the cache), a writer schema the reader schema cannot take (``incompatible-schema``), or bytes that do
not follow its schema (``corrupt-avro``). A registry that cannot be reached is none of these: `decode_batch`
raises `RegistryUnavailable` and the batch is tried again later; nothing is dead-lettered or committed for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from stream.codec.columns import Columns, ColumnSpec
from stream.codec.plan import FieldPlan, SchemaMismatch, depth, resolve
from stream.codec.program import Program, flatten, run_native
from stream.codec.reference import decode_columns
from stream.codec.registry import SchemaSource, WriterSchema
from stream.errors import DecodeError
from stream.kafka.records import UNREADABLE, Records
from stream.logs import Throttle

try:
    from stream.codec import _nativecodec
except ImportError:  # not compiled: the reference decoder does the same work, record by record
    _nativecodec = None  # type: ignore[assignment]

log = logging.getLogger(__name__)
HEADER_SIZE = 5
UNKNOWN_ID_TTL_S = 10.0  # how long an id the registry did not know is taken for unknown before it is asked again
MAX_UNKNOWN_IDS = 1024  # unknown ids remembered; past it the oldest is forgotten (asked again if met again)
LOOKUPS_PER_S = 20.0  # the source is asked about ids it was not asked about lately at most this often ...
LOOKUP_BURST = 200  # ... after a first burst of this many
_LIMITED_WARN_EVERY_S = 60.0
_HEADER_ERRORS = {-1: ("null-value", "record has no value (tombstone)"),
                  -2: ("truncated", "shorter than the 5-byte header"),
                  -3: ("bad-magic", "the first byte is not the magic byte 0"),
                  -5: ("unreadable", "the consumer could not decompress the record batch holding this offset (its "
                                     "records decompress past receive.message.max.bytes, or its codec is not built "
                                     "in): what it holds is unknown; the worker's log names the batch")}


def native_depth_ok(plan: FieldPlan) -> bool:
    """Whether the C decoder can run ``plan`` (it recurses once an operation level, up to its MAX_DEPTH)."""
    return _nativecodec is not None and depth(plan.root) - 1 <= _nativecodec.MAX_DEPTH


def _by_id(ids: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """(id, the ascending positions of its records) for each id >= 0, in one sort: a batch of as many ids as
    records (a producer writing ids at random) costs n log n, not n per id."""
    valid = np.flatnonzero(ids >= 0)
    unique, inverse = np.unique(ids[valid], return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(unique) + 1))
    return [(int(schema_id), valid[order[bounds[k]:bounds[k + 1]]]) for k, schema_id in enumerate(unique.tolist())]


class _Plan:
    """What one writer id decodes with: a plan (and its C program), or why its records are dead-lettered."""

    __slots__ = ("expires", "message", "plan", "program", "reason")

    def __init__(self, plan: FieldPlan | None, reason: str = "", message: str = "",
                 expires: float = float("inf")) -> None:
        self.plan = plan
        self.expires = expires  # an unknown id is asked again after this (monotonic seconds)
        # A plan that nests deeper than the C decoder goes is run by the reference decoder: decided here, once.
        self.program: Program | None = flatten(plan) if plan is not None and native_depth_ok(plan) else None
        self.reason = reason
        self.message = message


class ColumnDecoder:
    """Decodes raw values framed with the Confluent wire format into the reader schema's columns.

    ``reader``: the schema the worker reads (its columns are ``columns``, a subset of the reader's leaves);
    ``source``: where writer schemas are found by id. Plans are cached per writer id for the life of the decoder
    (an id's schema never changes), so a registry lookup happens once per id.
    """

    def __init__(self, source: SchemaSource, reader: WriterSchema, columns: Sequence[ColumnSpec],
                 native: bool = True, clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self.reader = reader
        self.columns = tuple(columns)
        self._plans: dict[int, _Plan] = {}  # the source's ids: as many as it holds
        self._unknown: dict[int, _Plan] = {}  # ids it did not know, oldest first: at most MAX_UNKNOWN_IDS
        self._native = _nativecodec if native else None
        self._clock = clock
        self._lock = threading.Lock()  # the prepare threads share the lookups' budget and the unknown ids
        self._tokens = float(LOOKUP_BURST)
        self._filled_at = clock()
        self._limited = Throttle(_LIMITED_WARN_EVERY_S)  # the WARNING about lookups refused

    def _may_look_up(self) -> bool:
        """One more question to the source within LOOKUPS_PER_S (a token bucket of LOOKUP_BURST)."""
        now = self._clock()
        with self._lock:
            self._tokens = min(float(LOOKUP_BURST), self._tokens + (now - self._filled_at) * LOOKUPS_PER_S)
            self._filled_at = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            unlogged = self._limited.due(now)
            if unlogged is None:
                return False
        log.warning("records name schema ids faster than %g new ids a second (after %d): %d not looked up in %s "
                    "since the last warning; their records are dead-lettered as lookup-limited (a producer writing "
                    "ids that are not registered?)", LOOKUPS_PER_S, LOOKUP_BURST, unlogged + 1, self.source.description)
        return False

    def plan_for(self, schema_id: int) -> _Plan:
        """The plan of a writer id; RegistryUnavailable when the registry must be asked and cannot be."""
        found = self._plans.get(schema_id) or self._unknown.get(schema_id)
        if found is not None and found.expires > self._clock():
            return found
        if not self._may_look_up():
            return _Plan(None, "lookup-limited", f"schema id {schema_id} was not looked up in "
                                                 f"{self.source.description}: records named more than "
                                                 f"{LOOKUPS_PER_S:g} new schema ids a second")
        writer = self.source.by_id(schema_id)
        if writer is None:
            # Not cached for good: a registry of several nodes may not know a schema registered a moment ago.
            found = _Plan(None, "unknown-schema", f"schema id {schema_id} is not registered in "
                                                  f"{self.source.description}", self._clock() + UNKNOWN_ID_TTL_S)
            with self._lock:
                self._unknown.pop(schema_id, None)
                self._unknown[schema_id] = found
                while len(self._unknown) > MAX_UNKNOWN_IDS:
                    del self._unknown[next(iter(self._unknown))]
            return found
        try:
            found = _Plan(resolve(writer.normalized, self.reader.normalized, self.columns, schema_id))
        except SchemaMismatch as exc:
            found = _Plan(None, "incompatible-schema",
                          f"schema id {schema_id} ({writer.name}) cannot be read as schema id "
                          f"{self.reader.schema_id} ({self.reader.name}): {exc}")
        except RecursionError:
            found = _Plan(None, "incompatible-schema",
                          f"schema id {schema_id} ({writer.name}) nests too deep to decode")
        how = "decoding" if found.program is not None or self._native is None else \
            "decoding with the reference decoder (the schema nests deeper than the C decoder goes)"
        log.info("schema id %d (%s): %s", schema_id, writer.name, how if found.plan is not None else found.message)
        self._plans[schema_id] = found
        with self._lock:
            self._unknown.pop(schema_id, None)  # registered since it was asked about
        return found

    def decode_batch(self, values: Sequence[bytes | None] | Records, max_bytes: int | None = None,
                     ) -> tuple[Columns, list[tuple[int, DecodeError]]]:
        """(the decoded rows, in raw order, with ``index`` their raw positions; [(raw position, error)])."""
        n = len(values)
        if isinstance(values, Records):
            source: Any = (values.buffer, values.starts, values.lengths)
            lengths = values.lengths
        else:
            source = values if type(values) is list else list(values)
            lengths = np.fromiter((-1 if v is None else len(v) for v in source), dtype=np.int64, count=n)
        ids = self._read_ids(source, lengths, n)
        errors: list[tuple[int, DecodeError]] = []
        if n == 0:
            return Columns.concat([], self.columns), errors
        if max_bytes is not None and int(lengths.max()) > max_bytes:
            big = np.flatnonzero(lengths > max_bytes)
            for i in big.tolist():
                errors.append((i, DecodeError("oversized", f"{int(lengths[i])} bytes exceeds the {max_bytes}-byte "
                                                           "limit")))
            ids[big] = -4
        # Most batches hold one writer id and no bad header: one comparison tells.
        first = int(ids[0])
        if first >= 0 and bool((ids == first).all()):
            groups: list[tuple[int, np.ndarray]] = [(first, np.arange(n))]
        else:
            ids[lengths == UNREADABLE] = -5  # read as null values (-1) above, which the comparison sent here
            for code, (reason, message) in _HEADER_ERRORS.items():
                for i in np.flatnonzero(ids == code).tolist():
                    errors.append((i, DecodeError(reason, message)))
            groups = _by_id(ids)
        parts: list[Columns] = []
        for schema_id, rows in groups:
            plan = self.plan_for(schema_id)
            if plan.plan is None:
                errors += [(i, DecodeError(plan.reason, plan.message)) for i in rows.tolist()]
                continue
            part, part_errors = self._run(plan, source, rows, lengths)
            parts.append(part)
            errors += part_errors
        errors.sort(key=lambda item: item[0])
        if len(parts) == 1:
            return parts[0], errors
        merged = Columns.concat(parts, self.columns)
        return merged.take(np.argsort(merged.index, kind="stable")), errors

    def _read_ids(self, source: Any, lengths: np.ndarray, n: int) -> np.ndarray:
        ids = np.empty(n, dtype=np.int64)
        if self._native is not None:
            self._native.read_ids(source, ids)
            return ids
        for i in range(n):
            value = source[i] if isinstance(source, list) else (
                None if lengths[i] < 0 else source[0][int(source[1][i]) : int(source[1][i]) + int(lengths[i])])
            if value is None:
                ids[i] = -1
            elif len(value) < HEADER_SIZE:
                ids[i] = -2
            elif value[0] != 0:
                ids[i] = -3
            else:
                ids[i] = int.from_bytes(value[1:HEADER_SIZE], "big")
        return ids

    def _run(self, plan: _Plan, source: Any, rows: np.ndarray, lengths: np.ndarray,
             ) -> tuple[Columns, list[tuple[int, DecodeError]]]:
        assert plan.plan is not None
        if self._native is not None and plan.program is not None:
            total = int(lengths.sum() if len(rows) == len(lengths) else lengths[rows].sum())
            return run_native(self._native, plan.program, plan.plan.columns, source, rows, HEADER_SIZE, total)
        if isinstance(source, list):
            bodies = [source[i][HEADER_SIZE:] for i in rows.tolist()]
        else:
            buf, starts = source[0], source[1]
            bodies = [buf[int(starts[i]) + HEADER_SIZE : int(starts[i]) + int(lengths[i])] for i in rows.tolist()]
        decoded, errors = decode_columns(plan.plan, bodies)
        decoded.index = rows[decoded.index]
        return decoded, [(int(rows[i]), e) for i, e in errors]
