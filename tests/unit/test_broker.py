"""The test broker's KRaft cluster id: ``kafka-storage format -t ID`` takes an id starting with "-" for an
option and fails (1 start in 64 before this check)."""

from __future__ import annotations

from stream.broker import kraft_cluster_id, request_threads


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
