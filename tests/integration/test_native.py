"""The native producer against the session broker: every record delivered once, with its key and value, to
the partition confluent-kafka's producer picks for that key; spans acknowledged only after delivery."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from stream.errors import TransactionError
from stream.kafka import native
from stream.kafka.delivery import SpanDelivery
from stream.kafka.offsets import OffsetTracker
from stream.kafka.publish import Publisher
from stream.kafka.topics import create_topics
from tests.conftest import BrokerInfo

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120),
              pytest.mark.skipif(native.unavailable() is not None, reason=f"native: {native.unavailable()}")]
PARTITIONS = 6


def _read(bootstrap: str, topic: str, count: int,
          isolation: str = "read_uncommitted") -> list[tuple[int, bytes | None, bytes | None]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-reader", "enable.auto.commit": False,
                         "isolation.level": isolation})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    found: list[tuple[int, bytes | None, bytes | None]] = []
    try:
        for _ in range(300):
            found += [(m.partition(), m.key(), m.value()) for m in consumer.consume(1000, 0.1) if m.error() is None]
            if len(found) >= count:
                break
    finally:
        consumer.close()
    return found


def test_records_arrive_once_keyed_like_confluent_kafka_and_spans_complete_after_delivery(
        broker: BrokerInfo, unique_name: Callable[[str], str]) -> None:
    out, reference = unique_name("out"), unique_name("ref")
    create_topics(broker.bootstrap, [out, reference], PARTITIONS)
    n = 3000
    keys: list[bytes | None] = [None if i % 10 == 0 else b"account-%d" % (i % 97) for i in range(n)]
    values = [b"prediction-%d" % i for i in range(n)]
    ends = np.cumsum([len(v) for v in values]).astype(np.int64)
    row_partitions = np.arange(n, dtype=np.int64) % 3  # three input partitions: three spans
    tracker = OffsetTracker()
    tracker.assign([("in", p) for p in range(3)])
    done: list[SpanDelivery] = []
    publisher = Publisher({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "acks": "all",
                           "linger.ms": 5}, on_span_done=done.append, native_topic=out)
    deliveries = {p: SpanDelivery(publisher, tracker.dispatch(("in", p), 0, n // 3 - 1, n // 3)) for p in range(3)}
    publisher.produce_joined(out, b"".join(values), ends, keys, row_partitions, deliveries)
    assert done == []  # nothing is acknowledged before its reports are served
    for _ in range(100):
        publisher.send_now(0.1)
        if len(done) == 3:
            break
    assert len(done) == 3 and {id(d) for d in done} == {id(d) for d in deliveries.values()}
    assert all(d.span.outstanding == 0 for d in done)
    assert publisher.failure() is None
    assert publisher.close(5.0) == 0

    confluent = Producer({"bootstrap.servers": broker.bootstrap})
    for k, v in zip(keys, values, strict=True):
        confluent.produce(reference, v, k)
    assert confluent.flush(30) == 0

    got = _read(broker.bootstrap, out, n)
    assert sorted(v for _, _, v in got) == sorted(values)  # each once
    by_value = {v: (p, k) for p, k, v in got}
    assert all(by_value[v][1] == k for k, v in zip(keys, values, strict=True))
    expected = {v: p for p, _, v in _read(broker.bootstrap, reference, n)}
    keyed = [v for k, v in zip(keys, values, strict=True) if k is not None]
    assert all(by_value[v][0] == expected[v] for v in keyed)  # same partitioner, same partition per key


def test_records_with_headers_go_in_row_order_among_the_others_through_the_c_client(
        broker: BrokerInfo, unique_name: Callable[[str], str]) -> None:
    """A batch where some rows carry a trace context: those go one by one (librdkafka's batch call takes no
    headers), the others in runs; every record once, the headers on exactly their rows, each key's records in row
    order, every span complete."""
    out = unique_name("out")
    create_topics(broker.bootstrap, [out], PARTITIONS)
    n = 2000
    keys: list[bytes | None] = [b"account-%d" % (i % 13) for i in range(n)]
    values = [b"%06d" % i for i in range(n)]
    traced = {i: [("traceparent", b"00-%032x-%016x-01" % (i + 1, i + 1)), ("tenant", b"t%d" % i)]
              for i in range(n) if i % 7 in (0, 1) or i >= n - 3}  # runs of one and two, and the last rows
    tracker = OffsetTracker()
    tracker.assign([("in", 0)])
    done: list[SpanDelivery] = []
    publisher = Publisher({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "acks": "all",
                           "linger.ms": 5}, on_span_done=done.append, native_topic=out)
    delivery = SpanDelivery(publisher, tracker.dispatch(("in", 0), 0, n - 1, n))
    publisher.produce_joined(out, b"".join(values), np.cumsum([len(v) for v in values]).astype(np.int64), keys,
                             np.zeros(n, dtype=np.int64), {0: delivery}, traced)
    for _ in range(100):
        publisher.send_now(0.1)
        if done:
            break
    assert done == [delivery] and delivery.span.outstanding == 0 and publisher.failure() is None
    assert publisher.close(5.0) == 0
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"{out}-reader",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(out, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
    got: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]] = []
    try:
        for _ in range(300):
            got += [(m.key(), m.value(), list(m.headers() or [])) for m in consumer.consume(1000, 0.1)  # type: ignore[misc]
                    if m.error() is None]
            if len(got) >= n:
                break
    finally:
        consumer.close()
    assert sorted(v for _, v, _ in got) == values  # each once
    assert {int(v): h for _, v, h in got if h} == traced  # the headers on their rows, and on no other
    for key in set(keys):
        rows = [int(v) for k, v, _ in got if k == key]
        assert rows == sorted(rows), f"{key!r} out of row order"


def _subscribe(bootstrap: str, topic: str, group: str, log: list[str]) -> tuple[Consumer, native.NativeInput]:
    def on_assign(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.append(f"assign {sorted(tp.partition for tp in partitions)}")
        source.route([tp.partition for tp in partitions])

    def on_revoke(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.append(f"revoke {sorted(tp.partition for tp in partitions)}")

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "partition.assignment.strategy": "cooperative-sticky",
                         "enable.partition.eof": True})
    source = native.NativeInput(consumer, topic)
    consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
    return consumer, source


def _take(consumer: Consumer, source: native.NativeInput, n: int, timeout_s: float,
          eof: set[int] | None = None, replies: dict[tuple[int, int], tuple[bytes | int | None, ...]] | None = None,
          first: bool = False) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """One round as the worker does it: serve the consumer's queue (it must hold no record), then take records."""
    assert [m for m in consumer.consume(100, 0) if m.error() is None] == []
    records, errors, _pending = source.consume(n, timeout_s, first)
    for partition, _offset, code, _text in errors:
        assert code == KafkaError._PARTITION_EOF
        if eof is not None:
            eof.add(partition)
    if replies is not None and records.replies:
        replies.update(((int(records.partitions[i]), int(records.offsets[i])), a) for i, a in records.replies.items())
    # each record's bytes beside its value, which count toward a batch's bytes: its key's and its replies entry's
    held = records.replies or {}
    expected = [len(records.keys[i] or b"") + sum(len(v) for v in held.get(i, ())[:-2] if isinstance(v, bytes))
                for i in range(len(records))]
    sizes = records.side_bytes
    assert (sizes is None) == (not any(expected)) and (sizes is None or sizes.tolist() == expected)
    return [(int(p), int(o), records.value(i), records.keys[i])
            for i, (p, o) in enumerate(zip(records.partitions, records.offsets, strict=True))]


BASE_MS = 1_700_000_000_000  # the records' timestamps: this plus their number


def test_native_input_takes_every_record_once_in_order_with_keys_and_null_values(
        broker: BrokerInfo, unique_name: Callable[[str], str]) -> None:
    topic = unique_name("in")
    create_topics(broker.bootstrap, [topic], PARTITIONS)
    n = 5000
    # Idempotent, so that a batch retried on the topic just created cannot land after a later one: the offsets
    # below are taken to be the order of production.
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "enable.idempotence": True})
    sent = {}
    # i -> the reply headers' values it was sent with (ADDRESS_HEADERS: this project's on every 13th record, Spring's
    # on every 19th, with a first value of each name that the last one replaces; others have other headers or none)
    addresses: dict[int, tuple[bytes | None, ...]] = {}
    for i in range(n):
        key = None if i % 7 == 0 else b"k%d" % i
        value = None if i % 11 == 0 else b"v%d" % i * (1 + i % 5)
        own = b"r:%d:id-%d" % (i % 3, i) if i % 13 == 0 else None
        headers = [("stream.reply", own)] if own else []
        if i % 19 == 0:
            correlation = bytes([i % 256, 0, 255]) + b"%d" % i
            partition = (i % 3).to_bytes(4, "big") if i % 2 else None
            headers += [("kafka_correlationId", b"first"), ("kafka_replyTopic", b"spring.replies"),
                        ("kafka_correlationId", correlation)]
            headers += [("kafka_replyPartition", partition)] if partition else []
            addresses[i] = (own, b"spring.replies", partition, correlation)
        elif own:
            addresses[i] = (own, None, None, None)
        if i % 17 == 0:
            headers.append(("unrelated", b"x"))
        producer.produce(topic, value, key, partition=i % PARTITIONS, headers=headers or None, timestamp=BASE_MS + i)
        sent[i] = (i % PARTITIONS, key, value)
    assert producer.flush(30) == 0
    log: list[str] = []
    consumer, source = _subscribe(broker.bootstrap, topic, unique_name("g"), log)
    got: list[tuple[int, int, bytes | None, bytes | None]] = []
    eof: set[int] = set()
    before = time.time_ns()
    replies: dict[tuple[int, int], tuple[bytes | int | None, ...]] = {}
    first_takes: list[int] = []  # the sizes of the takes that waited for one record only
    try:
        for r in range(600):
            # every other take as an empty batch's (first): one record waited for, then what is already fetched
            taken = _take(consumer, source, 1000, 0.1, eof, replies, first=r % 2 == 1)
            got += taken
            if r % 2:
                first_takes.append(len(taken))
            if len(got) >= n and len(eof) == PARTITIONS:
                break
    finally:
        source.close()
        consumer.close()
    assert log[0] == f"assign {list(range(PARTITIONS))}"
    assert len(got) == n  # each once
    assert max(first_takes) > 1, first_takes  # a backlog's records in one take, not one record
    for p in range(PARTITIONS):
        offsets = [o for q, o, _, _ in got if q == p]
        assert offsets == list(range(len(offsets)))  # in order, none skipped
    assert Counter((p, k, v) for p, _, v, k in got) == Counter(sent.values())
    # the reply headers of each record that had any, at that record (its offset is i // PARTITIONS)
    assert any(a[0] and a[1] for a in addresses.values()) and any(a[2] for a in addresses.values())
    # then its timestamp (ms) and when it was taken (ns)
    taken = {v[-1] for v in replies.values()}
    assert all(isinstance(t, int) and before <= t <= time.time_ns() for t in taken), taken
    at = {i: (i % PARTITIONS, i // PARTITIONS) for i in addresses}
    assert replies == {at[i]: (*a, BASE_MS + i, replies[at[i]][-1]) for i, a in addresses.items()}
    with pytest.raises(RuntimeError, match="closed"):
        source.consume(1, 0)


def test_records_of_many_headers_give_their_watched_values_and_the_most_librdkafka_parses_none(
        broker: BrokerInfo, unique_name: Callable[[str], str]) -> None:
    """Each record's headers are parsed, searched once and freed as it is taken, not held for the whole take (a
    take of records of 100,000 headers each held some 6 MB a record): the values found are the same, the last of
    each name, wherever it is among the others."""
    topic = unique_name("in")
    create_topics(broker.bootstrap, [topic], 1)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5, "compression.type": "lz4",
                         "message.max.bytes": 10_000_000})
    filler = [("x", b"")] * 99_990
    reply = ("stream.reply", b"r:0:id")
    producer.produce(topic, b"v0", headers=[reply, *filler, ("kafka_correlationId", b"c0")])
    producer.produce(topic, b"v1", headers=[*filler[:50_000], ("stream.reply", b"first"), *filler[:49_000], reply,
                                            ("stream.reply", None)])  # the last one is null: absent
    producer.produce(topic, b"v2", headers=[reply, *filler, *filler[:20]])  # 100,011: librdkafka parses none
    producer.produce(topic, b"v3", headers=[("stream.reply", b"")])  # empty, not absent
    producer.produce(topic, b"v4")
    assert producer.flush(30) == 0
    consumer, source = _subscribe(broker.bootstrap, topic, unique_name("g"), [])
    got: list[tuple[int, int, bytes | None, bytes | None]] = []
    replies: dict[tuple[int, int], tuple[bytes | int | None, ...]] = {}
    try:
        for _ in range(300):
            got += _take(consumer, source, 10, 0.1, replies=replies)
            if len(got) >= 5:
                break
    finally:
        source.close()
        consumer.close()
    assert [v for _, _, v, _ in got] == [b"v0", b"v1", b"v2", b"v3", b"v4"]
    assert {o: a[:4] for (_, o), a in replies.items()} == {0: (b"r:0:id", None, None, b"c0"),
                                                          3: (b"", None, None, None)}


def test_native_input_follows_a_cooperative_rebalance(broker: BrokerInfo, unique_name: Callable[[str], str]) -> None:
    """A second member joins: the first stops getting records of the partitions it gave up, the second gets them
    from the committed offsets, and no record reaches either consumer's own queue."""
    topic, group = unique_name("in"), unique_name("g")
    create_topics(broker.bootstrap, [topic], PARTITIONS)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(3000):
        producer.produce(topic, b"a%d" % i, partition=i % PARTITIONS)
    assert producer.flush(30) == 0
    log_a: list[str] = []
    a, source_a = _subscribe(broker.bootstrap, topic, group, log_a)
    b = source_b = None
    try:
        first: list[tuple[int, int, bytes | None, bytes | None]] = []
        for _ in range(300):
            first += _take(a, source_a, 1000, 0.1)
            if len(first) >= 3000:
                break
        assert len(first) == 3000
        a.commit(offsets=[TopicPartition(topic, p, 500) for p in range(PARTITIONS)], asynchronous=False)
        log_b: list[str] = []
        b, source_b = _subscribe(broker.bootstrap, topic, group, log_b)
        for _ in range(300):
            _take(a, source_a, 100, 0.05)
            _take(b, source_b, 100, 0.05)
            if b.assignment() and len(a.assignment()) < PARTITIONS:
                break
        kept = {tp.partition for tp in a.assignment()}
        moved = {tp.partition for tp in b.assignment()}
        assert kept and moved and kept.isdisjoint(moved) and kept | moved == set(range(PARTITIONS))
        for i in range(3000, 6000):
            producer.produce(topic, b"b%d" % i, partition=i % PARTITIONS)
        assert producer.flush(30) == 0
        got_a: list[tuple[int, int, bytes | None, bytes | None]] = []
        got_b: list[tuple[int, int, bytes | None, bytes | None]] = []
        for _ in range(300):
            got_a += _take(a, source_a, 1000, 0.05)
            got_b += _take(b, source_b, 1000, 0.05)
            if len(got_a) + len(got_b) >= 3000 + 500 * len(moved):
                break
        assert {p for p, _, _, _ in got_a} <= kept
        assert {p for p, _, _, _ in got_b} == moved
        for p in moved:  # from the committed offset on, in order
            assert [o for q, o, _, _ in got_b if q == p] == list(range(500, 1000))
        for p in kept:  # where it left off
            assert [o for q, o, _, _ in got_a if q == p] == list(range(500, 1000))
    finally:
        for source, consumer in ((source_a, a), (source_b, b)):
            if source is not None and consumer is not None:
                source.close()
                consumer.close()


def test_in_a_transaction_records_go_out_on_the_producers_own_handle_and_only_a_commit_shows_them(
        broker: BrokerInfo, unique_name: Callable[[str], str]) -> None:
    """Exactly-once: ``produce_into`` enqueues on the transactional producer itself (a local queue of 500 records
    makes the 3,000 wait for room), keyed like confluent-kafka; an aborted transaction's records are never seen by
    a read_committed reader, a committed one's are, each once."""
    if not broker.hides_aborted_transactions:
        pytest.skip(f"{broker.kind} shows aborted transactions to read_committed readers")
    out, reference = unique_name("txn-out"), unique_name("txn-ref")
    create_topics(broker.bootstrap, [out, reference], PARTITIONS)
    n = 3000
    keys: list[bytes | None] = [None if i % 10 == 0 else b"account-%d" % (i % 97) for i in range(n)]
    row_partitions = np.zeros(n, dtype=np.int64)
    tracker = OffsetTracker()
    tracker.assign([("in", 0)])
    publisher = Publisher({"bootstrap.servers": broker.bootstrap, "transactional.id": unique_name("txn"),
                           "linger.ms": 5, "queue.buffering.max.messages": 500}, on_span_done=lambda d: None,
                          native_topic=out)
    publisher.init_transactions(30.0)

    def produce(tag: bytes, first: int) -> list[bytes]:
        values = [b"%s-%d" % (tag, i) for i in range(n)]
        ends = np.cumsum([len(v) for v in values]).astype(np.int64)
        delivery = SpanDelivery(publisher, tracker.dispatch(("in", 0), first, first + n - 1, n))
        publisher.produce_joined(out, b"".join(values), ends, keys, row_partitions, {0: delivery})
        return values

    publisher.begin_transaction()
    produce(b"aborted", 0)
    publisher.abort_transaction(30.0)
    for attempt in range(1, 4):
        publisher.begin_transaction()
        try:
            committed = produce(b"committed", n * attempt)
        except TransactionError as exc:
            # The requests the abort purged can leave a sequence gap that fails the next transaction: the
            # worker aborts it and rewinds, as here.
            assert exc.requires_abort and not exc.fatal
            publisher.abort_transaction(30.0)
            continue
        break
    else:
        pytest.fail("three transactions in a row failed while producing")
    publisher._producer.commit_transaction(30.0)
    assert publisher.failure() is None
    publisher.close(5.0)
    confluent = Producer({"bootstrap.servers": broker.bootstrap})
    for k, v in zip(keys, committed, strict=True):
        confluent.produce(reference, v, k)
    assert confluent.flush(30) == 0
    got = _read(broker.bootstrap, out, n, "read_committed")
    assert sorted(v for _, _, v in got) == sorted(committed), "the committed transaction's records, each once"
    expected = {v: p for p, _, v in _read(broker.bootstrap, reference, n)}
    assert all(p == expected[v] and k == keys[committed.index(v)] for p, k, v in got if k is not None)
