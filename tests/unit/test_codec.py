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
    EVENT_SCHEMA,
    PREDICTION_SCHEMA,
    EventBatch,
    EventFrames,
    InputSource,
    PredictionEncoder,
    SchemaRegistry,
    avro_long,
    decode,
    encode,
    encode_longs,
)
from stream.errors import ConfigError, DecodeError

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


def test_prediction_encoder_round_trip() -> None:
    block = generate_events(3, seed=1, ts_ms=1000)
    batch = EventBatch.from_ids(np.arange(3), block.event_ids, block.ts_ms)
    encoder = PredictionEncoder(REGISTRY, ("fraud_score", "is_fraud"))
    scores = np.array([0.1, 0.9, 0.5], dtype=np.float32)
    source = InputSource("events-in", np.array([0, 5, 5]), np.array([7, 0, 2**40]))
    values = encoder.encode_batch(batch, {"fraud_score": scores, "is_fraud": scores >= 0.5},
                                  model_name="m", model_version="7", predicted_ts_ms=2000, batch_size=4, source=source)
    assert {v[1:5] for v in values} == {struct.pack(">I", 3)}, "written with the newest prediction schema"
    records = [decode(REGISTRY, v)[1] for v in values]
    assert [(r["input_topic"], r["input_partition"], r["input_offset"]) for r in records] == [
        ("events-in", 0, 7), ("events-in", 5, 0), ("events-in", 5, 2**40)]
    assert [r["event_id"] for r in records] == block.event_ids
    assert [r["is_fraud"] for r in records] == [False, True, True]
    assert records[1]["fraud_score"] == pytest.approx(0.9)
    assert {r["batch_size"] for r in records} == {4}
    assert {r["event_ts_ms"] for r in records} == {1000}


def test_encoder_rejects_outputs_missing_from_schema() -> None:
    with pytest.raises(ConfigError, match="not fields"):
        PredictionEncoder(REGISTRY, ("fraud_score", "embedding"))


def test_registry_errors_are_clear(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError, match="cannot load"):
        SchemaRegistry.from_dir(tmp_path)
    with pytest.raises(ConfigError, match="not in the registry"):
        REGISTRY.by_name("nope.Nope")


@settings(max_examples=300, deadline=None)
@given(rows=st.lists(st.tuples(st.text(max_size=80), st.integers(-(2**63), 2**63 - 1),
                               st.floats(width=32, allow_nan=False), st.booleans(),
                               st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1)), max_size=10),
       predicted=st.integers(-(2**63), 2**63 - 1), batch_size=st.integers(0, 2**31 - 1),
       names=st.tuples(st.text(max_size=70), st.text(max_size=10), st.text(max_size=249)),
       old_schema=st.booleans(), impl=st.sampled_from(IMPLS))
def test_fast_prediction_encoder_agrees_with_fastavro(rows: list[tuple[str, int, float, bool, int, int]],
                                                      predicted: int, batch_size: int, names: tuple[str, str, str],
                                                      old_schema: bool, impl: str) -> None:
    encoder = PredictionEncoder(REGISTRY_V1 if old_schema else REGISTRY, ("fraud_score", "is_fraud"))
    assert encoder._fast and encoder.carries_source is not old_schema
    events = EventBatch.from_ids(np.arange(len(rows)), [r[0] for r in rows],
                                 np.asarray([r[1] for r in rows], dtype=np.int64))
    outputs = {"fraud_score": np.asarray([r[2] for r in rows], dtype=np.float32),
               "is_fraud": np.asarray([r[3] for r in rows], dtype=bool)}
    source = InputSource(names[2], np.asarray([r[4] for r in rows], dtype=np.int32),
                         np.asarray([r[5] for r in rows], dtype=np.int64))
    kwargs = {"model_name": names[0], "model_version": names[1], "predicted_ts_ms": predicted,
              "batch_size": batch_size, "source": source}
    expected = encoder._encode_slow(events, outputs, **kwargs)
    with codec_impl(impl):
        assert encoder.encode_batch(events, outputs, **kwargs) == expected
        # The joined form (what the native producer takes): the same bytes back to back, each value's end offset.
        joined, ends = encoder.encode_joined(events, outputs, **kwargs)
    assert joined == b"".join(expected) and ends.tolist() == np.cumsum([len(v) for v in expected]).tolist()
    assert ends.dtype == np.int64
    encoder._fast = False  # a schema without the fast path joins fastavro's values
    slow_joined, slow_ends = encoder.encode_joined(events, outputs, **kwargs)
    assert slow_joined == joined and slow_ends.tolist() == ends.tolist() and slow_ends.dtype == np.int64


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
    ids = np.frombuffer(b"\x02a", dtype=np.uint8)
    with pytest.raises(ValueError, match="out of id_buf"):
        codec._nativecodec.encode_predictions(
            EVENT.header, ids, np.array([0, 1]), np.array([2, 2]), b"", np.zeros(2, dtype=np.float32),
            np.zeros(2, dtype=bool), np.zeros(2, dtype=np.int64), b"", None, None, np.empty(2, dtype=np.int64))


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
