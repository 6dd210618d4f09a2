"""Batches the consumer cannot read (`stream.kafka.unreadable`): finding where one ends from its first offset, its
rows taken a take at a time and the partition moved past it once, errors met again or stale left alone; the decode
stage dead-letters the rows as ``unreadable``. Against a broker: tests/integration/test_failures.py."""

from __future__ import annotations

import math
import threading
import time

import numpy as np
import pytest
from confluent_kafka import KafkaError
from hypothesis import given, settings
from hypothesis import strategies as st

from stream.codec import decoder as decoder_module
from stream.errors import StreamError
from stream.kafka.intake import Intake
from stream.kafka.records import UNREADABLE, Records
from stream.kafka.unreadable import UnreadableBatches, batch_end, probe_config
from tests.unit.codec.test_decoder import IMPLS, demo_side, event_bytes
from tests.unit.kafka.test_intake import Consumer as TakingConsumer
from tests.unit.kafka.test_intake import Msg

Batch = tuple[int, int, bool]  # first offset, last offset, unreadable


class Log:
    """A partition's batches as a broker serves them to an assigned consumer: fetching from an offset returns the
    batch holding it, or the first after it (a gap: compacted), or the partition's end."""

    def __init__(self, batches: list[Batch], end: int, answers: bool = True,
                 gate: threading.Event | None = None) -> None:
        self.batches, self.end, self.answers, self.gate = batches, end, answers, gate
        self.fetches: list[int] = []
        self.stale: list[Msg] = []  # answered first (from before an assignment)
        self.closed = False
        self._at: int | None = None

    def get_watermark_offsets(self, tp: object, timeout: float) -> tuple[int, int]:
        if self.gate is not None:
            assert self.gate.wait(10)
        return 0, self.end

    def assign(self, tps: list) -> None:
        [tp] = tps
        self._at = tp.offset
        self.fetches.append(tp.offset)

    def poll(self, timeout: float) -> Msg | None:
        if self.stale:
            return self.stale.pop(0)
        at, self._at = self._at, None
        if at is None or not self.answers:
            time.sleep(min(timeout, 0.01))
            return None
        for first, last, unreadable in self.batches:
            if last >= at:
                if unreadable:
                    return Msg(0, first, KafkaError(KafkaError._BAD_COMPRESSION, "Decompression failed"))
                return Msg(0, max(first, at))
        return Msg(0, self.end, KafkaError(KafkaError._PARTITION_EOF))

    def close(self) -> None:
        self.closed = True


@st.composite
def layouts(draw: st.DrawFn) -> tuple[list[Batch], int, int]:
    """Batches of 1 to 100,000 records with gaps between some (compaction), some unreadable; which one is met."""
    batches: list[Batch] = []
    at = draw(st.integers(0, 1000))
    for _ in range(draw(st.integers(1, 6))):
        count = draw(st.one_of(st.integers(1, 5), st.integers(1, 100_000)))
        batches.append((at, at + count - 1, draw(st.booleans())))
        at += count + draw(st.sampled_from([0, 0, 1, 17]))
    met = draw(st.integers(0, len(batches) - 1))
    first, last, _ = batches[met]
    batches[met] = (first, last, True)
    return batches, met, at


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_the_end_of_an_unreadable_batch_is_found_from_its_first_offset_in_about_two_log2_n_fetches(
        layout: tuple[list[Batch], int, int]) -> None:
    batches, met, end = layout
    log = Log(batches, end)
    first, last, _ = batches[met]
    assert batch_end(lambda: log, "t", 0, first) == last  # type: ignore[arg-type,return-value]
    assert log.closed
    assert len(log.fetches) <= 2 * math.ceil(math.log2(last - first + 2)) + 2, log.fetches


def test_a_search_without_answers_fails_within_its_bound() -> None:
    log = Log([(0, 9, True)], 10, answers=False)
    clock = iter(range(1000)).__next__
    with pytest.raises(StreamError, match=r"no answer fetching from 1"):
        batch_end(lambda: log, "t", 0, 0, timeout_s=5, probe_timeout_s=0.01)  # type: ignore[arg-type,return-value]
    log.answers = True
    with pytest.raises(StreamError, match=r"not measured within 3 s"):
        batch_end(lambda: log, "t", 0, 0, timeout_s=3, clock=clock)  # type: ignore[arg-type,return-value]
    assert log.closed


def test_answers_from_before_an_assignment_are_not_taken_for_its_own() -> None:
    log = Log([(0, 9, True), (10, 20, False)], 21)
    log.stale = [Msg(0, 0, KafkaError(KafkaError._PARTITION_EOF)), Msg(0, 0), Msg(1, 50)]  # the first probe is at 1
    assert batch_end(lambda: log, "t", 0, 0) == 9  # type: ignore[arg-type,return-value]


def test_a_close_ends_a_measurement_under_way_and_waits_for_it() -> None:
    log = Log([(0, 9, True)], 10, answers=False)
    batches = UnreadableBatches("t", lambda: log, lambda p, o: None)  # type: ignore[arg-type,return-value]
    batches.met(0, 0, "Decompression failed")
    batches.close()
    assert log.closed, "its consumer closed before close() returned"
    with pytest.raises(StreamError, match=r"t\[0\]: measuring the unreadable batch at 0 stopped"):
        batches.rows(10)


def test_the_probe_consumer_keeps_the_workers_settings_but_not_its_group_or_callbacks() -> None:
    conf = probe_config({"bootstrap.servers": "b:9092", "security.protocol": "SASL_SSL", "group.id": "fraud",
                         "error_cb": print, "isolation.level": "read_committed", "statistics.interval.ms": 5000})
    assert conf["bootstrap.servers"] == "b:9092" and conf["security.protocol"] == "SASL_SSL"
    assert conf["isolation.level"] == "read_committed" and "error_cb" not in conf
    assert conf["group.id"].startswith("unreadable-probe-") and conf["enable.auto.commit"] is False
    assert conf["enable.partition.eof"] is True and conf["statistics.interval.ms"] == 0


def measured(batches: UnreadableBatches, n: int) -> tuple[list[int], list[int]]:
    """`rows` once the batches met are measured (on their own thread)."""
    deadline = time.monotonic() + 10
    while True:
        rows = batches.rows(n)
        if rows[1] or not batches.pending or time.monotonic() > deadline:
            return rows
        time.sleep(0.001)


def test_the_rows_of_a_batch_are_taken_a_take_at_a_time_and_the_partition_is_moved_past_it_once() -> None:
    logs = {0: Log([(0, 9, False), (10, 16, True), (17, 30, False)], 31), 1: Log([(5, 5, True)], 6)}
    made: list[int] = []
    seeks: list[tuple[int, int]] = []

    def make(partition: int) -> Log:
        made.append(partition)
        return logs[partition]

    batches = UnreadableBatches("t", lambda: make(made_for[0]), lambda p, o: seeks.append((p, o)))  # type: ignore
    made_for = [0]
    batches.met(0, 10, "Decompression failed")
    batches.met(0, 10, "Decompression failed")  # fetched again before the seek: the same batch
    assert batches.pending
    assert measured(batches, 3) == ([0, 0, 0], [10, 11, 12]) and seeks == [] and made == [0]
    made_for[0] = 1
    batches.met(1, 5, "Decompression failed")
    assert batches.rows(4) == ([0, 0, 0, 0], [13, 14, 15, 16])
    assert measured(batches, 5) == ([1], [5])
    assert seeks == [(0, 17), (1, 6)] and not batches.pending and made == [0, 1]
    made_for[0] = 0
    batches.met(0, 10, "Decompression failed")  # read again (a rewind): met again
    assert measured(batches, 2) == ([0, 0], [10, 11])
    batches.forget({0})  # revoked: its next owner meets it again, as this replica does if it is assigned again
    assert not batches.pending
    batches.met(0, 10, "Decompression failed")
    batches.forget()  # rewound to the committed offsets (an aborted transaction): every partition
    assert not batches.pending
    batches.met(0, 10, "Decompression failed")
    assert measured(batches, 100) == ([0] * 7, list(range(10, 17))) and seeks[-1] == (0, 17)
    batches.close()


def test_a_batch_that_cannot_be_measured_fails_the_take_that_finds_it_so() -> None:
    batches = UnreadableBatches("t", lambda: Log([(0, 9, True)], 10, answers=False),  # type: ignore
                                lambda p, o: None)
    batches.met(0, 0, "Decompression failed")
    with pytest.raises(StreamError, match=r"t\[0\]: no answer fetching from 1"):
        measured(batches, 10)
    batches.close()


def test_without_a_dead_letter_topic_the_first_offset_alone_is_taken_and_nothing_is_skipped() -> None:
    seeks: list[tuple[int, int]] = []
    batches = UnreadableBatches("t", None, lambda p, o: seeks.append((p, o)))
    batches.met(2, 40, "Decompression failed")
    assert batches.rows(10) == ([2], [40])
    batches.met(2, 40, "Decompression failed")  # fetched again: it is not moved past
    assert not batches.pending and seeks == []
    batches.forget()
    batches.met(2, 40, "Decompression failed")  # rewound, or assigned again
    assert batches.rows(10) == ([2], [40])


def test_the_intake_takes_the_other_partitions_records_while_a_batch_is_measured_then_its_rows_in_place() -> None:
    gate = threading.Event()
    log = Log([(5, 5, False), (6, 9, True)], 10, gate=gate)
    seeks: list[tuple[int, int]] = []
    taking = TakingConsumer([Msg(0, 5), Msg(0, 6, KafkaError(KafkaError._BAD_COMPRESSION, "Decompression failed")),
                             Msg(1, 7)])
    intake = Intake(taking, None, lambda: 0.0,  # type: ignore[arg-type]
                    unreadable=UnreadableBatches("t", lambda: log, lambda p, o: seeks.append((p, o))))  # type: ignore
    first = intake.take(10, 0.5)
    assert first.partitions.tolist() == [0, 1] and first.offsets.tolist() == [5, 7]
    taking.messages = [Msg(1, 8)]
    assert intake.take(10, 0.5).offsets.tolist() == [8], "the other partitions go on meanwhile"
    gate.set()
    deadline = time.monotonic() + 10
    second = Records.empty()
    while 6 not in second.offsets.tolist() and time.monotonic() < deadline:
        taking.messages = [Msg(1, 9)]  # the next fetched record of the other partition (read and let go)
        second = intake.take(10, 0.5)
    assert second.partitions.tolist() == [0, 0, 0, 0, 1] and second.offsets.tolist() == [6, 7, 8, 9, 9]
    assert second.lengths.tolist()[:4] == [UNREADABLE] * 4 and second.values()[:4] == [None] * 4
    assert seeks == [(0, 10)]
    assert taking.asked[-1] == (6, 0), "behind the rows, what is already fetched (no wait)"
    intake.close()


@pytest.mark.parametrize("impl", IMPLS)
def test_the_decode_stage_dead_letters_unreadable_rows_as_such_and_decodes_the_rest(impl: str) -> None:
    decoder, _ = demo_side(impl)
    good = Records.build([event_bytes(), event_bytes(event_id="e-2")], [None, None], [0, 0], [1, 4])
    records = Records.concat([good.split(1)[0], Records.unreadable([0, 0], [2, 3]), good.split(1)[1]])
    decoded, errors = decoder.decode_batch(records)
    assert decoded.index.tolist() == [0, 3]
    assert [(i, e.reason) for i, e in errors] == [(1, "unreadable"), (2, "unreadable")]
    assert "could not decompress" in str(errors[0][1])
    assert np.array_equal(records.sizes(), np.array([len(event_bytes()), 0, 0, len(event_bytes(event_id="e-2"))]))
    assert decoder_module._HEADER_ERRORS[-5][0] == "unreadable"
