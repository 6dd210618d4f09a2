"""``python -m stream broker --kind kafka --nodes 3`` as a user runs it: the command keeps its cluster through a node
killed (acknowledged writes go on and survive), restarts it on its data with ``--restart-dead-nodes``, stops
everything with exit 1 when a quorum is lost and with exit 0 on SIGTERM, and ``python -m stream broker-node``
stops, starts and restarts one node of it. No process is left behind in any case."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from stream.kafka.topics import admin, create_topics
from stream.local.broker import kafka_available
from tests.cluster_cli import ClusterCommand, gone, partition_replicas, wait

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]


@pytest.fixture(autouse=True)
def _needs_kafka() -> None:
    if not kafka_available():
        if os.environ.get("STREAM_REQUIRE_KAFKA") == "1":
            pytest.fail("STREAM_REQUIRE_KAFKA=1 but Apache Kafka is unavailable (needs java and mvn)")
        pytest.skip("needs java and mvn for Apache Kafka")


@pytest.fixture
def cluster_command(tmp_path: Path) -> Any:
    started: list[ClusterCommand] = []

    def start(*extra: str) -> ClusterCommand:
        started.append(ClusterCommand(tmp_path, *extra))
        return started[-1]

    yield start
    for command in started:
        command.close()


class Writer(threading.Thread):
    """acks=all writes, 500 a second, to one topic; what was acknowledged, and when."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.topic = topic
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                  "linger.ms": 5})
        self.acked: list[tuple[bytes, float]] = []
        self.failed: list[str] = []
        self.stopping = threading.Event()

    def report(self, err: Any, msg: Any) -> None:
        if err is None:
            self.acked.append((msg.value(), time.monotonic()))
        else:
            self.failed.append(str(err))

    def run(self) -> None:
        i = 0
        while not self.stopping.is_set():
            self.producer.produce(self.topic, b"w-%d" % i, partition=i % 3, on_delivery=self.report)
            self.producer.poll(0.002)
            i += 1

    def acked_since(self, t: float) -> int:
        return sum(at > t for _, at in list(self.acked))

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)
        assert self.producer.flush(90) == 0


def _read_all(bootstrap: str, topic: str, want: set[bytes]) -> set[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-reader",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    seen: set[bytes] = set()
    deadline = time.monotonic() + 90
    try:
        while not want <= seen and time.monotonic() < deadline:
            seen |= {m.value() for m in consumer.consume(1000, 0.5) if m.error() is None}
    finally:
        consumer.close()
    return seen


def test_the_command_keeps_its_cluster_through_a_killed_node_restarts_it_and_ends_when_the_quorum_goes(
        cluster_command: Any) -> None:
    cmd = cluster_command("--restart-dead-nodes", "--restart-delay-s", "1")
    create_topics(cmd.bootstrap, ["cli-acked"], 3)
    writer = Writer(cmd.bootstrap, "cli-acked")
    writer.start()
    wait(lambda: len(writer.acked) >= 300, 60, "acknowledged writes before the kill")
    victim = partition_replicas(cmd.bootstrap, "cli-acked")[0][0]
    victim_pid = cmd.node_pid(victim)
    os.kill(victim_pid, signal.SIGKILL)
    killed_at = time.monotonic()
    wait(lambda: writer.acked_since(killed_at + 1) >= 300, 60, "acknowledged writes going on with a node dead")
    assert cmd.proc.poll() is None, cmd.log()[-3000:]
    wait(lambda: f"node {victim} back" in cmd.log(), 120, f"node {victim} restarted by the command")
    node = cmd.status()["nodes"][victim - 1]
    assert node["state"] == "running" and node["pid"] not in (None, victim_pid) and node["restarts"] == 1
    wait(lambda: all(sorted(isr) == sorted(replicas)
                      for _, replicas, isr in partition_replicas(cmd.bootstrap, "cli-acked").values()),
          90, "the restarted node back in every partition's in-sync replicas")
    writer.stop()
    acked = {value for value, _ in writer.acked}
    assert not writer.failed and len(acked) >= 600
    missing = acked - _read_all(cmd.bootstrap, "cli-acked", acked)
    assert not missing, f"{len(missing)} acknowledged records lost, e.g. {sorted(missing)[:5]}"
    log = cmd.log()
    assert log.count(f"node {victim} (pid {victim_pid}) ended: killed by SIGKILL; restarting it in 1 s") == 1, log
    assert log.count("ended:") == 1
    survivors = [cmd.node_pid(i) for i in (1, 2, 3)]
    root = cmd.status_path.parent
    for pid in survivors[:2]:
        os.kill(pid, signal.SIGKILL)
    assert cmd.proc.wait(60) == 1
    assert "quorum lost: 1 of 3 nodes running, 2 needed" in cmd.log()
    wait(lambda: all(gone(pid) for pid in cmd.pids), 30, "every node's process gone")
    assert not root.exists()


def test_broker_node_stops_starts_and_restarts_a_node_and_sigterm_stops_them_all(cluster_command: Any) -> None:
    cmd = cluster_command()
    status = cmd.node_command("status")
    assert status.returncode == 0, status.stderr
    rows = [line.split() for line in status.stdout.splitlines()[2:]]
    assert [(r[0], r[2]) for r in rows] == [("1", "running"), ("2", "running"), ("3", "running")]
    assert [int(r[1]) for r in rows] == [cmd.node_pid(i) for i in (1, 2, 3)]

    pid3 = cmd.node_pid(3)
    os.kill(pid3, signal.SIGKILL)  # no --restart-dead-nodes: it stays down, the cluster runs on
    wait(lambda: f"node 3 (pid {pid3}) ended: killed by SIGKILL" in cmd.log(), 30, "node 3's end logged")
    time.sleep(2)
    assert cmd.status()["nodes"][2]["state"] == "ended" and cmd.proc.poll() is None
    refused = cmd.node_command("stop", "1")
    assert refused.returncode == 1
    assert "stopping node 1 would leave 1 of 3 nodes running, fewer than the quorum of 2" in refused.stderr
    started = cmd.node_command("start", "3")
    assert started.returncode == 0, started.stderr
    assert f"node 3 running (pid {cmd.node_pid(3)})" in started.stdout
    pid2 = cmd.node_pid(2)
    restarted = cmd.node_command("restart", "2")
    assert restarted.returncode == 0, restarted.stderr
    assert cmd.node_pid(2) != pid2 and gone(pid2)
    wait(lambda: len(admin(cmd.bootstrap).list_topics(timeout=10).brokers) == 3, 60, "three brokers again")

    pids = {cmd.node_pid(i) for i in (1, 2, 3)}
    root = cmd.status_path.parent
    cmd.proc.send_signal(signal.SIGTERM)
    assert cmd.proc.wait(90) == 0
    assert "SIGTERM: stopping the cluster's nodes" in cmd.log()
    assert all(gone(pid) for pid in pids | cmd.pids)
    assert not root.exists()
