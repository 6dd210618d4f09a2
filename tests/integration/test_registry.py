"""The schema registry client against a real Confluent-compatible registry (Apicurio, started by the fixture),
with schemas registered by confluent-kafka's own AvroSerializer, the client upstream services use."""

from __future__ import annotations

import io
import json
from collections.abc import Callable

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from fastavro import parse_schema, schemaless_writer

from stream.codec.columns import reader_columns
from stream.codec.plan import resolve
from stream.codec.reference import decode_columns
from stream.codec.registry import HttpRegistry, RegistryUnavailable, subject_name
from stream.errors import ConfigError
from stream.local.broker import free_port

pytestmark = pytest.mark.integration

ORDER_V1 = {"type": "record", "name": "Order", "namespace": "acme.shop", "fields": [
    {"name": "order_id", "type": "string"}, {"name": "amount", "type": "float"}, {"name": "qty", "type": "int"}]}
ORDER_V2 = {"type": "record", "name": "Order", "namespace": "acme.shop", "fields": [
    {"name": "qty", "type": "long"}, {"name": "order_id", "type": "string"}, {"name": "amount", "type": "double"},
    {"name": "coupon", "type": ["null", "string"], "default": None}]}


def test_writer_schemas_of_two_versions_resolve_to_the_latest_and_decode_together(
        schema_registry: str, unique_name: Callable[[str], str], request: pytest.FixtureRequest) -> None:
    topic = unique_name("orders")
    ctx = SerializationContext(topic, MessageField.VALUE)
    with SchemaRegistryClient({"url": schema_registry}) as client:
        old = AvroSerializer(client, json.dumps(ORDER_V1))({"order_id": "a", "amount": 1.5, "qty": 2}, ctx)
        new = AvroSerializer(client, json.dumps(ORDER_V2))({"order_id": "b", "amount": 2.25, "qty": 3,
                                                             "coupon": "X"}, ctx)
    registry = HttpRegistry(schema_registry)
    request.addfinalizer(registry.close)
    reader = registry.latest(subject_name("topic", topic, "acme.shop.Order"))
    assert reader.schema_id == int.from_bytes(new[1:5], "big")
    columns, _ = reader_columns(reader.normalized)
    rows = []
    for value in (old, new, old):
        writer = registry.by_id(int.from_bytes(value[1:5], "big"))
        assert writer is not None
        decoded, errors = decode_columns(resolve(writer.normalized, reader.normalized, columns), [value[5:]])
        assert errors == []
        rows += decoded.rows()
    assert rows == [{"qty": 2, "order_id": "a", "amount": 1.5, "coupon": None},
                    {"qty": 3, "order_id": "b", "amount": 2.25, "coupon": "X"},
                    {"qty": 2, "order_id": "a", "amount": 1.5, "coupon": None}]
    assert registry.by_id(2**31 - 7) is None  # an id nobody registered


def test_a_registered_output_schema_is_read_by_avro_deserializer_and_refused_when_incompatible(
        schema_registry: str, unique_name: Callable[[str], str], request: pytest.FixtureRequest) -> None:
    topic = unique_name("predictions")
    registry = HttpRegistry(schema_registry)
    request.addfinalizer(registry.close)
    schema = {"type": "record", "name": "Score", "namespace": "acme.ml", "fields": [
        {"name": "order_id", "type": "string"}, {"name": "score", "type": "float"}]}
    subject = subject_name("topic", topic, "acme.ml.Score")
    first = registry.register(subject, schema)
    assert registry.register(subject, schema).schema_id == first.schema_id  # found, not registered twice
    buf = io.BytesIO()
    buf.write(b"\x00" + first.schema_id.to_bytes(4, "big"))
    schemaless_writer(buf, parse_schema(schema), {"order_id": "o-1", "score": 0.5})
    with SchemaRegistryClient({"url": schema_registry}) as client:
        assert AvroDeserializer(client)(buf.getvalue(), SerializationContext(topic, MessageField.VALUE)) == {
            "order_id": "o-1", "score": 0.5}
        client.set_compatibility(subject, "BACKWARD")
    breaking = {**schema, "fields": [{"name": "order_id", "type": "long"}]}
    with pytest.raises(ConfigError, match="refused the schema"):
        registry.register(subject, breaking)


def test_an_unreachable_registry_is_unavailable_not_unknown() -> None:
    with HttpRegistry(f"http://127.0.0.1:{free_port()}", {"timeout": 1}) as registry, \
            pytest.raises(RegistryUnavailable, match="schema id 1"):
        registry.by_id(1)
