"""End-to-end behaviour against the session broker (Apache Kafka in CI): real worker processes,
real signals, verified by an independent reader of the output topic."""

from __future__ import annotations

import re
import time
import urllib.request
from datetime import datetime

import pytest

from producers.events import generate_events
from stream.codec import SchemaRegistry, decode
from stream.kafka import native as stream_native
from stream.local.broker import free_port
from stream.local.children import WorkerProcess
from tests.integration.harness import PARTITIONS, Pipeline, wait_for_assignment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.mark.parametrize("native", [True, False], ids=["native-clients", "confluent-clients"])
def test_n_events_give_exactly_n_predictions_and_commit_to_end_on_sigterm(pipeline: Pipeline, native: bool) -> None:
    port = free_port()
    worker = pipeline.worker("--metrics-port", str(port), "--max-batch-size", "64", "--max-wait-ms", "10",
                             *([] if native else ["--no-native-producer", "--no-native-consumer"]))
    wait_for_assignment(worker)
    # The load generator's C path too, where it is built: its records must be the same events, keys included.
    expected = pipeline.produce(5_000, seed=11, native=native and stream_native.unavailable() is None)
    reader = pipeline.reader()
    assert reader.read_until(expected, timeout_s=90), f"missing {reader.missing(expected)}"
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert worker.terminate() == 0, worker.output()[-3000:]
    reader.poll(1.0)
    assert len(reader.predictions) == 5_000 and reader.duplicates() == 0 and reader.unexpected(expected) == 0
    assert pipeline.committed_problems() == []
    # Each prediction keeps the input key and names its input record.
    events = {e: k for e, k in zip(*_ids_and_keys(11, 5_000), strict=True)}
    offsets_seen = set()
    for p in reader.predictions:
        assert p.key == events[p.event_id].encode()
        assert p.headers == {}, "provenance travels in the value unless --provenance-headers"
        topic, partition, offset = p.source
        assert topic == pipeline.input
        offsets_seen.add((partition, offset))
        assert 1 <= int(p.record["batch_size"]) <= 64  # type: ignore[call-overload]
        assert p.record["model_name"] == "demo-fraud-mlp"
    assert len(offsets_seen) == 5_000
    assert "stream_records_consumed_total 5000.0" in metrics
    for name in ("stream_predictions_total", "stream_offsets_committed_total", "stream_batch_size_records_bucket",
                 "stream_inference_seconds_bucket", "stream_end_to_end_latency_seconds_bucket"):
        assert name in metrics
    assert "worker summary: consumed=5000 predicted=5000 dead_lettered=0 committed=5000" in worker.output()
    if native and stream_native.unavailable() is None:
        assert "through the native producer" in worker.output()
        assert "input records taken through the native consumer" in worker.output()
    else:
        assert "predictions published through confluent-kafka" in worker.output()
        assert "input records taken through confluent-kafka" in worker.output()


def _ids_and_keys(seed: int, count: int) -> tuple[list[str], list[str]]:
    block = generate_events(count, seed=seed)
    return block.event_ids, block.keys


def test_restart_after_sigterm_resumes_without_loss_or_duplicates(pipeline: Pipeline) -> None:
    first = pipeline.worker()
    wait_for_assignment(first)
    expected = pipeline.produce(3_000, seed=21)
    reader = pipeline.reader()
    assert reader.read_until(expected, timeout_s=90)
    assert first.terminate() == 0, first.output()[-3000:]
    # Produced while no worker runs: the restarted worker must pick up exactly these.
    expected |= pipeline.produce(3_000, seed=21, start=3_000)
    second = pipeline.worker()
    assert reader.read_until(expected, timeout_s=90), f"missing {reader.missing(expected)}"
    assert second.terminate() == 0, second.output()[-3000:]
    reader.poll(1.0)
    assert reader.duplicates() == 0 and len(reader.predictions) == 6_000
    assert pipeline.committed_problems() == []
    assert "consumed=3000 predicted=3000 dead_lettered=0 committed=3000" in second.output()


def test_two_workers_split_partitions_and_predict_every_event_once(pipeline: Pipeline) -> None:
    a, b = pipeline.worker(), pipeline.worker()
    wait_for_assignment(a)
    wait_for_assignment(b)
    # Both members hold partitions once the group has settled: wait until the assignments are disjoint
    # and cover every partition (cooperative rebalancing may take two rounds).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        owned_a, owned_b = _owned(a), _owned(b)
        if owned_a and owned_b and owned_a | owned_b == set(range(PARTITIONS)) and not owned_a & owned_b:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"group did not settle: a={_owned(a)} b={_owned(b)}")
    expected = pipeline.produce(8_000, seed=31)
    reader = pipeline.reader()
    assert reader.read_until(expected, timeout_s=90), f"missing {reader.missing(expected)}"
    codes = [a.terminate(), b.terminate()]
    assert codes == [0, 0]
    reader.poll(1.0)
    assert len(reader.predictions) == 8_000 and reader.duplicates() == 0
    sa, sb = a.summary(), b.summary()
    assert sa and sb and sa["consumed"] > 0 and sb["consumed"] > 0
    assert sa["consumed"] + sb["consumed"] == 8_000
    assert pipeline.committed_problems() == []


_OWNERSHIP = re.compile(r" (assigned|revoked|lost) \S+?\[([\d, ]*)\]")


def _owned(worker: WorkerProcess) -> set[int]:
    """Partitions a worker holds now, replayed from its assign/revoke/lost log lines."""
    owned: set[int] = set()
    for verb, listed in _OWNERSHIP.findall(worker.output()):
        parts = {int(x) for x in listed.split(",") if x.strip()}
        owned = owned | parts if verb == "assigned" else owned - parts
    return owned


def test_stop_at_end_drains_commits_and_exits_zero(pipeline: Pipeline) -> None:
    expected = pipeline.produce(4_000, seed=41)
    worker = pipeline.worker("--stop-at-end")
    assert worker.wait(120) == 0, worker.output()[-3000:]
    reader = pipeline.reader()
    assert reader.read_until(expected, timeout_s=30)
    assert len(reader.predictions) == 4_000 and reader.duplicates() == 0
    assert pipeline.committed_problems() == []
    # Events produced after it exited are left for the next run.
    pipeline.produce(10, seed=41, start=4_000)
    assert pipeline.committed_problems() != []


def test_stop_at_end_on_an_empty_topic_exits_at_once(pipeline: Pipeline) -> None:
    worker = pipeline.worker("--stop-at-end")
    assert worker.wait(60) == 0, worker.output()[-3000:]
    log = worker.output()
    assert "consumed=0" in log
    # From reading the end offsets it will stop at to its summary: no batch to wait out, no stall timeout, no poll
    # of an idle topic. (Not from its assignment: an empty topic is at its end before the group assigns anything.)
    stamps = {what: datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f") for line in log.splitlines()
              for what in ("stop-at-end: end offsets at start", "shutdown summary") if what in line}
    took = (stamps["shutdown summary"] - stamps["stop-at-end: end offsets at start"]).total_seconds()
    assert took < 3.0, f"{took:.1f} s from reading the end offsets to its exit:\n{log[-3000:]}"


def test_bad_configuration_fails_fast_with_a_clear_message(pipeline: Pipeline) -> None:
    worker = pipeline.worker("--max-batch-size", "0")
    assert worker.wait(60) == 2
    assert "--max-batch-size" in worker.output()


def test_predictions_decode_with_the_registered_schema(pipeline: Pipeline) -> None:
    expected = pipeline.produce(300, seed=51)
    worker = pipeline.worker("--stop-at-end")
    assert worker.wait(120) == 0, worker.output()[-3000:]
    reader = pipeline.reader()
    assert reader.read_until(expected, timeout_s=30)
    registry = SchemaRegistry.from_dir()
    schema, record = decode(registry, _first_raw_value(pipeline))
    assert schema.name == "stream.demo.FraudPrediction" and schema.schema_id == 3
    assert set(record) == {"event_id", "model_name", "model_version", "fraud_score", "is_fraud", "event_ts_ms",
                           "predicted_ts_ms", "batch_size", "input_topic", "input_partition", "input_offset"}
    assert record["predicted_ts_ms"] >= record["event_ts_ms"]
    assert record["input_topic"] == pipeline.input and 0 <= record["input_partition"] < PARTITIONS


def _first_raw_value(pipeline: Pipeline) -> bytes:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": pipeline.bootstrap, "group.id": "raw-peek", "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(pipeline.output, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is not None and msg.error() is None:
                return bytes(msg.value())
        raise AssertionError("no prediction to peek at")
    finally:
        c.close()


def test_sigterm_during_start_up_exits_zero_without_joining(pipeline: Pipeline) -> None:
    worker = pipeline.worker()
    assert worker.terminate() == 0, worker.output()[-3000:]
    assert "during start-up" in worker.output()
    assert " assigned " not in worker.output()


@pytest.mark.parametrize("policy", ["adaptive", "fixed"])
def test_batch_policy_decides_whether_an_idle_model_waits_out_max_wait(pipeline: Pipeline, policy: str) -> None:
    """max_wait_ms 8 s: a fixed batch holds a lone trickle for the full 8 s; an adaptive one hands it to the
    idle model at once. The margins are seconds wide: this checks the policy, not speed."""
    worker = pipeline.worker("--max-wait-ms", "8000", "--max-batch-size", "1000", "--batch-policy", policy)
    wait_for_assignment(worker)
    expected = pipeline.produce(20, seed=31)
    produced_at = time.monotonic()
    reader = pipeline.reader()
    assert reader.read_until(expected, timeout_s=60), f"missing {reader.missing(expected)}"
    waited = time.monotonic() - produced_at
    if policy == "adaptive":
        assert waited < 5.0, f"adaptive batches waited {waited:.1f}s for more records"
    else:
        assert waited >= 7.0, f"a fixed batch closed after {waited:.1f}s, before max_wait_ms"
        assert {int(p.record["batch_size"]) for p in reader.predictions} == {20}  # type: ignore[call-overload]
    assert worker.terminate() == 0, worker.output()[-3000:]
