"""StallDetector (pure, fake clock) and the worker's stall check against a fake consumer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from stream.config import WorkerSettings
from stream.errors import ConfigError
from stream.records import Records
from stream.stalls import StallDetector
from stream.worker import Worker
from tests.handlers import PoisonHandler

A, B = ("in", 0), ("in", 1)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def detector(timeout_s: float = 100.0) -> tuple[StallDetector, FakeClock]:
    clock = FakeClock()
    return StallDetector(timeout_s, clock), clock


def check(d: StallDetector, waiting: dict[tuple[str, int], bool]) -> list[tuple[str, int]]:
    """One check as the worker does it: only the idle partitions are looked at."""
    idle = set(d.idle())
    return d.judge({tp: w for tp, w in waiting.items() if tp in idle})


def test_a_partition_with_records_waiting_and_no_progress_is_reported_after_the_timeout_not_before() -> None:
    d, clock = detector(100.0)
    d.assign([A, B])
    assert d.check_every_s == 25.0
    reported_at = None
    for _ in range(12):  # checks every 25 s for 300 s
        clock.now += 25.0
        if check(d, {A: True, B: False}) and reported_at is None:
            reported_at = clock.now - 1000.0
    assert d.stalled() == [A]
    # Waiting records were first seen at the first check after it went idle (25 s); 100 s of that.
    assert reported_at == 125.0


def test_a_stalled_partition_is_warned_about_again_each_timeout_and_recovers_on_progress() -> None:
    d, clock = detector(100.0)
    d.assign([A])
    warnings = []
    for _ in range(16):  # 400 s
        clock.now += 25.0
        warnings += [clock.now - 1000.0 for _ in check(d, {A: True})]
    assert warnings == [125.0, 225.0, 325.0]
    d.progressed(A)
    assert d.stalled() == [] and d.take_recovered() == [A] and d.take_recovered() == []
    assert d.idle() == [], "it just made progress"


def test_records_arriving_at_a_long_idle_partition_do_not_make_it_stalled_at_once() -> None:
    d, clock = detector(100.0)
    d.assign([A])
    for _ in range(40):  # 1000 s idle with nothing to do
        clock.now += 25.0
        assert check(d, {A: False}) == []
    clock.now += 25.0
    assert check(d, {A: True}) == [] and d.stalled() == []  # a record arrived: not stuck yet
    clock.now += 25.0
    d.progressed(A)  # and the worker handled it
    for _ in range(8):
        clock.now += 25.0
        assert check(d, {A: False}) == []
    assert d.stalled() == []


def test_records_waiting_must_be_seen_at_every_check_for_the_whole_timeout() -> None:
    d, clock = detector(100.0)
    d.assign([A])
    pattern = [True, True, True, False] * 5  # never four checks in a row
    for waiting in pattern:
        clock.now += 25.0
        assert check(d, {A: waiting}) == []
    assert d.stalled() == []


def test_a_stalled_partition_that_is_revoked_or_caught_up_is_no_longer_stalled() -> None:
    d, clock = detector(10.0)
    d.assign([A, B])
    for _ in range(8):
        clock.now += 2.5
        check(d, {A: True, B: True})
    assert d.stalled() == [A, B]
    d.forget([A])
    clock.now += 2.5
    check(d, {B: False})  # its records are gone (retention, a truncated topic)
    assert d.stalled() == [] and d.take_recovered() == [B]
    assert d.judge({A: True}) == [], "a forgotten partition is not judged"


def test_checks_are_due_every_quarter_of_the_timeout() -> None:
    d, clock = detector(8.0)
    assert not d.due()
    clock.now += 2.0
    assert d.due() and not d.due()
    clock.now += 1.9
    assert not d.due()
    clock.now += 0.1
    assert d.due()


def test_a_non_positive_timeout_is_refused() -> None:
    with pytest.raises(ConfigError, match="stall timeout"):
        StallDetector(0.0)


# ---------------------------------------------------------------------------- the worker's check

class OffsetsConsumer:
    """Answers end offsets, application positions and committed offsets from dicts (absent: not known)."""

    def __init__(self, ends: dict[int, int], positions: dict[int, int], committed: dict[int, int] | None = None,
                 committed_error: bool = False) -> None:
        self.ends, self.positions, self.committed_offsets = ends, positions, committed or {}
        self.committed_error = committed_error
        self.fetched: dict[int, int] = {}  # end offsets from the last fetch responses
        self.committed_asked: list[int] = []

    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        assert all(tp.offset == -1 for tp in partitions), "latest offsets are asked with timestamp -1"
        return [TopicPartition(tp.topic, tp.partition, self.ends.get(tp.partition, -1)) for tp in partitions]

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool) -> tuple[int, int]:
        assert cached, "no round trip per partition"
        return -1001, self.fetched.get(tp.partition, -1001)

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, self.positions.get(tp.partition, -1001)) for tp in partitions]

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        self.committed_asked += [tp.partition for tp in partitions]
        if self.committed_error:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        return [TopicPartition(tp.topic, tp.partition, self.committed_offsets.get(tp.partition, -1001))
                for tp in partitions]


@pytest.fixture
def worker(model_dir: Path) -> Worker:
    settings = WorkerSettings(bootstrap_servers="127.0.0.1:1", input_topic="in", output_topic="out", group_id="g",
                              model_dir=model_dir, stall_timeout_s=8.0)
    return Worker(settings, handler=PoisonHandler(model_dir))


def waiting(worker: Worker, consumer: Any, tps: list[tuple[str, int]]) -> dict[tuple[str, int], bool]:
    worker._consumer = consumer
    worker._tracker.assign(tps)
    return worker._records_waiting(tps)


def test_records_waiting_beyond_what_was_taken_or_committed(worker: Worker) -> None:
    consumer = OffsetsConsumer(ends={0: 50, 1: 50, 2: 50}, positions={0: 50, 1: 40})
    worker._committed_positions[("in", 2)] = 50  # committed all, nothing taken since (position unknown)
    assert waiting(worker, consumer, [("in", 0), ("in", 1), ("in", 2)]) == {
        ("in", 0): False, ("in", 1): True, ("in", 2): False}
    assert consumer.committed_asked == [], "positions known locally: no committed offsets asked"


def test_a_transaction_marker_after_the_last_record_is_not_taken_for_a_waiting_record(worker: Worker) -> None:
    # Transactional input: the last data record is offset 48, its commit marker 49; the end offset is 50. The
    # worker committed 49 (last record + 1); the consumer's position is past the marker.
    worker._committed_positions[A] = 49
    assert waiting(worker, OffsetsConsumer(ends={0: 50}, positions={0: 50}), [A]) == {A: False}


def test_records_taken_and_not_committed_are_waiting_even_at_the_end_offset(worker: Worker) -> None:
    consumer = OffsetsConsumer(ends={0: 50, 1: 50}, positions={0: 50, 1: 50})
    worker._consumer = consumer  # type: ignore[assignment]
    worker._tracker.assign([A, B])
    worker._tracker.dispatch(A, 40, 49, 10)  # dispatched, never acknowledged (a stuck processor)
    worker._batcher.add([Records.build([b"x"], [None], [1], [49])])  # taken, never dispatched
    assert worker._records_waiting([A, B]) == {A: True, B: True}
    worker._tracker.confirm({A: 50})
    worker._batcher.take()
    assert worker._records_waiting([A, B]) == {A: False, B: False}


def test_a_partition_never_taken_from_is_judged_by_the_groups_committed_offset(worker: Worker) -> None:
    consumer = OffsetsConsumer(ends={0: 50, 1: 50, 2: 0}, positions={}, committed={0: 50, 1: 20})
    assert waiting(worker, consumer, [A, B, ("in", 2)]) == {A: False, B: True, ("in", 2): False}
    assert consumer.committed_asked == [0, 1, 2]


def test_committed_offsets_held_by_an_open_transaction_count_as_records_waiting(worker: Worker) -> None:
    consumer = OffsetsConsumer(ends={0: 50, 1: 0}, positions={}, committed_error=True)
    assert waiting(worker, consumer, [A, B]) == {A: True, B: False}


def test_with_auto_offset_reset_latest_an_uncommitted_partition_is_not_judged(model_dir: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_AUTO_OFFSET_RESET", "latest")
    settings = WorkerSettings(bootstrap_servers="127.0.0.1:1", input_topic="in", output_topic="out", group_id="g",
                              model_dir=model_dir)
    w = Worker(settings, handler=PoisonHandler(model_dir))
    assert waiting(w, OffsetsConsumer(ends={0: 50}, positions={}), [A]) == {}


def test_end_offsets_that_cannot_be_read_leave_the_partitions_unjudged(worker: Worker) -> None:
    consumer = OffsetsConsumer(ends={1: 50}, positions={1: 10})
    assert waiting(worker, consumer, [A, B]) == {B: True}


def test_the_end_offset_of_the_last_fetch_counts_when_listoffsets_answers_less(worker: Worker) -> None:
    # Tansu answers ListOffsets(latest) wrongly (1 for a 1,449-record partition); its fetches carry the truth.
    consumer = OffsetsConsumer(ends={0: 1, 1: 1}, positions={0: 700, 1: 1449})
    consumer.fetched = {0: 1449, 1: 1449}
    assert waiting(worker, consumer, [A, B]) == {A: True, B: False}
