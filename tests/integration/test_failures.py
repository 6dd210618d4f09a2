"""Bad input, poison records and slow models against the session broker."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from producers.events import generate_events
from stream.codec import EVENT_SCHEMA, SchemaRegistry, encode
from stream.process import WorkerProcess
from stream.processing import DLQ_ERROR_REASON, DLQ_STAGE, HEADER_OFFSET, HEADER_PARTITION
from stream.topics import committed_offsets, end_offsets
from stream.verify import check_committed
from tests.conftest import BrokerInfo
from tests.handlers import bad_values
from tests.integration.test_pipeline import Pipeline, wait_for_assignment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
EVENT = SchemaRegistry.from_dir().by_name(EVENT_SCHEMA)


@pytest.fixture
def pipeline(broker: BrokerInfo, unique_name: Callable[[str], str], model_dir: Path,
             tmp_path: Path) -> Iterator[Pipeline]:
    p = Pipeline(broker, unique_name, model_dir, tmp_path)
    yield p
    p.cleanup()


Record = tuple[dict[str, bytes], bytes | None, bytes | None]


def read_all(bootstrap: str, topic: str, expected: int, timeout_s: float = 60) -> list[Record]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "dlq-reader", "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    md = c.list_topics(topic, timeout=10)
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in md.topics[topic].partitions])
    out = []
    deadline = time.monotonic() + timeout_s
    while len(out) < expected and time.monotonic() < deadline:
        for m in c.consume(1000, 0.2):
            if m.error() is None:
                out.append(({k: v for k, v in m.headers() or []}, m.key(), m.value()))
    c.close()
    return out


def test_every_bad_record_category_is_dead_lettered_once_and_the_stream_goes_on(pipeline: Pipeline) -> None:
    dlq = pipeline.input.replace("-in-", "-dlq-")
    bad = bad_values()
    producer = Producer({"bootstrap.servers": pipeline.bootstrap})
    goods = generate_events(400, seed=61).records()
    n_bad = 0
    for i, record in enumerate(goods):
        # All bad records on one key: one partition, interleaved with good ones.
        producer.produce(pipeline.input, encode(EVENT, record), str(record["key"]).encode())
        if i % 50 == 0:
            for reason, value in bad.items():
                producer.produce(pipeline.input, value, f"bad-{reason}".encode())
                n_bad += 1
    assert producer.flush(30) == 0
    worker = pipeline.worker("--dlq-topic", dlq, "--model", "tests.handlers:PoisonHandler",
                             "--max-input-bytes", "4096", "--stop-at-end", "--max-wait-ms", "5")
    assert worker.wait(120) == 0, worker.output()[-3000:]
    dead = read_all(pipeline.bootstrap, dlq, n_bad)
    assert len(dead) == n_bad
    reasons = Counter(h[DLQ_ERROR_REASON].decode() for h, _, _ in dead)
    assert reasons == Counter({reason: n_bad // len(bad) for reason in bad})
    for headers, key, value in dead:
        reason = headers[DLQ_ERROR_REASON].decode()
        assert key == f"bad-{reason}".encode(), "the DLQ record keeps the input key"
        assert headers[DLQ_STAGE] == (b"model" if reason == "model-error" else b"decode")
        assert value == (None if reason in ("null-value", "oversized") else bad[reason])
    preds = read_all(pipeline.bootstrap, pipeline.output, 400)
    assert len(preds) == 400
    seen = Counter((h[HEADER_PARTITION], h[HEADER_OFFSET]) for h, _, _ in preds + dead)
    assert len(seen) == 400 + n_bad and set(seen.values()) == {1}, "each input offset exactly once"
    assert check_committed(committed_offsets(pipeline.bootstrap, pipeline.group, pipeline.input),
                           end_offsets(pipeline.bootstrap, pipeline.input)) == []
    assert f"dead_lettered={n_bad}" in worker.output()


def test_without_a_dlq_a_bad_record_stops_the_worker_and_is_not_committed(pipeline: Pipeline) -> None:
    pipeline.produce(100, seed=71)
    producer = Producer({"bootstrap.servers": pipeline.bootstrap})
    producer.produce(pipeline.input, b"\x05junk", b"k")
    assert producer.flush(30) == 0
    worker = pipeline.worker("--stop-at-end")
    assert worker.wait(120) == 1, worker.output()[-3000:]
    assert "no --dlq-topic" in worker.output() and "bad-magic" in worker.output()
    committed = committed_offsets(pipeline.bootstrap, pipeline.group, pipeline.input)
    ends = end_offsets(pipeline.bootstrap, pipeline.input)
    assert sum(max(c, 0) for c in committed.values()) < sum(ends.values()), "the bad record was committed"


def test_a_batch_slower_than_max_poll_interval_does_not_cost_membership(pipeline: Pipeline) -> None:
    # The first batch takes 12 s, twice max.poll.interval.ms: the poll thread must keep the membership.
    args = ["--bootstrap-servers", pipeline.bootstrap, "--input-topic", pipeline.input, "--output-topic",
            pipeline.output, "--group-id", pipeline.group, "--model-dir", str(pipeline.model_dir),
            "--model", "tests.handlers:SleepyHandler", "--max-wait-ms", "5"]
    env = {"KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "6000", "KAFKA_CONSUMER_MAX_POLL_INTERVAL_MS": "7000",
           "STREAM_TEST_SLEEP_S": "12"}
    slow = WorkerProcess(args, pipeline.tmp / "slow.log", env)
    pipeline.workers.append(slow)
    wait_for_assignment(slow)
    expected = pipeline.produce(2_000, seed=81)
    reader = pipeline.reader()
    assert reader.read_until(expected, timeout_s=90), f"missing {reader.missing(expected)}"
    assert slow.terminate() == 0, slow.output()[-3000:]
    reader.poll(1.0)
    out = slow.output()
    assert " lost " not in out and "revoked" not in out.split("signal SIGTERM")[0], out[-3000:]
    assert reader.duplicates() == 0
