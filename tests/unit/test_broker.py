"""The test broker's KRaft cluster id: ``kafka-storage format -t ID`` takes an id starting with "-" for an
option and fails (1 start in 64 before this check)."""

from __future__ import annotations

from stream.broker import kraft_cluster_id


def test_cluster_id_never_starts_with_a_dash() -> None:
    draws = iter([b"\xf8" * 16, b"\xfb" * 16, bytes(range(16))])  # the first two encode to "-..."
    cluster_id = kraft_cluster_id(lambda: next(draws))
    assert cluster_id == "AAECAwQFBgcICQoLDA0ODw"
    assert len(kraft_cluster_id()) == 22 and not kraft_cluster_id().startswith("-")
