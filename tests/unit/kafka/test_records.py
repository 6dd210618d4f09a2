"""Consumed records as arrays (stream.kafka.records) and the batcher counting them in chunks."""

from __future__ import annotations

import time

import numpy as np
from confluent_kafka import Message

from stream.kafka.records import Records
from stream.pipeline.batching import MicroBatcher


def chunk(partition: int, first: int, n: int) -> Records:
    offsets = range(first, first + n)
    values = [None if o % 5 == 0 else b"v%d-%d" % (partition, o) for o in offsets]
    return Records.build(values, [b"k%d" % o for o in offsets], [partition] * n, offsets)


def rows(records: Records) -> list[tuple[int, int, bytes | None, bytes | None]]:
    return [(int(p), int(o), records.value(i), records.keys[i])
            for i, (p, o) in enumerate(zip(records.partitions, records.offsets, strict=True))]


def test_concat_split_select_keep_each_record_with_its_value_key_and_position() -> None:
    a, b, c = chunk(0, 0, 7), chunk(1, 10, 4), chunk(0, 7, 3)
    joined = Records.concat([a, Records.empty(), b, c])
    assert rows(joined) == rows(a) + rows(b) + rows(c)
    assert joined.values() == [r[2] for r in rows(joined)]
    assert joined.value(0) is None and joined.value(1) == b"v0-1"
    head, tail = joined.split(5)
    assert rows(head) + rows(tail) == rows(joined)
    picked = joined.select(np.array([1, 8, 12]))
    assert rows(picked) == [rows(joined)[i] for i in (1, 8, 12)]
    assert rows(joined.without_partitions({0})) == rows(b)
    assert joined.without_partitions({5}) is joined
    assert len(Records.concat([])) == 0


def test_compact_gives_records_a_buffer_of_their_own_only_where_the_shared_one_holds_much_more() -> None:
    big = Records.build([None if i % 7 == 0 else bytes([i]) * 100_000 for i in range(40)], [None] * 40,
                        [i % 3 for i in range(40)], range(40))
    head, tail = big.split(5)
    assert head.nbytes == 400_000 and len(head.buffer) == 3_400_000
    own = head.compact()  # one run of the buffer: one slice
    assert rows(own) == rows(head) and len(own.buffer) == own.nbytes == 400_000
    assert tail.compact() is tail  # it holds most of the buffer
    picked = big.select(np.array([3, 0, 30, 12]))  # rows out of order, a null among them
    assert rows(picked.compact()) == rows(picked) and len(picked.compact().buffer) == 300_000
    small = chunk(0, 0, 9).split(2)[0]
    assert small.compact() is small  # what it leaves beside it is under the 1 MiB slack
    assert Records.empty().compact().nbytes == 0


def test_batcher_counts_records_of_chunks_and_drops_revoked_partitions() -> None:
    now = [0.0]
    batcher: MicroBatcher[Records] = MicroBatcher(10, 5, clock=lambda: now[0], size=len)
    batcher.add([chunk(0, 0, 4)])
    assert len(batcher) == 4 and batcher.room == 6 and not batcher.ready()
    batcher.add([chunk(1, 0, 3)])
    assert len(batcher) == 7
    assert batcher.discard(lambda r: r.without_partitions({1})) == 3
    assert len(batcher) == 4 and batcher.deadline() == 0.005  # the first record's clock is kept
    batcher.add([chunk(0, 4, 6)])
    assert batcher.ready() and batcher.room == 0
    assert rows(Records.concat(batcher.take())) == rows(chunk(0, 0, 10))
    batcher.add([chunk(2, 0, 2)])
    assert batcher.discard(lambda r: r.without_partitions({2})) == 2
    assert len(batcher) == 0 and batcher.deadline() is None


def test_consumed_messages_keep_the_last_value_of_each_reply_header_as_the_native_consumer_does() -> None:
    messages = [
        Message(topic="in", partition=0, offset=0, key=b"a", value=b"x"),
        Message(topic="in", partition=0, offset=1, key=None, value=None, headers=[
            ("kafka_correlationId", b"first"), ("kafka_replyTopic", b"spring.replies"), ("other", b"o"),
            ("kafka_correlationId", b"\x00\xff last"), ("kafka_replyPartition", b"\x00\x00\x00\x02")]),
        Message(topic="in", partition=1, offset=7, key=b"c", value=b"z", headers=[("stream.reply", b"r:0:id")],
                timestamp=(1, 1234)),
        Message(topic="in", partition=1, offset=8, key=b"d", value=b"w", headers=[("other", b"o")]),
    ]
    before = time.time_ns()
    records = Records.from_messages(messages)
    assert rows(records) == [(0, 0, b"x", b"a"), (0, 1, None, None), (1, 7, b"z", b"c"), (1, 8, b"w", b"d")]
    assert records.replies is not None
    taken = records.replies[1][-1]
    assert isinstance(taken, int) and before <= taken <= time.time_ns()
    # each name's last value; then the Kafka timestamp (ms; None: the record has none) and when it was taken (ns)
    assert records.replies == {1: (None, b"spring.replies", b"\x00\x00\x00\x02", b"\x00\xff last", None, taken),
                               2: (b"r:0:id", None, None, None, 1234, taken)}
    # each record's key's and watched values' bytes, beside its value's
    assert records.side_bytes is not None and records.side_bytes.tolist() == [1, 14 + 4 + 7, 1 + 6, 1]
    assert records.nbytes == 3 + 34


def test_a_null_last_value_of_a_watched_header_is_absent_as_the_native_consumer_has_it() -> None:
    messages = [Message(topic="in", partition=0, offset=0, key=None, value=b"x",
                        headers=[("stream.reply", b"r:0:id"), ("stream.reply", None)])]
    records = Records.from_messages(messages)
    assert records.replies is None and records.side_bytes is None


def test_each_record_keeps_its_key_and_watched_headers_bytes_through_concat_split_select_and_compact() -> None:
    def watched(first: int, n: int, every: int) -> Records:
        replies = {i: (b"r:0:%d" % (first + i) * (first + i), None, None, None, 0, 0)
                   for i in range(n) if (first + i) % every == 0}
        return Records.build([b"v" * 10] * n, [None] * n, [0] * n, range(first, first + n), replies)

    a, b, c = watched(0, 6, 4), Records.build([b"v"] * 3, [None] * 3, [0] * 3, range(6, 9)), watched(9, 5, 2)
    assert b.side_bytes is None
    assert chunk(0, 0, 3).side_bytes.tolist() == [2, 2, 2]  # its keys'
    joined = Records.concat([a, b, c])
    sizes = [len(b"r:0:%d" % i * i) if i in (0, 4, 10, 12) else 0 for i in range(14)]
    assert joined.side_bytes is not None and joined.side_bytes.tolist() == sizes
    assert joined.nbytes == joined.sizes().sum() == int(np.maximum(joined.lengths, 0).sum()) + sum(sizes)
    head, tail = joined.split(5)
    assert head.side_bytes.tolist() == sizes[:5] and tail.side_bytes.tolist() == sizes[5:]
    assert head.nbytes + tail.nbytes == joined.nbytes
    assert tail.split(5)[0].nbytes == 10 + 3 * 1 + 10  # rows 5 to 9: their values alone (a row of a, b, one of c)
    assert joined.select(np.array([12, 1, 4])).side_bytes.tolist() == [sizes[12], 0, sizes[4]]
    assert joined.select(np.array([1, 2])).nbytes == 20
    assert head.compact().side_bytes is head.side_bytes
