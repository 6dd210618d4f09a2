"""``--model minilm`` on a schema of the user's (a nested text field, registered in Apicurio, written by
confluent-kafka's AvroSerializer): embeddings read back by AvroDeserializer equal the model's own, and null,
empty, blank, non-UTF-8 and over-long texts are each handled as documented, over real Kafka."""

from __future__ import annotations

import importlib.metadata
import json
import time
from collections.abc import Callable

import numpy as np
import pytest
import torch
from confluent_kafka import Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from producers.texts import generate_texts
from stream.bench.probes import scrape
from stream.kafka.publish import HEADER_OFFSET
from stream.local.broker import free_port
from stream.models.minilm import PACKAGE, PACKAGE_ZIP, MiniLMHandler
from stream.pipeline.processing import DLQ_ERROR_REASON
from tests.integration.harness import Pipeline, wait_for_assignment
from tests.integration.test_your_schema import read

pytestmark = pytest.mark.integration

TICKET = {"type": "record", "name": "Ticket", "namespace": "acme.support", "fields": [
    {"name": "ticket_id", "type": "string"},
    {"name": "body", "type": {"type": "record", "name": "Body", "fields": [
        {"name": "subject", "type": "string"},
        {"name": "text", "type": ["null", "string"], "default": None}]}},
]}


def test_minilm_embeds_a_users_text_field_and_dead_letters_texts_it_cannot_take(
        pipeline: Pipeline, schema_registry: str, unique_name: Callable[[str], str]) -> None:
    dlq = unique_name("dlq")
    client = SchemaRegistryClient({"url": schema_registry})
    serialize = AvroSerializer(client, json.dumps(TICKET))
    ctx = SerializationContext(pipeline.input, MessageField.VALUE)
    texts: list[str | None] = list(generate_texts(120, seed=11).texts)
    bad = {10: None, 20: "", 30: " \t\n ", 40: "XXXXXXXX"}  # null, empty, blank, (made) non-UTF-8
    for row, text in bad.items():
        texts[row] = text
    texts[50] = "tokens " * 400  # over --max-tokens: cut, counted, embedded
    handler = MiniLMHandler(max_tokens=128)
    handler.load(torch.device("cpu"))
    handler.tokenize([t for t in texts if t and t.strip() and t != "XXXXXXXX"])
    cut = handler.truncated  # the good texts over 128 tokens, the one of 400 words among them
    assert cut >= 1
    producer = Producer({"bootstrap.servers": pipeline.bootstrap})
    for i, text in enumerate(texts):
        value = serialize({"ticket_id": f"t-{i}", "body": {"subject": "s", "text": text}}, ctx)
        if i == 40:
            value = value.replace(b"XXXXXXXX", b"\xff\xfeabc\xc3\x28\x80")
        producer.produce(pipeline.input, value, b"one-partition")  # offsets == rows
    assert producer.flush(30) == 0
    port = free_port()
    weights = importlib.metadata.distribution(PACKAGE).locate_file(PACKAGE_ZIP)  # as a zip given by --model-dir
    worker = pipeline.worker("--schema-registry-url", schema_registry, "--model", "minilm", "--max-tokens", "128",
                             "--model-dir", str(weights),  # (the harness's demo model dir comes first: this wins)
                             "--input-map", "text=body.text", "--copy-fields", "ticket_id", "--dlq-topic", dlq,
                             "--max-batch-size", "32", "--metrics-port", str(port), "--metrics-host", "127.0.0.1")
    try:
        wait_for_assignment(worker)
        deserialize = AvroDeserializer(client)
        out_ctx = SerializationContext(pipeline.output, MessageField.VALUE)
        predictions = [deserialize(v, out_ctx) for v, _ in read(pipeline.bootstrap, pipeline.output, 116, 120)]
        dead = read(pipeline.bootstrap, dlq, 4, 30)
        deadline = time.monotonic() + 30
        while scrape(port, "stream_inputs_truncated_total") != cut and time.monotonic() < deadline:
            time.sleep(0.2)
        assert scrape(port, "stream_inputs_truncated_total") == cut
    finally:
        code = worker.terminate(60)
    assert code == 0, worker.output()[-3000:]
    assert "model warmed in" in worker.output(), "the warm-up runs before the worker joins its group"
    reasons = {int(h[HEADER_OFFSET]): h[DLQ_ERROR_REASON] for _, h in dead}
    assert reasons == {10: b"null-input", 20: b"empty-input", 30: b"empty-input", 40: b"corrupt-avro"}
    assert sorted(int(p["ticket_id"][2:]) for p in predictions) == [i for i in range(120) if i not in bad]
    order = [int(p["ticket_id"][2:]) for p in predictions]
    want = handler.embed([texts[i] or "" for i in order])
    got = np.asarray([p["embedding"] for p in predictions], dtype=np.float32)
    assert got.shape == (116, 384)
    assert float(np.abs(got - want).max()) <= 1e-5  # other batch compositions, the same embeddings
    assert all(p["model_name"] == "all-MiniLM-L6-v2" and p["model_version"] == handler.version for p in predictions)
    assert pipeline.committed_problems() == []
    client.close()
