"""The collector's pauses (`stream.ops.gc_pauses`): timed by generation, exported as a histogram, read back."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stream.ops import gc_pauses
from stream.ops.gc_pauses import GcPauses, pauses_between, snapshot_from_samples


@pytest.fixture
def pauses() -> Iterator[GcPauses]:
    p = GcPauses("test")
    yield p
    p.close()


def _pause(p: GcPauses, monkeypatch: pytest.MonkeyPatch, generation: int, seconds: float) -> None:
    clock = iter([100.0, 100.0 + seconds])
    monkeypatch.setattr(gc_pauses.time, "perf_counter", lambda: next(clock))
    p._callback("start", {"generation": generation})
    p._callback("stop", {"generation": generation, "collected": 0, "uncollectable": 0})


def test_a_real_collection_is_counted_under_its_generation(pauses: GcPauses) -> None:
    before = pauses.snapshot()
    gc.collect()
    after = pauses_between(before, pauses.snapshot())
    assert after["2"]["count"] >= 1
    assert after["2"]["ms"] > 0


def test_pauses_fall_in_their_buckets_and_read_back_from_a_scrape(pauses: GcPauses,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    gc.disable()  # only the pauses below, not the interpreter's own
    try:
        start = pauses.snapshot()
        _pause(pauses, monkeypatch, 0, 0.0004)
        _pause(pauses, monkeypatch, 2, 0.007)
        _pause(pauses, monkeypatch, 2, 0.020)  # on the bound: counted at or under 20 ms
        _pause(pauses, monkeypatch, 2, 0.9)
        monkeypatch.undo()
        snap = pauses.snapshot()
        registry = CollectorRegistry()
        registry.register(pauses)
        text = generate_latest(registry).decode()
    finally:
        gc.enable()
    between = pauses_between(start, snap)
    assert between["0"]["count"] == 1 and between["0"]["over"]["1"] == 0
    assert between["1"]["count"] == 0
    assert between["2"]["count"] == 3
    assert between["2"]["ms"] == pytest.approx(927.0)
    assert between["2"]["over"]["5"] == 3
    assert between["2"]["over"]["10"] == 2
    assert between["2"]["over"]["20"] == 1
    assert between["2"]["over"]["500"] == 1
    assert 'test_gc_pause_seconds_bucket{generation="2",le="0.01"}' in text
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for x in family.samples:
            samples.setdefault(x.name, []).append((dict(x.labels), float(x.value)))
    assert snapshot_from_samples(samples, "test_gc_pause_seconds") == snap


def test_close_removes_the_callback() -> None:
    p = GcPauses("closing")
    assert p._callback in gc.callbacks
    p.close()
    assert p._callback not in gc.callbacks
    p.close()  # twice is harmless
