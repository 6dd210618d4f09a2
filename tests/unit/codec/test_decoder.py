"""Raw framed values to model inputs: ColumnDecoder (header, writer schema, plan) and InputBinder (columns to
inputs, bad rows out), on the demo's schemas and on a schema of another shape, in C and in the reference."""

from __future__ import annotations

import io
import os
import random
from typing import Any

import numpy as np
import pytest
from fastavro import parse_schema, schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st

from producers.events import generate_events
from stream.codec import decoder as decoder_module
from stream.codec.columns import reader_columns
from stream.codec.decoder import ColumnDecoder
from stream.codec.registry import FolderRegistry, WriterSchema
from stream.errors import ConfigError
from stream.kafka.records import Records
from stream.models import InputSpec
from stream.models.demo import DemoFraudHandler
from stream.pipeline.inputs import InputBinder, input_side, parse_input_map

FUZZ_EXAMPLES = int(os.environ.get("STREAM_TEST_FUZZ_EXAMPLES", "2000"))
FOLDER = FolderRegistry.from_dir()
EVENT = FOLDER.latest("stream.demo.FraudEvent")
IMPLS = ["c", "reference"] if decoder_module._nativecodec is not None else ["reference"]


def framed(schema: WriterSchema, record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    buf.write(b"\x00" + schema.schema_id.to_bytes(4, "big"))
    schemaless_writer(buf, parse_schema(schema.raw), record)
    return buf.getvalue()


def event_bytes(**overrides: object) -> bytes:
    record = {"event_id": "e-1", "key": "acct-1", "ts_ms": 1_700_000_000_000, "features": [0.5] * 32}
    record.update(overrides)
    return framed(EVENT, record)


def demo_side(impl: str) -> tuple[ColumnDecoder, InputBinder]:
    handler = DemoFraudHandler()
    decoder, binder = input_side(handler.inputs, FOLDER, EVENT, copies=handler.copy_fields)
    decoder._native = decoder_module._nativecodec if impl == "c" else None
    return decoder, binder


def run(impl: str, values: list[bytes | None], max_bytes: int | None = None) -> tuple[Any, Any, list[Any]]:
    decoder, binder = demo_side(impl)
    decoded, errors = decoder.decode_batch(values, max_bytes)
    inputs, good, bad = binder.bind(decoded)
    errors = sorted(errors + [(int(decoded.index[r]), e) for r, e in bad], key=lambda e: e[0])
    return decoded.take(good), inputs, errors


@pytest.mark.parametrize("impl", IMPLS)
def test_generated_events_become_the_models_matrix_and_the_copied_columns(impl: str) -> None:
    block = generate_events(50, seed=3, ts_ms=123)
    values: list[bytes | None] = [framed(EVENT, r) for r in block.records()]
    decoded, inputs, errors = run(impl, values)
    assert errors == []
    features = inputs["features"]
    assert features.dtype == np.float32 and features.shape == (50, 32)
    assert features.flags.writeable, "torch wraps it without a copy; read-only memory makes it warn"
    np.testing.assert_array_equal(features, block.features)
    assert [decoded["event_id"].row(i) for i in range(50)] == block.event_ids
    assert decoded["ts_ms"].values.tolist() == [123] * 50
    assert decoded.index.tolist() == list(range(50))


PREDICTION = FOLDER.latest("stream.demo.FraudPrediction")


@pytest.mark.parametrize(("value", "reason"), [
    (None, "null-value"),
    (b"\x00\x00", "truncated"),
    (b"\x01" + event_bytes()[1:], "bad-magic"),
    (b"\x00\x00\x00\x03\xe7" + event_bytes()[5:], "unknown-schema"),
    (event_bytes()[:-7], "corrupt-avro"),
    (event_bytes() + b"\x00", "corrupt-avro"),
    (event_bytes(features=[1.0] * 31), "shape"),
    (event_bytes(features=[float("nan")] + [0.0] * 31), "non-finite"),
    (event_bytes(features=[float("inf")] + [0.0] * 31), "non-finite"),
    (event_bytes() + b"\x00" * 200, "oversized"),
    (framed(PREDICTION, {"event_id": "x", "model_name": "m", "model_version": "1", "fraud_score": 0.5,
                         "is_fraud": False, "event_ts_ms": 1, "predicted_ts_ms": 2, "batch_size": 1,
                         "input_topic": "t", "input_partition": 0, "input_offset": 0}), "incompatible-schema"),
])
@pytest.mark.parametrize("impl", IMPLS)
def test_bad_records_are_typed_errors_and_the_rest_of_the_batch_decodes(value: bytes | None, reason: str,
                                                                        impl: str) -> None:
    good = event_bytes()
    decoded, inputs, errors = run(impl, [good, value, good], max_bytes=300)
    assert decoded.index.tolist() == [0, 2] and len(inputs["features"]) == 2
    assert [(i, e.reason) for i, e in errors] == [(1, reason)]


ORDER_V1 = {"type": "record", "name": "Order", "namespace": "acme", "fields": [
    {"name": "order_id", "type": "string"}, {"name": "amount", "type": "float"}, {"name": "qty", "type": "int"},
    {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
        {"name": "tier", "type": "int"}, {"name": "note", "type": ["null", "string"]}]}}]}
ORDER_V2 = {"type": "record", "name": "Order", "namespace": "acme", "fields": [
    {"name": "qty", "type": "long"}, {"name": "order_id", "type": "string"}, {"name": "amount", "type": "double"},
    {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
        {"name": "note", "type": ["null", "string"]}, {"name": "tier", "type": "int"},
        {"name": "age", "type": ["null", "long"], "default": None}]}}]}


class OrderSource:
    description = "two versions of acme.Order"

    def __init__(self) -> None:
        from stream.codec.columns import normalize

        self.v1 = WriterSchema(11, ORDER_V1, normalize(ORDER_V1))
        self.v2 = WriterSchema(12, ORDER_V2, normalize(ORDER_V2))

    def by_id(self, schema_id: int) -> WriterSchema | None:
        return {11: self.v1, 12: self.v2}.get(schema_id)

    def latest(self, subject: str) -> WriterSchema:
        return self.v2

    def register(self, subject: str, schema: Any) -> WriterSchema:
        raise NotImplementedError

    def close(self) -> None:
        pass


@pytest.mark.parametrize("impl", IMPLS)
def test_two_versions_interleaved_in_one_batch_feed_a_model_of_other_names(impl: str) -> None:
    source = OrderSource()
    reader = source.latest("orders-value")
    columns, _ = reader_columns(reader.normalized)
    inputs_spec = (InputSpec("amount", "float32"), InputSpec("quantity", "int64"), InputSpec("tier", "float32"),
                   InputSpec("age", "int64"))
    binder = InputBinder(inputs_spec, columns, parse_input_map("quantity=qty,tier=customer.tier,age=customer.age"))
    decoder = ColumnDecoder(source, reader, [*binder.columns, next(c for c in columns if c.path == "order_id")])
    decoder._native = decoder_module._nativecodec if impl == "c" else None
    values: list[bytes | None] = []
    for i in range(6):
        if i % 2:
            values.append(framed(source.v1, {"order_id": f"o{i}", "amount": 1.5 * i, "qty": i,
                                             "customer": {"tier": i, "note": None}}))
        else:
            values.append(framed(source.v2, {"order_id": f"o{i}", "amount": 2.5 * i, "qty": 10 * i,
                                             "customer": {"note": "n", "tier": -i, "age": 30 + i}}))
    decoded, errors = decoder.decode_batch(values)
    assert errors == [] and decoded.index.tolist() == list(range(6))
    inputs, good, bad = binder.bind(decoded)
    assert [(int(decoded.index[r]), e.reason) for r, e in bad] == [(1, "null-input"), (3, "null-input"),
                                                                      (5, "null-input")], "v1 has no age"
    assert good.tolist() == [0, 2, 4]
    assert inputs["quantity"].tolist() == [0, 20, 40] and inputs["quantity"].dtype == np.int64
    assert inputs["amount"].tolist() == [0.0, 5.0, 10.0] and inputs["amount"].dtype == np.float32
    assert inputs["age"].tolist() == [30, 32, 34]
    assert [decoded["order_id"].row(i) for i in range(6)] == [f"o{i}" for i in range(6)]


def test_inputs_that_do_not_fit_the_schema_are_refused_one_line_each() -> None:
    columns, _ = reader_columns(EVENT.normalized)
    with pytest.raises(ConfigError) as caught:
        InputBinder((InputSpec("features", "float32", (32,)), InputSpec("ts", "int32"),
                     InputSpec("x", "float32"), InputSpec("key", "float32")), columns,
                    parse_input_map("ts=ts_ms,nope=key"))
    lines = str(caught.value).splitlines()[1:]
    assert lines == [
        "  --input-map names 'nope', which is not an input of the model (its inputs: features, key, ts, x)",
        "  input ts (int32) <- ts_ms (long): long values cannot be read as int32",
        "  input x (float32): the input schema has no field 'x'; bind one with --input-map x=FIELD",
        "  input key (float32) <- key (string): string values cannot be read as float32",
    ]
    with pytest.raises(ConfigError, match="expected INPUT=FIELD"):
        parse_input_map("features")


def decoded_alike(value: bytes) -> tuple[list[str], bytes]:
    """The error reasons and the decoded features of ``value``, the same from every implementation (asserted)."""
    results = []
    for impl in IMPLS:
        decoded, inputs, errors = run(impl, [value])
        assert len(decoded) + len(errors) == 1
        assert len(inputs["features"]) == len(decoded)
        results.append(([e.reason for _, e in errors], inputs["features"].tobytes()))
    assert all(r == results[0] for r in results), f"C and the reference disagree on {value!r}: {results}"
    return results[0]


@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_random_bytes_only_typed_errors(data: bytes) -> None:
    decoded_alike(data)


def mutated(rng: random.Random, base: bytes) -> bytes:
    """A valid event with a few bytes of its body overwritten, then cut short or with bytes added."""
    value = bytearray(base)
    for _ in range(rng.randint(1, 4)):
        value[rng.randrange(5, len(value))] = rng.randrange(256)
    if rng.random() < 0.3:
        del value[rng.randrange(5, len(value)):]
    elif rng.random() < 0.3:
        value += bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    return bytes(value)


@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_fuzz_mutated_events_decode_alike_in_c_and_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    base = event_bytes(event_id=f"e-{seed}", key="k" * rng.randint(0, 80),
                       features=[rng.uniform(-5, 5) for _ in range(32)])
    decoded_alike(mutated(rng, base))


def test_mutations_reach_the_body_decoder_both_ways() -> None:
    """What the fuzz above feeds the decoder: past the header every time, some decoding whole, most refused in the
    body (a random value would rarely get past the 5-byte header)."""
    rng = random.Random(7)
    reasons: dict[str, int] = {}
    for i in range(2000):
        errors, _ = decoded_alike(mutated(rng, event_bytes(event_id=f"e-{i}")))
        for reason in errors or ["decoded"]:
            reasons[reason] = reasons.get(reason, 0) + 1
    assert reasons.get("decoded", 0) > 100 and reasons.get("corrupt-avro", 0) > 100, reasons
    assert not {"bad-magic", "unknown-schema"} & set(reasons), reasons


@settings(max_examples=max(FUZZ_EXAMPLES // 4, 500), deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_valid_header_random_body(body: bytes) -> None:
    value = b"\x00" + EVENT.schema_id.to_bytes(4, "big") + body
    results = []
    for impl in IMPLS:
        decoded, inputs, errors = run(impl, [value])
        assert len(decoded) + len(errors) == 1
        results.append(([e.reason for _, e in errors], inputs["features"].tobytes()))
    assert all(r == results[0] for r in results), "C and the reference agree"


def utf8_probe(raw: bytes) -> bytes:
    """An event whose ``event_id`` (a string the decoder reads: it is copied into predictions) holds ``raw``."""
    placeholder = "?" * len(raw)
    value = event_bytes(event_id=placeholder)
    at = 6  # the header, then event_id (the first field) as a one-byte length and its bytes
    assert value[at:at + len(raw)] == placeholder.encode()
    return value[:at] + raw + value[at + len(raw):]


@settings(max_examples=max(FUZZ_EXAMPLES // 2, 500), deadline=None)
@given(st.lists(st.binary(min_size=1, max_size=12) | st.sampled_from([
    b"\xc0\x80", b"\xc1\xbf", b"\xe0\x80\x80", b"\xe0\xa0\x80", b"\xed\x9f\xbf", b"\xed\xa0\x80", b"\xef\xbf\xbf",
    b"\xf0\x8f\xbf\xbf", b"\xf0\x90\x80\x80", b"\xf4\x8f\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80",
    b"\xe2\x82", b"\xe2\x82\xac", b"caf\xc3\xa9", b"\xff"]), min_size=1, max_size=8))
def test_strings_are_utf8_exactly_as_python_decodes_them_in_both_input_forms(raws: list[bytes]) -> None:
    """The C decoder checks UTF-8 itself (it runs without the GIL on the worker's joined records): it takes and
    refuses what Python's strict decoder does, overlong forms, surrogates and code points past U+10FFFF included,
    on a list of values and on the joined form alike."""

    def valid(raw: bytes) -> bool:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return True

    values = [utf8_probe(raw) for raw in raws]
    want = [i for i, raw in enumerate(raws) if not valid(raw)]
    for impl in IMPLS:
        decoder, _ = demo_side(impl)
        for given_values in (values, Records.build(values, [None] * len(values), [0] * len(values),
                                                   range(len(values)))):
            decoded, errors = decoder.decode_batch(given_values)
            assert [i for i, e in errors if e.reason == "corrupt-avro"] == want, (impl, type(given_values))
            assert decoded.index.tolist() == [i for i in range(len(raws)) if i not in want]
            assert [decoded["event_id"].row(r) for r in range(len(decoded))] == [
                raws[i].decode("utf-8") for i in decoded.index.tolist()]


def test_an_unknown_id_is_asked_again_after_a_while_a_known_one_never() -> None:
    asked: list[int] = []

    class Late(OrderSource):
        """A registry that learns of schema 12 only after the first question."""

        def by_id(self, schema_id: int) -> WriterSchema | None:
            asked.append(schema_id)
            return None if asked.count(12) == 1 and schema_id == 12 else super().by_id(schema_id)

    now = [0.0]
    source = Late()
    reader = source.latest("orders-value")
    columns, _ = reader_columns(reader.normalized)
    decoder = ColumnDecoder(source, reader, [c for c in columns if c.path == "order_id"], clock=lambda: now[0])
    value = framed(source.v2, {"order_id": "o", "amount": 1.0, "qty": 1,
                               "customer": {"note": None, "tier": 1, "age": None}})
    assert [e.reason for _, e in decoder.decode_batch([value])[1]] == ["unknown-schema"]
    now[0] += 5.0
    assert [e.reason for _, e in decoder.decode_batch([value])[1]] == ["unknown-schema"], "not asked again yet"
    now[0] += 6.0
    decoded, errors = decoder.decode_batch([value, value])
    assert errors == [] and decoded["order_id"].row(1) == "o"
    now[0] += 1000.0
    decoder.decode_batch([value])
    assert asked == [12, 12], "a known id is never asked again"


def test_records_naming_schema_ids_at_random_neither_ask_the_registry_each_nor_grow_the_cache(
        caplog: pytest.LogCaptureFixture) -> None:
    """A producer writing random ids in the header (a bug, or an attack) made one registry request a record and
    kept a plan for each id for ever (1,000,000 ids: a million requests and 323 MiB, measured ad hoc). Now the
    source is asked about ids not cached at LOOKUPS_PER_S after a LOOKUP_BURST, the others' records are
    dead-lettered as lookup-limited (one WARNING a minute says so), at most MAX_UNKNOWN_IDS unknown ids are kept,
    and the ids already known decode all along, without a question."""
    asked: list[int] = []

    class Counting(OrderSource):
        def by_id(self, schema_id: int) -> WriterSchema | None:
            asked.append(schema_id)
            return super().by_id(schema_id)

    now = [0.0]
    source = Counting()
    reader = source.latest("orders-value")
    columns, _ = reader_columns(reader.normalized)
    decoder = ColumnDecoder(source, reader, [c for c in columns if c.path == "order_id"], clock=lambda: now[0])
    order = {"order_id": "o", "amount": 1.0, "qty": 1, "customer": {"note": None, "tier": 1, "age": None}}
    known = framed(source.v2, order)
    assert decoder.decode_batch([known])[1] == [] and asked == [12]
    rng = random.Random(7)
    body = known[5:]

    def flood(n: int) -> list[bytes]:
        return [b"\x00" + rng.randrange(1000, 2**31).to_bytes(4, "big") + body for _ in range(n)]

    with caplog.at_level("WARNING", logger="stream.codec.decoder"):
        decoded, errors = decoder.decode_batch([known, *flood(3 * 4096)])
    assert decoded.index.tolist() == [0], "the known id decodes, unasked"
    reasons = [e.reason for _, e in errors]
    burst = decoder_module.LOOKUP_BURST  # schema 12's lookup took one
    assert len(asked) == burst and reasons.count("unknown-schema") == burst - 1
    assert reasons.count("lookup-limited") == 3 * 4096 - (burst - 1)
    [warning] = [r.getMessage() for r in caplog.records]
    assert "dead-lettered as lookup-limited" in warning
    limited = next(e for _, e in errors if e.reason == "lookup-limited")
    assert "records named more than 20 new schema ids a second" in str(limited)
    for _ in range(60):  # a minute of it, one batch a second
        now[0] += 1.0
        decoded, errors = decoder.decode_batch([*flood(4096), known])
        assert decoded.index.tolist() == [4096] and len(errors) == 4096
    assert len(asked) == burst + 60 * int(decoder_module.LOOKUPS_PER_S)
    assert len(decoder._unknown) == decoder_module.MAX_UNKNOWN_IDS < len(asked) - 1
    assert len(caplog.records) == 2, "one WARNING a minute"
    # The flood over, a new id is asked about at once: schema 11, registered all along.
    now[0] += 1.0
    v1 = framed(source.v1, {"order_id": "p", "amount": 2.0, "qty": 2, "customer": {"tier": 1, "note": None}})
    decoded, errors = decoder.decode_batch([v1])
    assert errors == [] and decoded["order_id"].row(0) == "p" and asked[-1] == 11
