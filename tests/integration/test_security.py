"""SASL_SSL (SCRAM-SHA-512, a certificate made for the test) and the StandardAuthorizer on a local one-node
cluster: the worker runs under exactly the least-privilege ACLs docs/operations.md lists; without any one of them it
names the missing ACL and exits non-zero; the load generator and the verifier run on KAFKA_* settings as well;
no password reaches a log."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from producers.events import generate_events
from stream.config import WorkerSettings
from stream.kafka.access import required
from stream.kafka.topics import admin, create_topics
from stream.local.broker import LocalCluster, kafka_available, start_kafka_cluster
from stream.local.children import WorkerProcess
from tests.handlers import bad_values
from tests.verify import OutputReader, check_committed, committed_offsets, end_offsets

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
EVENTS = 2_000
RESOURCE = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP, "transactional id": ResourceType.TRANSACTIONAL_ID}
# What a removed ACL's error must say (the worker's words for the grant it needs).
MISSING = {"input": "READ on topic '{input}'", "group": "READ on group '{group}'",
           "output": "WRITE on topic '{output}'", "dlq": "WRITE on topic '{dlq}'",
           "transactional-id": "WRITE on transactional id '{tid}'"}


@pytest.fixture(scope="module")
def secure() -> Iterator[LocalCluster]:
    if not kafka_available():
        if os.environ.get("STREAM_REQUIRE_KAFKA") == "1":
            pytest.fail("STREAM_REQUIRE_KAFKA=1 but Apache Kafka is unavailable (needs java and mvn)")
        pytest.skip("needs java and mvn for Apache Kafka")
    with start_kafka_cluster(1, sasl=True) as cluster:
        yield cluster


@dataclass
class Deployment:
    """One worker's topics, group, transactional id and SCRAM user, with its input produced by a user of its own
    that may only write the input topic."""

    cluster: LocalCluster
    guarantee: str
    run: str = ""

    def __post_init__(self) -> None:
        self.run = uuid.uuid4().hex[:6]
        self.input, self.output, self.dlq = f"in-{self.run}", f"out-{self.run}", f"dlq-{self.run}"
        self.group, self.tid, self.user = f"g-{self.run}", f"tid-{self.run}", f"worker-{self.run}"
        self.password = f"pw-{uuid.uuid4().hex}"
        self.settings = WorkerSettings(bootstrap_servers=self.cluster.bootstrap, input_topic=self.input,
                                       output_topic=self.output, dlq_topic=self.dlq, group_id=self.group,
                                       guarantee=self.guarantee,  # type: ignore[arg-type]
                                       transactional_id=self.tid if self.guarantee == "exactly-once" else None)
        self.admin = admin(self.cluster.bootstrap, **self.cluster.client_config)  # kept: futures need it
        create_topics(self.cluster.bootstrap, [self.input, self.output, self.dlq], 3,
                      client_config=self.cluster.client_config)
        assert self.cluster.security is not None
        self.cluster.security.add_user(self.cluster.bootstrap, self.user, self.password)

    @property
    def env(self) -> dict[str, str]:
        assert self.cluster.security is not None
        return self.cluster.security.env(self.user, self.password)

    def grant(self, principal: str, acls: list[tuple[str, str, str]]) -> None:
        bindings = [AclBinding(RESOURCE[kind], name, ResourcePatternType.LITERAL, principal, "*",
                               getattr(AclOperation, operation), AclPermissionType.ALLOW)
                    for kind, name, operation in acls]
        for future in self.admin.create_acls(bindings).values():
            future.result(timeout=30)

    def least_privilege(self, leave_out: str | None = None) -> list[tuple[str, str, str]]:
        names = {"input": self.input, "group": self.group, "output": self.output, "dlq": self.dlq,
                 "transactional-id": self.tid}
        return [acl for acl in required(self.settings) if leave_out is None or acl[1] != names[leave_out]]

    def worker(self, tmp_path: Path, *extra: str) -> WorkerProcess:
        return WorkerProcess(["--bootstrap-servers", self.cluster.bootstrap, "--input-topic", self.input,
                              "--output-topic", self.output, "--dlq-topic", self.dlq, "--group-id", self.group,
                              "--guarantee", self.guarantee, "--log-level", "DEBUG", "--max-input-bytes", "4096",
                              *(["--transactional-id", self.tid] if self.guarantee == "exactly-once" else []),
                              *extra], tmp_path / f"worker-{self.run}.log", self.env)


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
def test_the_worker_runs_under_exactly_the_least_privilege_acls(secure: LocalCluster, model_dir: Path,
                                                                 guarantee: str, tmp_path: Path) -> None:
    d = Deployment(secure, guarantee)
    d.grant(f"User:{d.user}", d.least_privilege())
    # The load generator as a user that may only write the input topic, on KAFKA_* settings like the worker.
    assert secure.security is not None
    producer_pw = f"pw-{uuid.uuid4().hex}"
    secure.security.add_user(secure.bootstrap, f"producer-{d.run}", producer_pw)
    d.grant(f"User:producer-{d.run}", [("topic", d.input, "WRITE")])
    produced = subprocess.run(
        [sys.executable, "-m", "producers", "--bootstrap-servers", secure.bootstrap, "--topic", d.input,
         "--count", str(EVENTS), "--seed", "7"], capture_output=True, text=True, timeout=120,
        env={**os.environ, **secure.security.env(f"producer-{d.run}", producer_pw)})
    assert produced.returncode == 0, produced.stdout + produced.stderr
    assert producer_pw not in produced.stdout + produced.stderr
    bad = Producer({"bootstrap.servers": secure.bootstrap, **secure.client_config})
    for reason, value in bad_values().items():  # one record of every dead-letter kind: the DLQ is written too
        bad.produce(d.input, value, f"bad-{reason}".encode())
    assert bad.flush(30) == 0
    worker = d.worker(tmp_path, "--model-dir", str(model_dir), "--model", "tests.handlers:PoisonHandler",
                      "--stop-at-end")
    code = worker.wait(180)
    worker.terminate()  # exited already (or it is stopped now): its log is closed
    logs = worker.output()
    assert code == 0, logs[-3000:]
    reader = OutputReader(secure.bootstrap, d.output, client_config=secure.client_config)
    expected = set(generate_events(EVENTS, seed=7).event_ids)
    reader.read_until(expected, timeout_s=60)
    assert reader.missing(expected) == 0 and reader.duplicates() == 0
    assert _records(secure, d.dlq) == len(bad_values())
    assert check_committed(committed_offsets(secure.bootstrap, d.group, d.input, secure.client_config),
                           end_offsets(secure.bootstrap, d.input, client_config=secure.client_config)) == []
    assert d.password not in logs, "the SASL password reached the worker's log"
    assert "sasl.password" not in logs


def _records(cluster: LocalCluster, topic: str) -> int:
    """Records a read_committed reader finds on ``topic``."""
    consumer = Consumer({**cluster.client_config, "bootstrap.servers": cluster.bootstrap, "group.id": "count",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "enable.partition.eof": True})
    try:
        consumer.subscribe([topic])
        count, deadline = 0, time.monotonic() + 30
        eofs: set[int] = set()
        while time.monotonic() < deadline and len(eofs) < 3:
            for m in consumer.consume(1000, 0.5):
                if m.error() is None:
                    count += 1
                elif m.error().code() == KafkaError._PARTITION_EOF:
                    eofs.add(m.partition())
        return count
    finally:
        consumer.close()


@pytest.mark.parametrize(("leave_out", "guarantee"), [
    ("input", "at-least-once"), ("group", "at-least-once"), ("output", "at-least-once"), ("dlq", "at-least-once"),
    ("transactional-id", "exactly-once")])
def test_a_missing_acl_is_named_and_the_worker_exits_non_zero(secure: LocalCluster, model_dir: Path,
                                                               leave_out: str, guarantee: str, tmp_path: Path) -> None:
    d = Deployment(secure, guarantee)
    acls = d.least_privilege(leave_out)
    assert len(acls) == len(d.least_privilege()) - 1
    d.grant(f"User:{d.user}", acls)
    started = time.monotonic()
    worker = d.worker(tmp_path, "--model-dir", str(model_dir))  # no --stop-at-end: it would run on and on
    code = worker.wait(90)
    worker.terminate()
    logs = worker.output()
    assert code is not None, f"still running 90 s later without {leave_out}'s ACL: {logs[-2000:]}"
    assert code != 0, logs[-3000:]
    wanted = MISSING[leave_out].format(input=d.input, group=d.group, output=d.output, dlq=d.dlq, tid=d.tid)
    assert wanted in logs, logs[-3000:]
    assert "Traceback" not in logs, logs[-3000:]
    assert d.password not in logs
    print(f"without {leave_out}: exit {code} after {time.monotonic() - started:.1f}s")


def test_a_three_node_cluster_replicates_over_sasl_ssl() -> None:
    """Inter-broker traffic on the SASL_SSL listener (SCRAM-SHA-512) and the controller quorum on PLAIN: a topic
    of the cluster's replication factor keeps all three replicas in sync under acks=all writes."""
    if not kafka_available():
        pytest.skip("needs java and mvn for Apache Kafka")
    with start_kafka_cluster(3, sasl=True) as cluster:
        create_topics(cluster.bootstrap, ["replicated"], 3, client_config=cluster.client_config)
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", **cluster.client_config})
        for i in range(300):
            producer.produce("replicated", b"%d" % i, partition=i % 3)
        assert producer.flush(60) == 0
        client = admin(cluster.bootstrap, **cluster.client_config)
        parts = client.list_topics("replicated", timeout=10).topics["replicated"].partitions.values()
        assert all(len(p.replicas) == 3 and sorted(p.isrs) == sorted(p.replicas) for p in parts)
        plain = admin(cluster.bootstrap, **{"log_level": 0})  # no TLS, no SASL: nothing answers it
        with pytest.raises(KafkaException):
            plain.list_topics(timeout=3)
