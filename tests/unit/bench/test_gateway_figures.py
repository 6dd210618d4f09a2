"""The gateway benchmark's per-cell figures (`stream.bench.gateway.steady_figures`)."""

from __future__ import annotations

import pytest

from stream.bench.callers import Answer
from stream.bench.gateway import steady_figures


def _answer(i: int, sent_ms: float, http_ms: float, status: int = 200) -> Answer:
    return Answer({"event_id": str(i)}, status, {"batch_size": 4}, http_ms / 1000.0, sent_ms)


def test_costs_per_request_and_p99_over_p99_and_the_second_reader() -> None:
    # 100 requests: HTTP 20 ms each; the reader had each prediction after 19 ms, except one after 10 ms (that
    # request's own cost is 10 ms). The second reader read each 1 ms after the first, one 7 ms after.
    answers = [_answer(i, 1000.0 * i, 20.0) for i in range(100)] + [_answer(100, 0.0, 1.0, status=503)]
    arrived = {str(i): 1000.0 * i + (10.0 if i == 7 else 19.0) for i in range(100)}
    second = {k: v + (7.0 if k == "3" else 1.0) for k, v in arrived.items()}
    second.pop("5")
    f = steady_figures(answers, arrived, 100.0, second)
    assert f["statuses"] == {"200": 100, "503": 1}
    assert f["gateway_cost_ms"]["p50"] == pytest.approx(1.0)
    assert f["gateway_cost_ms"]["p99"] == pytest.approx(1.0 + 0.01 * 9.0)  # numpy's linear interpolation
    assert f["gateway_cost_ms"]["p99_over_p99"] == pytest.approx(20.0 - 19.0)
    assert f["second_reader_ms"]["timed"] == 99
    assert f["second_reader_ms"]["p50"] == pytest.approx(1.0)
    assert f["second_reader_ms"]["p99"] > 1.0
    assert f["mean_batch_size"] == 4


def test_without_a_second_reader_its_figures_are_empty() -> None:
    f = steady_figures([_answer(0, 0.0, 20.0)], {"0": 19.0}, 100.0)
    assert f["second_reader_ms"] == {"p50": None, "p99": None, "timed": 0}
    assert f["gateway_cost_ms"]["p99_over_p99"] == pytest.approx(1.0)


def test_the_report_shows_openai_s_route_beside_predict_s_at_each_rate() -> None:
    from stream.bench.gateway import format_report

    by_rate = [{"rate": 100.0, "predict": {"p50": 3.0, "p99": 9.0}, "embeddings": {"p50": 3.5, "p99": 8.0},
                "embeddings_minus_predict_ms": {"p50": 0.5, "p99": -1.0}}]
    text = format_report({"steady": [], "openai": {"rounds": 3, "by_rate": by_rate, "cells": []}})
    assert "| 100 | 3.0 / 9.0 | 3.5 / 8.0 | +0.50 / -1.00 |" in text and "median of 3 rounds" in text


def test_the_a_b_summary_gives_each_side_s_median_and_range_per_cell() -> None:
    from stream.bench.gateway_ab import summary

    def run(p50: float, refused: float) -> dict[str, object]:
        cell = {"rate": 400.0, "loop": "uvloop", "http_ms": {"p50": p50, "p99": 2 * p50},
                "gateway_cost_ms": {"p50": p50 / 10, "p99": p50 / 5}}
        return {"steady": [cell, {**cell, "http_ms": {"p50": p50 + 2, "p99": 2 * p50}}],
                "burst": {"answered_ms": {"p99": 900.0}, "refused_ms": {"p99": refused},
                          "statuses": {"200": 1800, "503": 2700}}}

    got = summary({"a": [run(20, 5), run(30, 50), run(22, 9)], "b": [run(24, 7)]})
    assert got["400/s uvloop"]["http_p50_ms"]["a"] == {"median": 23.0, "min": 21.0, "max": 31.0}, "rounds' median"
    assert got["400/s uvloop"]["http_p50_ms"]["b"] == {"median": 25.0, "min": 25.0, "max": 25.0}
    assert got["burst"]["refused_p99_ms"]["a"] == {"median": 9.0, "min": 5.0, "max": 50.0}
