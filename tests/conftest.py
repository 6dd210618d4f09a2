"""Shared fixtures: the demo model (trained once per session) and, for integration tests, one broker and one
schema registry per session, chosen in the order `tests.containers` states (the caller's, then Apache Kafka and
Apicurio as local processes where java and mvn exist, then containers where an engine answers, then Tansu); a
local three-node Kafka cluster when a test asks for one. With STREAM_REQUIRE_KAFKA=1 (CI) a missing Apache Kafka
or registry is a failure, not a fallback."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stream.local.broker import LocalCluster, kafka_available, start_kafka, start_kafka_cluster, start_tansu
from stream.local.registry_server import LocalRegistry, start_registry
from stream.models.train_demo import train
from tests.containers import (
    broker_choice,
    engine_available,
    registry_choice,
    start_kafka_container,
    start_registry_container,
)
from tests.failure_logs import FailureLogs

FAILURE_LOGS = FailureLogs()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    FAILURE_LOGS.mark()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    if report.failed:
        report.sections.extend(FAILURE_LOGS.sections(item))
    return report


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
    choice = broker_choice(os.environ, kafka_available(), engine_available)
    if choice == "external":
        yield BrokerInfo(os.environ["KAFKA_BOOTSTRAP_SERVERS"], "external")
        return
    if choice == "unavailable":
        pytest.fail("STREAM_REQUIRE_KAFKA=1 but Apache Kafka is unavailable (needs java and mvn)")
    if choice == "container":
        started = start_kafka_container()
        try:
            yield BrokerInfo(started.address, "kafka")
        finally:
            started.stop()
        return
    local = start_tansu() if choice == "tansu" else start_kafka()
    FAILURE_LOGS.watch("broker", local.log_files)
    try:
        yield BrokerInfo(local.bootstrap, local.kind)
    finally:
        FAILURE_LOGS.forget("broker")
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
        FAILURE_LOGS.watch("kafka_cluster", cluster.log_files)
        yield cluster
        FAILURE_LOGS.forget("kafka_cluster")


@pytest.fixture(scope="session")
def schema_registry() -> Iterator[str]:
    """The URL of a Confluent-compatible schema registry."""
    choice = registry_choice(os.environ, kafka_available(), engine_available)
    if choice == "external":
        yield os.environ["SCHEMA_REGISTRY_URL"]
        return
    if choice == "unavailable":
        if os.environ.get("STREAM_REQUIRE_KAFKA") == "1":
            pytest.fail("STREAM_REQUIRE_KAFKA=1 but the schema registry cannot start (needs java and mvn)")
        pytest.skip("no schema registry: needs java and mvn, a container engine, or SCHEMA_REGISTRY_URL")
    started = start_registry_container() if choice == "container" else start_registry()
    if isinstance(started, LocalRegistry):
        FAILURE_LOGS.watch("schema_registry", started.log_files)
    try:
        yield started.url if isinstance(started, LocalRegistry) else started.address
    finally:
        FAILURE_LOGS.forget("schema_registry")
        started.stop()


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """Topic and group names unique per test, readable in broker logs."""
    stem = request.node.name.replace("[", "-").replace("]", "")[:60]
    run = uuid.uuid4().hex[:6]
    return lambda kind: f"{stem}-{kind}-{run}"


# `make test` runs two pytest processes (pytest-xdist, --dist loadgroup): the tests that load both cores (the chaos
# suite, the local clusters, the benchmarks in quick mode) run one after another in one of them, the rest beside
# them in the other, so that no two heavy tests run at once on the machine's two cores. Each process starts its own
# broker and registry (session fixtures). CI's pytest went from 21 min (one process) to 12.6 min.
_HEAVY = ("tests/chaos/", "tests/integration/test_bench.py", "tests/integration/test_cluster.py",
          "tests/integration/test_cluster_command.py")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """loadgroup with the heavy tests as one group, chosen by path here in the controller. An ``xdist_group``
    mark groups nothing under pytest 9: xdist 3.8 marks a grouped test by renaming its ``_nodeid``, which pytest 9
    no longer reads (found at a63600c: the heavy tests had been running two at a time)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class HeavyTogether(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "heavy" if nodeid.startswith(_HEAVY) else nodeid

    return HeavyTogether(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # a local cluster loads both cores: its tests must be among the heavy ones
        if "kafka_cluster" in getattr(item, "fixturenames", ()) and not item.nodeid.startswith(_HEAVY):
            raise pytest.UsageError(f"{item.nodeid} uses kafka_cluster: put it under one of {_HEAVY} "
                                    "(tests/conftest.py), so that it runs with the other heavy tests")
