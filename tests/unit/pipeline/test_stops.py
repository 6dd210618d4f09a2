"""The note a worker that stopped on purpose leaves in its group's offsets, and what the next start makes of it
(`stream.pipeline.stops`; against a real broker: tests/integration/test_failures.py)."""

from __future__ import annotations

import pytest

from stream.errors import StoppedOnPurpose
from stream.pipeline.dead_letters import DeadLetterBreaker
from stream.pipeline.stops import PreviousStops, StopNote


def test_a_note_reads_back_as_written_and_other_metadata_is_no_note() -> None:
    note = StopNote("dead-letter-breaker", "x" * 5000, 120, 1_700_000_000_000, 2, (221, 207))
    encoded = note.encode()
    assert len(encoded) < 1000, "well under the broker's offset.metadata.max.bytes"
    back = StopNote.parse(encoded)
    assert back is not None and back.position == 120 and back.stops == 2 and back.counts == (221, 207)
    assert back.message == "x" * 600
    for other in (None, "", "a commit's own metadata", '{"stream.stopped": 1}', "not json stream.stopped"):
        assert StopNote.parse(other) is None
    assert "2023-11-14 22:13:20 UTC (2 times in a row)" in note.describe()


def test_readiness_names_held_partitions_until_the_worker_commits_past_the_note() -> None:
    notes = {0: StopNote("no-dlq-topic", "bad record", 40, 0), 1: StopNote("no-dlq-topic", "bad record", 7, 0)}
    previous = PreviousStops("in", notes)
    positions: dict[tuple[str, int], int] = {("in", 0): 40}
    pending = previous.pending([("in", 0), ("other", 1)], positions.get)
    assert len(pending) == 1 and pending[0].startswith("in[0]: the last run stopped on purpose at offset 40")
    assert "docs/operations.md" in pending[0]
    positions[("in", 0)] = 41
    assert previous.pending([("in", 0)], positions.get) == []
    assert list(previous.notes) == [1], "a note passed is dropped; one for a partition held elsewhere stays"


def test_a_primed_breaker_stops_at_the_first_failed_batch_and_good_batches_dilute_it() -> None:
    breaker = DeadLetterBreaker(0.5, window=1000)
    breaker.prime(128, 128)
    breaker.record(64, 0)  # a fixed model: successes never trip it
    breaker.record(64, 0)
    breaker.record(64, 10)  # 138 of 320: under half
    with pytest.raises(StoppedOnPurpose) as stopped:
        breaker.record(64, 64, (2, 300))
    assert stopped.value.counts == (384, 202) and (stopped.value.partition, stopped.value.offset) == (2, 300)
