"""The local three-node Apache Kafka cluster (``python -m stream broker --kind kafka --nodes 3``): replicated as
documented, and acknowledged writes survive the SIGKILL of a partition leader and its restart."""

from __future__ import annotations

import signal
import time

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import ConfigResource

from stream.kafka.topics import admin, create_topics
from stream.local.broker import LocalCluster
from tests.cluster_cli import partition_replicas, wait

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def cluster(kafka_cluster: LocalCluster) -> LocalCluster:
    return kafka_cluster


def test_topics_are_replicated_three_times_with_two_in_sync_required(cluster: LocalCluster) -> None:
    assert len(admin(cluster.bootstrap).list_topics(timeout=10).brokers) == 3
    create_topics(cluster.bootstrap, ["replicated"], 6)  # the replication factor is the cluster's
    parts = partition_replicas(cluster.bootstrap, "replicated")
    assert all(len(replicas) == 3 and sorted(isr) == sorted(replicas) for _, replicas, isr in parts.values())
    client = admin(cluster.bootstrap)  # kept: its futures fail once it is gone
    values = next(iter(client.describe_configs([ConfigResource("topic", "replicated")]).values())).result(timeout=10)
    assert values["min.insync.replicas"].value == "2"
    assert values["unclean.leader.election.enable"].value == "false"


def test_acknowledged_writes_survive_a_leader_killed_and_restarted(cluster: LocalCluster) -> None:
    create_topics(cluster.bootstrap, ["survive"], 3)
    leader = partition_replicas(cluster.bootstrap, "survive")[0][0]
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5})
    acked: list[bytes] = []

    def report(err: object, msg: object) -> None:
        if err is None:
            acked.append(msg.value())  # type: ignore[attr-defined]

    for i in range(300):
        producer.produce("survive", b"before-%d" % i, partition=i % 3, on_delivery=report)
    assert producer.flush(30) == 0
    cluster.node(leader).signal(signal.SIGKILL)
    cluster.node(leader).proc.wait(30)  # type: ignore[union-attr]
    for i in range(300):  # two of three in sync: still acknowledged, by the new leaders
        producer.produce("survive", b"during-%d" % i, partition=i % 3, on_delivery=report)
    assert producer.flush(60) == 0
    assert len(acked) == 600
    assert all(m[0] != leader for m in partition_replicas(cluster.bootstrap, "survive").values())
    cluster.restart(leader)
    wait(lambda: all(sorted(isr) == sorted(replicas)
                      for _, replicas, isr in partition_replicas(cluster.bootstrap, "survive").values()),
          90, "the restarted node back in every partition's in-sync replicas")
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "survive-reader",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe(["survive"])
    seen: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(seen) < 600 and time.monotonic() < deadline:
        seen += [m.value() for m in consumer.consume(500, 0.5) if m.error() is None]
    consumer.close()
    assert sorted(seen) == sorted(acked), "every acknowledged write read back, once"
