"""The chaos verifier's reading of repeats: bursts by first append time, and the fleet's fastest stretch, which
bounds what a killed replica can have delivered uncommitted (`tests/chaos/test_chaos.py`)."""

from __future__ import annotations

from tests.chaos.runner import ChaosResult
from tests.chaos.verifier import duplicate_bursts, peak_within


def _out(src_off: int, ts: int, topic: str = "out", src_p: int = 0) -> tuple[str, int, int, int, str, int, int]:
    return (topic, 0, src_p, src_off, f"e{src_p}-{src_off}", 0, ts)


def test_repeats_group_by_their_first_copy_s_time_and_count_every_extra_copy() -> None:
    outputs = [_out(1, 1_000), _out(2, 1_100), _out(3, 1_150), _out(9, 1_200),  # first copies
               _out(1, 5_000), _out(2, 5_000), _out(3, 5_000), _out(3, 9_000),  # 3 is written three times
               _out(7, 3_000), _out(7, 6_000),  # a second kill, 1.85 s later
               _out(8, 2_000, topic="dlq"), _out(8, 2_100, topic="dlq")]  # dead letters are not the output's
    assert duplicate_bursts(outputs, "out", gap_ms=500) == [(1_000, 1_150, 4), (3_000, 3_000, 1)]
    assert duplicate_bursts(outputs, "out", gap_ms=2_000) == [(1_000, 3_000, 5)]
    assert duplicate_bursts([_out(1, 1_000), _out(1, 1_000, src_p=1)], "out") == []  # two partitions' records


def test_the_peak_counts_the_densest_window_both_ends_included() -> None:
    assert peak_within([], 200) == 0
    assert peak_within([5], 200) == 1
    assert peak_within([0, 100, 200, 201, 450, 460, 470, 480, 481], 200) == 5  # 450 to 481, not 0 to 201
    assert peak_within([0, 100, 200], 200) == 3 and peak_within([0, 100, 201], 200) == 2
    assert peak_within([300, 0, 100, 200], 100) == 2  # unsorted input


def test_the_timeline_puts_the_bursts_among_the_fleet_s_actions() -> None:
    result = ChaosResult(events=10, kills=1, freezes=0, rebalances=2, lost=0, duplicates=3, order_violations=0,
                         commit_problems=[], hanging_transactions=[], aborted_records_seen_uncommitted=0,
                         worker_failures=[], duplicate_bursts=[(10_900, 11_000, 3)],
                         fleet_log=[(10_000, "start r0"), (11_050, "SIGKILL r0"), (11_100, "start r0")])
    assert result.timeline() == ["+   0.00 s  start r0", "+   0.90 s  3 repeats, first written 0.90-1.00 s",
                                 "+   1.05 s  SIGKILL r0", "+   1.10 s  start r0"]
