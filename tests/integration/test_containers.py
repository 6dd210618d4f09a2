"""The test fixtures' containers (`tests.containers`, testcontainers) run by a real engine (`make image-test`): what
a user with Docker and no Java gets. Where the upstream images cannot be pulled, the locally built ones of the same
software stand in (`make compose-images`); on an engine without a bridge network they run on the host's."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from stream.kafka.topics import create_topics
from tests.compose_images import KAFKA_IMAGE, REGISTRY_IMAGE, build_compose_images
from tests.containers import KAFKA_IMAGE as UPSTREAM_KAFKA
from tests.containers import REGISTRY_IMAGE as UPSTREAM_REGISTRY
from tests.containers import start_kafka_container, start_registry_container
from tests.engine import docker, image_exists
from tests.image import ROOT

pytestmark = [pytest.mark.image, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def images(engine: str) -> Iterator[None]:
    """The upstream images where the engine has them or can pull them, else the local ones, named to the fixtures
    through their variables."""
    chosen = {}
    for variable, upstream, local in (("STREAM_TEST_KAFKA_IMAGE", UPSTREAM_KAFKA, KAFKA_IMAGE),
                                      ("STREAM_TEST_REGISTRY_IMAGE", UPSTREAM_REGISTRY, REGISTRY_IMAGE)):
        if not (image_exists(upstream) or docker("pull", upstream, check=False, timeout_s=120).returncode == 0):
            chosen[variable] = local
    if chosen:
        build_compose_images()
    before = {k: os.environ.get(k) for k in chosen}
    os.environ.update(chosen)
    yield
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def containers_left(image: str) -> list[str]:
    return docker("ps", "-a", "-q", "--filter", f"ancestor={image}").stdout.split()


def test_the_kafka_container_takes_writes_and_reads_and_leaves_nothing(images: None) -> None:
    started = start_kafka_container()
    image = os.environ.get("STREAM_TEST_KAFKA_IMAGE", UPSTREAM_KAFKA)
    try:
        topic = f"containers-{uuid.uuid4().hex[:8]}"
        create_topics(started.address, [topic], 2)
        producer = Producer({"bootstrap.servers": started.address})
        for i in range(100):
            producer.produce(topic, b"%d" % i, partition=i % 2)
        assert producer.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": started.address, "group.id": topic,
                             "auto.offset.reset": "earliest"})
        consumer.subscribe([topic])
        seen: list[bytes] = []
        for _ in range(60):
            seen += [m.value() for m in consumer.consume(100, 0.5) if m.error() is None]
            if len(seen) >= 100:
                break
        consumer.close()
        assert sorted(seen) == sorted(b"%d" % i for i in range(100))
    finally:
        started.stop()
    assert containers_left(image) == []


def test_the_registry_container_registers_and_serves_a_schema(images: None) -> None:
    started = start_registry_container()
    try:
        schema = Schema('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}]}', "AVRO")
        with SchemaRegistryClient({"url": started.address}) as client:
            schema_id = client.register_schema("containers-value", schema)
            assert client.get_schema(schema_id).schema_str.replace(" ", "") == schema.schema_str.replace(" ", "")
    finally:
        started.stop()
    assert containers_left(os.environ.get("STREAM_TEST_REGISTRY_IMAGE", UPSTREAM_REGISTRY)) == []


def test_an_integration_test_runs_on_the_kafka_container_as_the_fixtures_promise(images: None) -> None:
    """``STREAM_TEST_BROKER=container``: the session's broker is the container, as for a user without Java."""
    env = {**os.environ, "STREAM_TEST_BROKER": "container"}
    env.pop("STREAM_REQUIRE_KAFKA", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/integration/test_pipeline.py::test_restart_after_sigterm_resumes_without_loss_or_"
                           "duplicates"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-4000:] + done.stderr[-2000:]
