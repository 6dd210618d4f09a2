"""The broker's collection pauses inside a latency step (``gc_pauses``), read from its ``-Xlog:gc`` file."""

from __future__ import annotations

from pathlib import Path

from stream.bench.probes import gc_pauses
from stream.bench.report import format_gc

# As JDK 17's G1 writes them with -Xlog:gc:...:timemillis,uptimemillis (a line when the pause or cycle ends).
_LINES = """\
[1795500000000ms][3ms] Using G1
[1795500010000ms][10003ms] GC(0) Pause Young (Normal) (G1 Evacuation Pause) 3071M->41M(6144M) 31.500ms
[1795500020000ms][20003ms] GC(1) Pause Young (Concurrent Start) (Metadata GC Threshold) 900M->60M(6144M) 8.250ms
[1795500020001ms][20004ms] GC(2) Concurrent Mark Cycle
[1795500020400ms][20403ms] GC(2) Pause Remark 70M->70M(6144M) 5.000ms
[1795500020500ms][20503ms] GC(2) Concurrent Mark Cycle 499.000ms
"""


def test_pauses_that_overlap_the_window_are_counted_and_concurrent_work_is_not(tmp_path: Path) -> None:
    log = tmp_path / "gc.log"
    log.write_text(_LINES)
    everything = gc_pauses(log, 1795500000.0, 1795500030.0)
    assert everything == {"pauses": 3, "total_ms": 44.75, "max_ms": 31.5}
    # GC(0) ended at 10.000 s after 31.5 ms: a window from 9.98 s still holds it, one from 10.001 s does not.
    assert gc_pauses(log, 1795500009.98, 1795500010.5)["pauses"] == 1
    assert gc_pauses(log, 1795500010.001, 1795500019.0) == {"pauses": 0, "total_ms": 0.0, "max_ms": 0.0}
    # A window that ends while GC(0) has already begun (at 9.9685 s) holds it too.
    assert gc_pauses(log, 1795500000.0, 1795500009.97)["pauses"] == 1


def test_rotated_files_are_read_and_a_missing_log_is_no_pause(tmp_path: Path) -> None:
    log = tmp_path / "gc.log"
    (tmp_path / "gc.log.0").write_text(_LINES.splitlines(keepends=True)[1])
    log.write_text("".join(_LINES.splitlines(keepends=True)[2:]))
    assert gc_pauses(log, 1795500000.0, 1795500030.0)["pauses"] == 3
    assert gc_pauses(tmp_path / "none.log", 0.0, 2e9)["pauses"] == 0


def test_the_table_cell() -> None:
    assert format_gc(None) == "-"  # no log: a given cluster, or Tansu
    assert format_gc({"pauses": 0, "total_ms": 0.0, "max_ms": 0.0}) == "0"
    assert format_gc({"pauses": 2, "total_ms": 40.2, "max_ms": 31.5}) == "2 (max 32 ms)"
