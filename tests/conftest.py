"""Shared fixtures: the demo model (trained once per session) and, for integration tests, one broker
per session: KAFKA_BOOTSTRAP_SERVERS if set, else Apache Kafka when java and mvn exist, else Tansu
(STREAM_TEST_BROKER=kafka|tansu forces one); a local three-node Kafka cluster when a test asks for one; and
one schema registry per session: SCHEMA_REGISTRY_URL if set,
else Apicurio Registry (java and mvn), else its tests are skipped.
With STREAM_REQUIRE_KAFKA=1 (CI) a missing Apache Kafka or registry is a failure, not a fallback."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from stream.broker import LocalCluster, kafka_available, start_kafka, start_kafka_cluster, start_tansu
from stream.models.train_demo import train
from stream.registry_server import start_registry


@dataclass(frozen=True)
class BrokerInfo:
    bootstrap: str
    kind: str  # "external", "kafka" or "tansu"

    @property
    def hides_aborted_transactions(self) -> bool:
        return self.kind != "tansu"


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo-model")
    train(out, n_train=100_000, epochs=6)
    return out


@pytest.fixture(scope="session")
def broker() -> Iterator[BrokerInfo]:
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if external:
        yield BrokerInfo(external, "external")
        return
    choice = os.environ.get("STREAM_TEST_BROKER", "auto")  # auto | kafka | tansu
    if choice == "tansu":
        local = start_tansu()
    elif kafka_available() or choice == "kafka":
        local = start_kafka()
    elif os.environ.get("STREAM_REQUIRE_KAFKA") == "1":
        pytest.fail("STREAM_REQUIRE_KAFKA=1 but Apache Kafka is unavailable (needs java and mvn)")
    else:
        local = start_tansu()
    try:
        yield BrokerInfo(local.bootstrap, local.kind)
    finally:
        local.stop()


@pytest.fixture(scope="session")
def kafka_cluster() -> Iterator[LocalCluster]:
    """A local three-node Apache Kafka cluster (replication factor 3, two in sync required), for the tests
    that need replication or kill brokers; whole again after each test that faults it."""
    if not kafka_available():
        if os.environ.get("STREAM_REQUIRE_KAFKA") == "1":
            pytest.fail("STREAM_REQUIRE_KAFKA=1 but Apache Kafka is unavailable (needs java and mvn)")
        pytest.skip("needs java and mvn for Apache Kafka")
    with start_kafka_cluster(3) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[str]:
    """The URL of a Confluent-compatible schema registry."""
    external = os.environ.get("SCHEMA_REGISTRY_URL")
    if external:
        yield external
        return
    if not kafka_available():  # the same needs as Kafka's: java and mvn
        if os.environ.get("STREAM_REQUIRE_KAFKA") == "1":
            pytest.fail("STREAM_REQUIRE_KAFKA=1 but the schema registry cannot start (needs java and mvn)")
        pytest.skip("no schema registry: needs java and mvn, or SCHEMA_REGISTRY_URL")
    local = start_registry()
    try:
        yield local.url
    finally:
        local.stop()


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """Topic and group names unique per test, readable in broker logs."""
    stem = request.node.name.replace("[", "-").replace("]", "")[:60]
    run = uuid.uuid4().hex[:6]
    return lambda kind: f"{stem}-{kind}-{run}"
