"""The load generator's framed events (`producers.frames`) against fastavro's encoding."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from producers.events import generate_events
from producers.frames import EventFrames
from stream.codec import SchemaRegistry, avro_long, encode
from stream.models.demo import EVENT_SCHEMA, PREDICTION_SCHEMA

REGISTRY = SchemaRegistry.from_dir()
EVENT = REGISTRY.by_name(EVENT_SCHEMA)


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
