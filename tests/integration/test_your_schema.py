"""A schema and a model the project has never seen, through a real schema registry (Apicurio) and Kafka: events
written by confluent-kafka's AvroSerializer in two versions of their schema, an exported model, predictions read
by AvroDeserializer with no other setup."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from stream.pipeline.processing import DLQ_ERROR_REASON
from tests.integration.harness import Pipeline

pytestmark = pytest.mark.integration

ORDER_V1 = {"type": "record", "name": "Order", "namespace": "acme.shop", "fields": [
    {"name": "order_id", "type": "string"},
    {"name": "amount", "type": "float"},
    {"name": "qty", "type": "int"},
    {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
        {"name": "id", "type": "long"}, {"name": "country", "type": "string"}]}},
    {"name": "note", "type": ["null", "string"], "default": None},
]}
# Version 2: fields reordered, qty promoted to long and amount to double, a field added with a default, note gone.
ORDER_V2 = {"type": "record", "name": "Order", "namespace": "acme.shop", "fields": [
    {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
        {"name": "country", "type": "string"}, {"name": "id", "type": "long"}]}},
    {"name": "qty", "type": "long"},
    {"name": "order_id", "type": "string"},
    {"name": "amount", "type": "double"},
    {"name": "channel", "type": "string", "default": "web"},
]}


class OrderModel(torch.nn.Module):
    def forward(self, spend: torch.Tensor, items: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        score = torch.sigmoid(spend * 0.01 - items.float() * 0.1)
        return score, torch.stack([spend, items.float(), score], dim=1)


def export_model(path: Path) -> None:
    batch = torch.export.Dim("batch")
    program = torch.export.export(OrderModel(), (torch.randn(4), torch.ones(4, dtype=torch.int64)),
                                  dynamic_shapes={"spend": {0: batch}, "items": {0: batch}})
    torch.export.save(program, str(path), extra_files={"stream.json": json.dumps({
        "name": "order-scorer", "version": "1",
        "outputs": [{"name": "score", "type": "float"}, {"name": "features", "type": "array<float>"}]})})


def read(bootstrap: str, topic: str, count: int, timeout_s: float = 60.0,
         ) -> list[tuple[bytes | None, dict[str, bytes]]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{topic}", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "isolation.level": "read_committed"})
    c.subscribe([topic])
    out: list[tuple[bytes | None, dict[str, bytes]]] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count and time.monotonic() < deadline:
        for m in c.consume(500, 0.2):
            if m.error() is None:
                out.append((m.value(), dict(m.headers() or [])))
    c.close()
    return out


def test_two_versions_of_a_new_schema_through_an_exported_model_are_read_back_by_avro_deserializer(
        pipeline: Pipeline, schema_registry: str, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    export_model(tmp_path / "orders.pt2")
    dlq = unique_name("dlq")
    client = SchemaRegistryClient({"url": schema_registry})
    ctx = SerializationContext(pipeline.input, MessageField.VALUE)
    v1, v2 = AvroSerializer(client, json.dumps(ORDER_V1)), AvroSerializer(client, json.dumps(ORDER_V2))
    producer = Producer({"bootstrap.servers": pipeline.bootstrap})
    expected = {}
    for i in range(600):
        order = {"order_id": f"o-{i}", "amount": 10.0 + i, "qty": i % 7,
                 "customer": {"id": 1000 + i, "country": "NO"}}
        # v1 first: the registry's latest version, the one the worker reads as, is v2
        value = v2(order, ctx) if i % 2 else v1({**order, "note": None if i % 3 else "gift"}, ctx)
        producer.produce(pipeline.input, value, f"k{i % 13}".encode())
        expected[f"o-{i}"] = order
        if i == 300:  # framed with an id no registry gave out
            producer.produce(pipeline.input, b"\x00\x7f\xff\xff\x00" + value[5:], b"stray")
    assert producer.flush(30) == 0
    worker = pipeline.worker("--schema-registry-url", schema_registry, "--model", f"export:{tmp_path / 'orders.pt2'}",
                             "--input-map", "spend=amount,items=qty",
                             "--copy-fields", "order_id,customer_id=customer.id",
                             "--dlq-topic", dlq, "--stop-at-end", "--max-wait-ms", "5")
    assert worker.wait(120) == 0, worker.output()[-3000:]

    deserialize = AvroDeserializer(client)
    out_ctx = SerializationContext(pipeline.output, MessageField.VALUE)
    predictions = [deserialize(v, out_ctx) for v, _ in read(pipeline.bootstrap, pipeline.output, 600)]
    counts = Counter(p["order_id"] for p in predictions)
    assert set(counts) == set(expected) and max(counts.values()) == 1, "every order once, none twice"
    for p in predictions:
        order = expected[p["order_id"]]
        assert p["customer_id"] == order["customer"]["id"]
        assert p["features"][:2] == [pytest.approx(order["amount"]), float(order["qty"])]
        assert 0.0 < p["score"] < 1.0
        assert (p["model_name"], p["model_version"], p["input_topic"]) == ("order-scorer", "1", pipeline.input)
    registered = client.get_latest_version(f"{pipeline.output}-value")
    assert json.loads(registered.schema.schema_str)["fields"][0]["name"] == "order_id"

    dead = read(pipeline.bootstrap, dlq, 1)
    assert [(h[DLQ_ERROR_REASON], v[:5]) for v, h in dead] == [(b"unknown-schema", b"\x00\x7f\xff\xff\x00")]
    assert pipeline.committed_problems() == []
    client.close()


def test_a_registry_lost_mid_run_stops_nothing_it_knows_and_commits_nothing_it_cannot_read(
        pipeline: Pipeline, unique_name: Callable[[str], str], tmp_path: Path) -> None:
    from stream.local.registry_server import start_registry
    from tests.integration.harness import wait_for_assignment
    from tests.verify import committed_offsets, end_offsets

    export_model(tmp_path / "orders.pt2")
    dlq = unique_name("dlq")
    registry = start_registry()  # its own: this test kills it
    try:
        client = SchemaRegistryClient({"url": registry.url})
        ctx = SerializationContext(pipeline.input, MessageField.VALUE)
        v1 = AvroSerializer(client, json.dumps(ORDER_V1))
        producer = Producer({"bootstrap.servers": pipeline.bootstrap})

        def send(count: int, start: int, serializer: AvroSerializer, key: bytes | None = None) -> None:
            for i in range(start, start + count):
                order = {"order_id": f"o-{i}", "amount": 1.0 * i, "qty": i % 5,
                         "customer": {"id": i, "country": "SE"}}
                producer.produce(pipeline.input, serializer(order, ctx), key or f"k{i % 11}".encode())
            assert producer.flush(30) == 0

        send(200, 0, v1)
        worker = pipeline.worker("--schema-registry-url", registry.url, "--input-schema", str(_write(tmp_path)),
                                 "--model", f"export:{tmp_path / 'orders.pt2'}", "--input-map",
                                 "spend=amount,items=qty", "--copy-fields", "order_id", "--dlq-topic", dlq)
        wait_for_assignment(worker)
        assert len(read(pipeline.bootstrap, pipeline.output, 200, 30)) == 200
        v2 = AvroSerializer(client, json.dumps(ORDER_V2))
        v2({"order_id": "x", "amount": 0.0, "qty": 0, "customer": {"id": 0, "country": "SE"}}, ctx)  # registered
        registry.proc.kill()
        registry.proc.wait(10)
        send(200, 200, v1)  # a known id: served from the cache
        assert len(read(pipeline.bootstrap, pipeline.output, 400, 30)) == 400, worker.output()[-3000:]
        before = end_offsets(pipeline.bootstrap, pipeline.input)
        send(30, 400, v2, key=b"one-partition")  # an id the worker never saw, and no registry to ask
        deadline = time.monotonic() + 30
        while "retrying in" not in worker.output() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "schema registry" in worker.output() and "retrying in" in worker.output(), worker.output()[-3000:]
        time.sleep(2)
        assert worker.proc.poll() is None, "still running while the registry is away"
        asked = time.monotonic()
        assert worker.terminate(60) == 0, worker.output()[-3000:]
        took = time.monotonic() - asked
        assert "left uncommitted" in worker.output()
        # ... and it stops at once, leaving the group as it closes: the abandoned batch's records are not waited
        # for (they took the revoke's whole 30 s, past the consumer's close and Kubernetes' default grace period)
        assert took < 10.0 and "close did not return" not in worker.output(), (took, worker.output()[-3000:])
        assert len(read(pipeline.bootstrap, pipeline.output, 401, 5)) == 400, "nothing of the unknown id published"
        assert read(pipeline.bootstrap, dlq, 1, 3) == [], "nor dead-lettered"
        committed = committed_offsets(pipeline.bootstrap, pipeline.group, pipeline.input)
        assert committed == before, "everything known committed, nothing past the records of the unknown id"
        client.close()
    finally:
        registry.stop()


def _write(tmp_path: Path) -> Path:
    """The input schema as a file: the worker starts without asking the registry which version is the latest."""
    path = tmp_path / "order.avsc"
    path.write_text(json.dumps(ORDER_V2))
    return path


def test_a_registry_that_cannot_be_reached_at_start_up_is_one_line_and_exit_2(pipeline: Pipeline) -> None:
    from stream.local.broker import free_port

    worker = pipeline.worker("--schema-registry-url", f"http://127.0.0.1:{free_port()}",
                             env={"SCHEMA_REGISTRY_TIMEOUT": "2", "SCHEMA_REGISTRY_MAX_RETRIES": "1"})
    assert worker.wait(60) == 2
    errors = [line for line in worker.output().splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "schema registry cannot be reached at start-up" in errors[0], worker.output()


def test_inputs_that_do_not_fit_the_schema_fail_at_start_up_naming_each(
        pipeline: Pipeline, tmp_path: Path) -> None:
    export_model(tmp_path / "orders.pt2")
    (tmp_path / "order.avsc").write_text(json.dumps(ORDER_V2))
    worker = pipeline.worker("--input-schema", str(tmp_path / "order.avsc"), "--model",
                             f"export:{tmp_path / 'orders.pt2'}", "--input-map", "spend=customer.country")
    assert worker.wait(60) == 2
    out = worker.output()
    assert "input spend (float32) <- customer.country (string): string values cannot be read as float32" in out
    assert ("input items (int64): input schema acme.shop.Order has no field 'items'; bind one with --input-map "
            "items=FIELD") in out
