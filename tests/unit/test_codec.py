from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from producers.events import generate_events
from stream import codec
from stream.codec import (
    EventFrames,
    SchemaRegistry,
    avro_long,
    encode,
    encode_longs,
)
from stream.errors import ConfigError, DecodeError
from stream.models.demo import EVENT_SCHEMA, PREDICTION_SCHEMA

REGISTRY = SchemaRegistry.from_dir()
EVENT = REGISTRY.by_name(EVENT_SCHEMA)
# The prediction schema as first published (id 2), before the input_* fields: still encodable, fast.
REGISTRY_V1 = SchemaRegistry([(1, EVENT.raw), (2, REGISTRY.by_id(2).raw)])  # type: ignore[union-attr]


# The prediction encoder runs in C where stream._nativecodec is built, with numpy otherwise: the tests
# that compare them with fastavro run on both (on numpy alone where the extension is not built).
IMPLS = ["c", "numpy"] if codec._nativecodec is not None else ["numpy"]
needs_codec_extension = pytest.mark.skipif(codec._nativecodec is None, reason="stream._nativecodec is not built")


@contextlib.contextmanager
def codec_impl(impl: str) -> Iterator[None]:
    native = codec._nativecodec
    codec._nativecodec = native if impl == "c" else None
    try:
        yield
    finally:
        codec._nativecodec = native


def test_the_codec_extension_is_built_where_ci_requires_it() -> None:
    """CI sets STREAM_REQUIRE_NATIVE=1: a lost compiler must fail the run, not skip the C half of the tests."""
    if os.environ.get("STREAM_REQUIRE_NATIVE") == "1":
        assert codec._nativecodec is not None


def event_bytes(**overrides: object) -> bytes:
    record = {"event_id": "e-1", "key": "acct-1", "ts_ms": 1_700_000_000_000, "features": [0.5] * 32}
    record.update(overrides)
    return encode(EVENT, record)


def test_wire_format_is_confluent_framing() -> None:
    value = event_bytes()
    assert value[0] == 0
    assert struct.unpack(">I", value[1:5])[0] == EVENT.schema_id == 1


def test_decode_error_carries_location() -> None:
    err = DecodeError("bad-magic", "magic byte 1 is not 0").at("in", 3, 42)
    assert (err.topic, err.partition, err.offset, err.reason) == ("in", 3, 42, "bad-magic")
    assert "in[3]@42" in str(err)


def test_registry_errors_are_clear(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="cannot load"):
        SchemaRegistry.from_dir(tmp_path)
    with pytest.raises(ConfigError, match="not in the registry"):
        REGISTRY.by_name("nope.Nope")


@settings(max_examples=300, deadline=None)
@given(ts=st.integers(-(2**63), 2**63 - 1), seed=st.integers(0, 1000), n=st.integers(1, 12),
       cut=st.integers(0, 12), texts=st.lists(st.text(max_size=80), min_size=2, max_size=2))
def test_load_generator_frames_match_fastavro(ts: int, seed: int, n: int, cut: int, texts: list[str]) -> None:
    """The load generator's framed values, stamped in two bursts, are fastavro's encoding of each event
    (ids and keys of any length and any characters, long varints included)."""
    block = generate_events(n, seed=seed)
    ids, keys = list(block.event_ids), list(block.keys)
    ids[0], keys[-1] = texts[0], texts[1]
    frames = EventFrames.build(EVENT, ids, keys, block.features, len(avro_long(ts)))
    cut = min(cut, n)
    values = frames.stamped(0, cut, avro_long(ts)) + frames.stamped(cut, n, avro_long(ts))
    for i, record in enumerate(block.records()):
        assert values[i] == encode(EVENT, {**record, "event_id": ids[i], "key": keys[i], "ts_ms": ts})
    # The joined form (what the native producer takes): the same values back to back, each one's end offset.
    joined, ends = frames.stamped_joined(cut, n, avro_long(ts))
    assert joined == b"".join(values[cut:]) and ends.tolist() == np.cumsum([len(v) for v in values[cut:]]).tolist()
    assert [avro_long(v) for v in (0, -1, 1, 63, -64, 64, 2**62)] == encode_longs(
        np.asarray([0, -1, 1, 63, -64, 64, 2**62], dtype=np.int64))


@needs_codec_extension
def test_c_codec_refuses_buffers_of_the_wrong_size() -> None:
    with pytest.raises(ValueError, match="ids: need 3 items"):
        codec._nativecodec.read_ids([event_bytes()] * 3, np.empty(2, dtype=np.int64))
    with pytest.raises(ValueError, match=r"offsets: need n \+ 1 int64"):
        codec._nativecodec.encode_rows(b"\x00\x00\x00\x00\x01", np.asarray([6, 0, 1], dtype=np.int32), [],
                                       [np.zeros(3, dtype=np.uint8), np.zeros(2, dtype=np.int64)], 2,
                                       np.empty(2, dtype=np.int64))


def test_load_generator_frames_refuse_a_wrong_slot_or_layout() -> None:
    block = generate_events(3, seed=1)
    frames = EventFrames.build(EVENT, block.event_ids, block.keys, block.features, 6)
    with pytest.raises(ValueError, match="7-byte timestamp for a 6-byte slot"):
        frames.stamped(0, 3, avro_long(2**45))
    empty = EventFrames.build(EVENT, [], [], np.zeros((0, 32), dtype=np.float32), 6)
    assert len(empty) == 0 and empty.stamped(0, 0, avro_long(2**40)) == []
    assert empty.stamped_joined(0, 0, avro_long(2**40))[0] == b""
    with pytest.raises(ValueError, match="7-byte timestamp for a 6-byte slot"):
        frames.stamped_joined(0, 3, avro_long(2**45))
    with pytest.raises(ValueError, match="not the event layout"):
        EventFrames.build(REGISTRY.by_name(PREDICTION_SCHEMA), block.event_ids, block.keys, block.features, 6)
