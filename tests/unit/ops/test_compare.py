from __future__ import annotations

import pytest

from stream.ops.compare import Side, compare, format_report


def side(topic: str, scores: dict[int, float], vectors: dict[int, list[float]] | None = None,
         dead: set[int] = frozenset()) -> Side:  # type: ignore[assignment]
    s = Side(topic)
    for offset, score in scores.items():
        record = {"event_id": f"e{offset}", "fraud_score": score, "is_fraud": score >= 0.5, "model_version": topic,
                  "predicted_ts_ms": 1000 + offset, "event_ts_ms": 990, "batch_size": 7}
        if vectors is not None:
            record["embedding"] = vectors[offset]
        s.records[("in", 0, offset)] = record
    s.dead = {("in", 0, o) for o in dead}
    return s


def test_records_join_by_lineage_and_each_field_is_compared_within_its_tolerance() -> None:
    a = side("a", {0: 0.1, 1: 0.2, 2: 0.7, 3: 0.4}, dead={4})
    b = side("b", {0: 0.1, 1: 0.2000001, 2: 0.4, 4: 0.9}, dead={3})
    report = compare(a, b, tolerance=1e-6, min_cosine=0.9999)
    assert report["joined"] == 3 and report["agreement"] == pytest.approx(2 / 3)
    score = report["fields"]["fraud_score"]
    assert score["agreement"] == pytest.approx(2 / 3) and score["max_abs_diff"] == pytest.approx(0.3)
    assert report["fields"]["is_fraud"]["agreement"] == pytest.approx(2 / 3)
    assert "model_version" not in report["fields"] and "batch_size" not in report["fields"], "they tell runs apart"
    assert report["baseline"]["only_here"] == 1 and report["candidate"]["only_here"] == 1
    assert report["dead_here_predicted_there"] == {"baseline": 1, "candidate": 1}
    assert "66.6667%" in format_report(report)


def test_vectors_agree_by_cosine() -> None:
    a = side("a", {0: 0.1, 1: 0.1}, {0: [1.0, 0.0], 1: [1.0, 0.0]})
    b = side("b", {0: 0.1, 1: 0.1}, {0: [2.0, 0.0], 1: [1.0, 1.0]})
    embedding = compare(a, b, tolerance=1e-6, min_cosine=0.9999)["fields"]["embedding"]
    assert embedding["agreement"] == 0.5 and embedding["min_cosine"] == pytest.approx(2 ** -0.5)
