from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from stream.codec import SchemaRegistry, encode
from stream.errors import ConfigError, DecodeError
from stream.models.demo import EVENT_SCHEMA

REGISTRY = SchemaRegistry.from_dir()
EVENT = REGISTRY.by_name(EVENT_SCHEMA)
# The prediction schema as first published (id 2), before the input_* fields: still encodable, fast.
REGISTRY_V1 = SchemaRegistry([(1, EVENT.raw), (2, REGISTRY.by_id(2).raw)])  # type: ignore[union-attr]


try:
    from stream.codec import _nativecodec
except ImportError:  # not compiled (optional extension)
    _nativecodec = None  # type: ignore[assignment]
needs_codec_extension = pytest.mark.skipif(_nativecodec is None, reason="stream.codec._nativecodec is not built")


def test_the_codec_extension_is_built_where_ci_requires_it() -> None:
    """CI sets STREAM_REQUIRE_NATIVE=1: a lost compiler must fail the run, not skip the C half of the tests."""
    if os.environ.get("STREAM_REQUIRE_NATIVE") == "1":
        assert _nativecodec is not None


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


@needs_codec_extension
def test_c_codec_refuses_buffers_of_the_wrong_size() -> None:
    with pytest.raises(ValueError, match="ids: need 3 items"):
        _nativecodec.read_ids([event_bytes()] * 3, np.empty(2, dtype=np.int64))
    with pytest.raises(ValueError, match=r"offsets: need n \+ 1 int64"):
        _nativecodec.encode_rows(b"\x00\x00\x00\x00\x01", np.asarray([6, 0, 1], dtype=np.int32), [],
                                       [np.zeros(3, dtype=np.uint8), np.zeros(2, dtype=np.int64)], 2,
                                       np.empty(2, dtype=np.int64))
