"""The local broker's settings: its KRaft cluster id (``kafka-storage format -t ID`` takes an id starting with "-"
for an option and fails: 1 start in 64 before this check), request threads and Java heap."""

from __future__ import annotations

from pathlib import Path

import pytest

from stream.errors import BrokerError
from stream.local.kafka_node import KafkaHeap, _mem_total_mib, kraft_cluster_id, request_threads


def test_cluster_id_never_starts_with_a_dash() -> None:
    draws = iter([b"\xf8" * 16, b"\xfb" * 16, bytes(range(16))])  # the first two encode to "-..."
    cluster_id = kraft_cluster_id(lambda: next(draws))
    assert cluster_id == "AAECAwQFBgcICQoLDA0ODw"
    assert len(kraft_cluster_id()) == 22 and not kraft_cluster_id().startswith("-")


def test_request_threads_fit_small_machines_and_keep_kafkas_defaults_on_big_ones() -> None:
    assert request_threads(1) == (1, 2)
    assert request_threads(2) == (1, 2)
    assert request_threads(4) == (2, 4)
    assert request_threads(16) == (3, 8)  # Kafka's own defaults
    network, io = request_threads()
    assert 1 <= network <= 3 and 2 <= io <= 8


def test_default_heap_is_kafka_server_starts() -> None:
    assert KafkaHeap().jvm_args() == ["-Xms1024m", "-Xmx1024m"]


def test_benchmark_heap_is_kafkas_production_heap_where_memory_allows() -> None:
    big = KafkaHeap.for_benchmark(24 * 1024)
    assert big.jvm_args() == ["-Xms6144m", "-Xmx6144m", "-Xmn3072m", "-XX:G1HeapRegionSize=16m", "-XX:+AlwaysPreTouch"]
    assert KafkaHeap.for_benchmark(128 * 1024).heap_mib == 6144
    small = KafkaHeap.for_benchmark(8 * 1024 - 100)  # a quarter, rounded down to 256 MiB
    assert (small.heap_mib, small.young_mib, small.region_mib, small.pretouch) == (1792, 896, None, True)
    assert KafkaHeap.for_benchmark(1024).heap_mib == 512
    assert KafkaHeap.for_benchmark(0).jvm_args()[:2] == ["-Xms1024m", "-Xmx1024m"]  # /proc/meminfo unreadable
    assert 512 <= KafkaHeap.for_benchmark().heap_mib <= 6144


@pytest.mark.parametrize("kwargs", [{"heap_mib": 128}, {"young_mib": 1024}, {"young_mib": 0}, {"region_mib": 3}])
def test_bad_heaps_are_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(BrokerError):
        KafkaHeap(**kwargs)


def _fake_machine(tmp_path: Path, mem_kib: int, cgroup: str, limits: dict[str, str]) -> dict[str, Path]:
    tmp_path.mkdir()
    (tmp_path / "meminfo").write_text(f"MemTotal:       {mem_kib} kB\nMemFree:        1000 kB\n")
    (tmp_path / "cgroup").write_text(cgroup)
    for rel, text in limits.items():
        (tmp_path / "fs" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / rel).write_text(text + "\n")
    return {"meminfo": tmp_path / "meminfo", "proc_cgroup": tmp_path / "cgroup", "cgroup_root": tmp_path / "fs"}


def test_memory_for_the_heap_is_the_containers_limit_where_smaller(tmp_path: Path) -> None:
    gib = 1024 * 1024  # kB
    # cgroup v2 with a limit on this process's cgroup: 8 GiB of a 64 GiB host, so the heap is a quarter of 8
    v2 = _fake_machine(tmp_path / "a", 64 * gib, "0::/job/x\n",
                       {"memory.max": "max", "job/x/memory.max": str(8 * 1024**3)})
    assert _mem_total_mib(**v2) == 8 * 1024
    assert KafkaHeap.for_benchmark(_mem_total_mib(**v2)).heap_mib == 2048
    # cgroup v1 (this machine's layout): "no limit" is a huge number, so MemTotal stands
    v1 = _fake_machine(tmp_path / "b", 24 * gib, "4:memory:/api/1\n0::/\n",
                       {"memory/memory.limit_in_bytes": "9223372036854771712",
                        "memory/api/1/memory.limit_in_bytes": "9223372036854771712"})
    assert _mem_total_mib(**v1) == 24 * 1024
    limited = _fake_machine(tmp_path / "c", 24 * gib, "4:memory:/api/1\n",
                            {"memory/api/1/memory.limit_in_bytes": str(3 * 1024**3)})
    assert _mem_total_mib(**limited) == 3 * 1024
    # nothing readable: no figure (for_benchmark then takes 1 GiB)
    assert _mem_total_mib(tmp_path / "none", tmp_path / "none", tmp_path / "none") is None


def test_cluster_properties_replicate_three_times_and_need_two_in_sync(tmp_path: Path) -> None:
    from stream.local.kafka_node import server_properties

    def props(nodes: int) -> dict[str, str]:
        text = server_properties(2, 9092, 9093, "1@127.0.0.1:1,2@127.0.0.1:9093,3@127.0.0.1:3", tmp_path, nodes)
        return dict(line.split("=", 1) for line in text.splitlines() if line)

    three, one = props(3), props(1)
    for key in ("default.replication.factor", "offsets.topic.replication.factor",
                "transaction.state.log.replication.factor", "share.coordinator.state.topic.replication.factor"):
        assert (three[key], one[key]) == ("3", "1"), key
    for key in ("min.insync.replicas", "transaction.state.log.min.isr"):
        assert (three[key], one[key]) == ("2", "1"), key
    assert three["unclean.leader.election.enable"] == "false" and three["node.id"] == "2"
    assert three["listeners"] == "PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093"


def test_a_cluster_is_kafka_on_free_ports_only(capsys: pytest.CaptureFixture[str]) -> None:
    from stream.cli import main

    assert main(["broker", "--kind", "tansu", "--nodes", "3"]) == 2
    assert main(["broker", "--kind", "kafka", "--nodes", "3", "--port", "9092"]) == 2
    assert capsys.readouterr().err.count("--nodes N and --sasl: Apache Kafka only") == 2


def test_restarting_dead_nodes_is_for_a_cluster_and_its_delay_is_not_negative(
        capsys: pytest.CaptureFixture[str]) -> None:
    from stream.cli import main

    assert main(["broker", "--kind", "tansu", "--restart-dead-nodes"]) == 2
    assert "--restart-dead-nodes: a cluster (--kind kafka --nodes 3)" in capsys.readouterr().err
    assert main(["broker", "--kind", "kafka", "--nodes", "3", "--restart-dead-nodes", "--restart-delay-s", "-1"]) == 2
    assert "--restart-delay-s must be 0 or more, not -1.0" in capsys.readouterr().err


def test_broker_node_needs_a_running_cluster_and_a_node(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stream.cli import main

    assert main(["broker-node", "status", "--cluster", str(tmp_path)]) == 2
    assert f"--cluster {tmp_path}: no cluster.json there" in capsys.readouterr().err
    (tmp_path / "cluster.json").write_text('{"supervisor_pid": 1, "nodes": []}')
    assert main(["broker-node", "restart", "--cluster", str(tmp_path)]) == 2
    assert "broker-node restart: which node?" in capsys.readouterr().err
