"""Output plans against fastavro: derived and given output schemas, copied fields, outputs and lineage, in C and
with fastavro record by record; what the downstream AvroDeserializer reads."""

from __future__ import annotations

import io
import os
from typing import Any

import numpy as np
import pytest
from fastavro import parse_schema, schemaless_reader, schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st

from stream.codec import InputSource
from stream.codec import encoder as encoder_module
from stream.codec.columns import normalize, reader_columns
from stream.codec.encoder import LINEAGE, OutputEncoder, derive_schema, parse_copy_fields
from stream.codec.plan import resolve
from stream.codec.reference import decode_columns
from stream.codec.registry import WriterSchema
from stream.errors import ConfigError
from stream.models import OutputSpec

EXAMPLES = int(os.environ.get("STREAM_TEST_PLAN_EXAMPLES", "150"))
IMPLS = ["c", "fastavro"] if encoder_module._nativecodec is not None else ["fastavro"]

INPUT = {"type": "record", "name": "Order", "namespace": "acme", "fields": [
    {"name": "order_id", "type": "string"},
    {"name": "qty", "type": "int"},
    {"name": "amount", "type": "float"},
    {"name": "flag", "type": "boolean"},
    {"name": "note", "type": ["null", "string"]},
    {"name": "coupon", "type": ["null", "long"]},
    {"name": "tags", "type": {"type": "array", "items": "double"}},
    {"name": "customer", "type": {"type": "record", "name": "C", "fields": [{"name": "id", "type": "long"}]}},
]}
OUTPUTS = (OutputSpec("score", "float"), OutputSpec("label", "string"), OutputSpec("embedding", "array<float>"),
           OutputSpec("rank", "long"), OutputSpec("ok", "boolean"))
COPIES = "order_id,qty,amount,flag,note,coupon,tags,customer_id=customer.id"

order = st.fixed_dictionaries({
    "order_id": st.text(max_size=20), "qty": st.integers(-(2**31), 2**31 - 1),
    "amount": st.floats(width=32, allow_nan=False), "flag": st.booleans(), "note": st.none() | st.text(max_size=5),
    "coupon": st.none() | st.integers(-(2**63), 2**63 - 1), "tags": st.lists(st.floats(allow_nan=False), max_size=4),
    "customer": st.fixed_dictionaries({"id": st.integers(-(2**63), 2**63 - 1)})})


def framed_body(schema: Any, record: Any) -> bytes:
    buf = io.BytesIO()
    schemaless_writer(buf, parse_schema(schema), record)
    return buf.getvalue()


def decoded_orders(records: list[dict[str, Any]]) -> Any:
    reader = normalize(INPUT)
    columns, _ = reader_columns(reader)
    decoded, errors = decode_columns(resolve(reader, reader, columns), [framed_body(INPUT, r) for r in records])
    assert errors == []
    return decoded, {c.path: c for c in columns}


def make_encoder(impl: str, schema: dict[str, Any] | None = None, schema_id: int = 77) -> tuple[OutputEncoder, Any]:
    _, by_path = decoded_orders([])
    copies = [(name, by_path[path]) for name, path in parse_copy_fields(COPIES)]
    schema = schema or derive_schema("acme-scorer", "acme.predictions", copies, OUTPUTS)
    enc = OutputEncoder(WriterSchema(schema_id, schema, normalize(schema)), copies, OUTPUTS, native=impl == "c")
    return enc, schema


@pytest.mark.parametrize("impl", IMPLS)
@settings(max_examples=EXAMPLES, deadline=None)
@given(records=st.lists(order, min_size=1, max_size=6), seed=st.integers(0, 2**32 - 1))
def test_predictions_read_back_with_fastavro_as_written(impl: str, records: list[dict[str, Any]], seed: int) -> None:
    decoded, _ = decoded_orders(records)
    enc, schema = make_encoder(impl)
    n = len(records)
    rng = np.random.default_rng(seed)
    outputs = {"score": rng.random(n).astype(np.float32), "label": [f"l{i}é" for i in range(n)],
               "embedding": rng.standard_normal((n, 3)).astype(np.float32), "rank": rng.integers(-5, 2**40, n),
               "ok": rng.random(n) > 0.5}
    source = InputSource("orders", rng.integers(0, 9, n).astype(np.int32), rng.integers(0, 2**40, n))
    values = enc.encode_batch(decoded, outputs, model_name="m", model_version="v7", predicted_ts_ms=1234,
                              batch_size=n, source=source)
    parsed = parse_schema(schema)
    for i, value in enumerate(values):
        assert value[:5] == b"\x00\x00\x00\x00\x4d"
        got = schemaless_reader(io.BytesIO(value[5:]), parsed, None)
        r = records[i]
        assert got == {
            "order_id": r["order_id"], "qty": r["qty"], "amount": r["amount"], "flag": r["flag"], "note": r["note"],
            "coupon": r["coupon"], "tags": r["tags"], "customer_id": r["customer"]["id"],
            "score": float(outputs["score"][i]), "label": outputs["label"][i],
            "embedding": [float(x) for x in outputs["embedding"][i]], "rank": int(outputs["rank"][i]),
            "ok": bool(outputs["ok"][i]), "model_name": "m", "model_version": "v7", "predicted_ts_ms": 1234,
            "batch_size": n, "input_topic": "orders", "input_partition": int(source.partitions[i]),
            "input_offset": int(source.offsets[i])}
        assert len(value) == 5 + len(framed_body(schema, got)), "nothing after the record"


@pytest.mark.parametrize("impl", IMPLS)
def test_a_given_schema_fills_other_fields_from_defaults_and_writes_promoted_types(impl: str) -> None:
    schema = {"type": "record", "name": "Out", "fields": [
        {"name": "qty", "type": "long"}, {"name": "score", "type": ["null", "double"]},
        {"name": "region", "type": "string", "default": "eu"}, {"name": "model_name", "type": "string"},
        {"name": "input_offset", "type": "long"}]}
    decoded, by_path = decoded_orders([{"order_id": "a", "qty": 3, "amount": 1.0, "flag": True, "note": None,
                                        "coupon": None, "tags": [], "customer": {"id": 1}}])
    enc = OutputEncoder(WriterSchema(5, schema, normalize(schema)), [("qty", by_path["qty"])],
                        [OutputSpec("score", "float")], native=impl == "c")
    assert not enc.carries_source
    value = enc.encode_batch(decoded, {"score": np.asarray([0.25], dtype=np.float32)}, model_name="m",
                             model_version="1", predicted_ts_ms=0, batch_size=1,
                             source=InputSource("t", np.zeros(1, dtype=np.int32), np.asarray([42])))[0]
    assert schemaless_reader(io.BytesIO(value[5:]), parse_schema(schema), None) == {
        "qty": 3, "score": 0.25, "region": "eu", "model_name": "m", "input_offset": 42}


def test_an_output_schema_that_does_not_fit_is_refused_one_line_per_field() -> None:
    schema = {"type": "record", "name": "Out", "fields": [
        {"name": "qty", "type": "int"}, {"name": "score", "type": "int"}, {"name": "owner", "type": "string"},
        {"name": "note", "type": "string"}, {"name": "both", "type": ["string", "long"]}]}
    _, by_path = decoded_orders([])
    with pytest.raises(ConfigError) as caught:
        OutputEncoder(WriterSchema(5, schema, normalize(schema)),
                      [("qty", by_path["qty"]), ("note", by_path["note"]), ("extra", by_path["amount"])],
                      [OutputSpec("score", "float")])
    assert str(caught.value).splitlines()[1:] == [
        "  score: a float (output score) cannot be written as int",
        "  owner (string): no copied field, model output or lineage field fills it, and it has no default",
        "  note <- note: the input field can be null, the output field cannot",
        "  both: unions other than [null, T] are not supported",
        "  --copy-fields extra: the output schema Out has no such field",
    ]


def test_derived_schemas_name_their_fields_once() -> None:
    _, by_path = decoded_orders([])
    with pytest.raises(ConfigError, match="'model_name' comes from two places"):
        derive_schema("m", "ns", [("model_name", by_path["order_id"])], ())
    assert [f["name"] for f in derive_schema("m", "ns", [], ())["fields"]] == list(LINEAGE)
    with pytest.raises(ConfigError, match="expected FIELD or OUTPUT=FIELD"):
        parse_copy_fields("a,=b")
