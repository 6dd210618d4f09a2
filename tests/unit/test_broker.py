"""The local broker's settings: its KRaft cluster id (``kafka-storage format -t ID`` takes an id starting with "-"
for an option and fails: 1 start in 64 before this check), request threads and Java heap."""

from __future__ import annotations

import pytest

from stream.broker import KafkaHeap, kraft_cluster_id, request_threads
from stream.errors import BrokerError


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
