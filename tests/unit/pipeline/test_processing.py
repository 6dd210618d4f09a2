from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from producers.events import generate_events
from stream.codec import (
    DEFAULT_SCHEMAS_DIR,
    InputSource,
    SchemaRegistry,
    decode,
    encode,
)
from stream.codec import decoder as decoder_module
from stream.config import load_settings
from stream.errors import ModelError, StoppedOnPurpose, StreamError, UnrecoverableModelError
from stream.kafka.delivery import SpanDelivery
from stream.kafka.offsets import OffsetTracker
from stream.kafka.publish import HEADER_OFFSET, HEADER_PARTITION, HEADER_TOPIC
from stream.kafka.records import Records
from stream.kafka.replies import AddressHeaders, carried_headers
from stream.models.demo import EVENT_SCHEMA
from stream.ops.metrics import StreamMetrics
from stream.pipeline.inference import InferenceEngine
from stream.pipeline.processing import (
    DLQ_ERROR_MESSAGE,
    DLQ_ERROR_REASON,
    DLQ_MODEL,
    DLQ_STAGE,
    BatchProcessor,
    DeadLetterBreaker,
    Dispatched,
    ProcessingPolicy,
)
from stream.pipeline.schemas import build_codecs
from tests.handlers import POISON_MARK, PoisonHandler
from tests.verify import source_of

REGISTRY = SchemaRegistry.from_dir()
EVENT = REGISTRY.by_name(EVENT_SCHEMA)


class FakePublisher:
    """Acknowledges every record at once, like a broker that never fails."""

    transactional = False

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes | None, bytes | None, dict[str, bytes]]] = []
        self.done: list[SpanDelivery] = []
        self.kicks: list[int] = []  # len(sent) at each send_now()
        self.partitions: list[int] = []  # the partition each record was sent to (-1: the partitioner's)
        self.topic_partitions: dict[str, int] = {"in.replies": 4}
        self.joined = 0  # produce_joined calls (a batch's predictions in one buffer, without headers)
        self.held_topics: set[str] = set()  # records to these topics are acknowledged by release()
        self.held: list[SpanDelivery] = []

    def release(self) -> None:
        for cb in self.held:
            cb(None, None)  # type: ignore[arg-type]
        self.held.clear()

    def send_now(self, window_s: float = 0.0) -> None:
        self.kicks.append(len(self.sent))

    def serve(self) -> None:
        pass

    def failure(self) -> None:
        return None

    def produce_many(self, topic: str, values: Sequence[bytes | None], keys: Sequence[bytes | None],
                     headers: Sequence[Any], callbacks: Sequence[SpanDelivery],
                     partitions: Sequence[int] | None = None) -> None:
        for i, (v, k, h, cb) in enumerate(zip(values, keys, headers, callbacks, strict=True)):
            self.sent.append((topic, v, k, dict(h or [])))
            self.partitions.append(-1 if partitions is None else partitions[i])
            if topic in self.held_topics:
                self.held.append(cb)
            else:
                cb(None, None)  # type: ignore[arg-type]

    def partition_count(self, topic: str) -> int | None:
        return self.topic_partitions.get(topic)

    def produce_joined(self, topic: str, values: bytes, ends: np.ndarray, keys: list[bytes | None],
                       row_partitions: np.ndarray, deliveries: Mapping[int, SpanDelivery],
                       headers: dict[int, Any] | None = None) -> None:
        self.joined += 1
        starts = [0, *ends[:-1].tolist()]
        self.produce_many(topic, [values[a:b] for a, b in zip(starts, ends.tolist(), strict=True)], keys,
                          [(headers or {}).get(i) for i in range(len(keys))],
                          [deliveries[p] for p in row_partitions.tolist()])

    def span_done(self, delivery: SpanDelivery) -> None:
        self.done.append(delivery)

    def topics(self) -> list[str]:
        return [t for t, *_ in self.sent]

    def sources(self, topic: str = "out") -> list[tuple[str, int, int]]:
        """The input record each record sent to ``topic`` names (predictions in their value, dead letters in
        their headers)."""
        return [source_of(decode(REGISTRY, v)[1] if t == "out" else {}, h)  # type: ignore[arg-type]
                for t, v, _, h in self.sent if t == topic]


def make(model_dir: Path, *, dlq: str | None = "dlq", handler: Any = None, retries: int = 1,
         max_fraction: float = 0.9, provenance_headers: bool = False, reply_topics: frozenset[str] = frozenset(),
         schemas_dir: Path | None = None, **given: Any) -> tuple[BatchProcessor, FakePublisher]:
    """A processor wired as the worker wires it (its schemas from ``schemas_dir``, the repository's by default;
    ``given``: more worker settings)."""
    engine = InferenceEngine(handler or PoisonHandler(model_dir), torch.device("cpu"))
    publisher = FakePublisher()
    settings = load_settings({"input_topic": "in", "output_topic": "out", "group_id": "g", "bootstrap_servers": "x",
                              "schemas_dir": schemas_dir, **given}, environ={})
    decoder, binder, encoder, event_time = build_codecs(settings, engine.handler)
    policy = ProcessingPolicy("in", "out", dlq, 10_000, retries, 0.0, max_fraction, 1000, provenance_headers,
                              event_time_field=event_time, reply_topics=reply_topics,
                              carried=carried_headers(settings.copy_header_names))
    processor = BatchProcessor(policy, engine, decoder, binder, encoder, publisher, StreamMetrics(),  # type: ignore[arg-type]
                               sleep=lambda s: None, reply_partitions=publisher.partition_count)
    return processor, publisher


def batch_of(values: list[bytes | None], publisher: FakePublisher, replies: dict[int, AddressHeaders] | None = None
             ) -> tuple[Dispatched, OffsetTracker]:
    tracker = OffsetTracker()
    tracker.assign([("in", 0)])
    n = len(values)
    records = Records.build(values, [b"k%d" % i for i in range(n)], [0] * n, range(n), replies)
    span = tracker.dispatch(("in", 0), 0, n - 1, n)
    delivery = SpanDelivery(publisher, span)  # type: ignore[arg-type]
    return Dispatched(records, records.partitions, records.offsets, {0: delivery}), tracker


def events(n: int, poison_rows: Sequence[int] = ()) -> list[bytes | None]:
    block = generate_events(n, seed=9)
    records = block.records()
    for r in poison_rows:
        records[r]["features"] = [POISON_MARK] + [0.0] * 31
    return [encode(EVENT, r) for r in records]


def test_clean_batch_publishes_one_prediction_per_event_and_completes_the_span(model_dir: Path) -> None:
    processor, pub = make(model_dir)
    batch, tracker = batch_of(events(20), pub)
    processor.process(batch)
    assert pub.topics() == ["out"] * 20
    assert tracker.committable() == {("in", 0): 20}
    assert pub.sources() == [("in", 0, i) for i in range(20)], "each prediction names its input record"
    assert all(h == {} for *_, h in pub.sent), "no provenance headers by default"
    assert pub.kicks == [20], "the batch's records are sent at once, after the last is queued"


def test_provenance_headers_when_asked_for_or_when_the_schema_has_no_input_fields(
        model_dir: Path, tmp_path: Path) -> None:
    processor, pub = make(model_dir, provenance_headers=True)
    processor.process(batch_of(events(5), pub)[0])
    assert pub.sources() == [("in", 0, i) for i in range(5)]
    headers = [(h[HEADER_TOPIC], h[HEADER_PARTITION], h[HEADER_OFFSET]) for *_, h in pub.sent]
    assert headers == [(b"in", b"0", b"%d" % i) for i in range(5)], "the headers agree with the value"
    # A registry whose prediction schema predates the input_* fields (version 1 only): headers, always.
    listing = {"1": "fraud_event.avsc", "2": "fraud_prediction.avsc"}
    (tmp_path / "registry.json").write_text(json.dumps({"schemas": listing}))
    for name in listing.values():
        shutil.copy(DEFAULT_SCHEMAS_DIR / name, tmp_path / name)
    old = SchemaRegistry.from_dir(tmp_path)
    processor, pub = make(model_dir, schemas_dir=tmp_path)
    processor.process(batch_of(events(3), pub)[0])
    assert all("input_offset" not in decode(old, v)[1] for _, v, _, _ in pub.sent)
    assert [h[HEADER_OFFSET] for *_, h in pub.sent] == [b"0", b"1", b"2"]
    assert pub.sources() == [("in", 0, 0), ("in", 0, 1), ("in", 0, 2)]


def own(address: bytes) -> AddressHeaders:
    """A record's reply headers with only this project's address (`stream.kafka.replies`)."""
    return (address, None, None, None)


def spring(topic: bytes | None, partition: bytes | None, correlation: bytes | None) -> AddressHeaders:
    """A record's reply headers as Spring's ReplyingKafkaTemplate sends them."""
    return (None, topic, partition, correlation)


def test_a_reply_addressed_record_gets_a_copy_at_its_address_and_commits_only_once_the_copy_is_delivered(
        model_dir: Path) -> None:
    processor, pub = make(model_dir, reply_topics=frozenset({"in.replies"}))
    pub.held_topics.add("in.replies")
    correlation = bytes(range(250, 256)) + b"\x00:id"  # any bytes, returned as they came
    replies = {3: own(b"in.replies:2:poisoned"), 5: own(b"in.replies:1:five"), 7: own(b"in.replies:2:seven"),
               9: own(b"elsewhere:0:refused"), 11: own(b"no address"), 13: own(b"in.replies:4:no-such-partition"),
               14: spring(b"in.replies", b"\x00\x00\x00\x03", correlation),
               15: spring(b"in.replies", None, b"any-partition"),
               16: spring(b"elsewhere", None, b"refused"), 17: spring(None, None, b"a correlation id alone"),
               18: spring(b"in.replies", b"\x03", b"short partition"),
               19: (b"in.replies:0:both", b"in.replies", b"\x00\x00\x00\x01", b"ours wins")}
    batch, tracker = batch_of(events(20, poison_rows=[3]), pub, replies)
    processor.process(batch)
    out = {offset: v for (_, _, offset), v in zip(pub.sources(), [v for t, v, *_ in pub.sent if t == "out"],
                                                   strict=True)}
    copies = [(p, v, k, h) for (t, v, k, h), p in zip(pub.sent, pub.partitions, strict=True) if t == "in.replies"]
    address = [(p, h.get("stream.reply"), h.get("kafka_correlationId"), k) for p, _, k, h in copies]
    assert address == [
        (1, b"in.replies:1:five", None, b"k5"), (2, b"in.replies:2:seven", None, b"k7"),
        (3, None, correlation, b"k14"), (-1, None, b"any-partition", b"k15"), (0, b"in.replies:0:both", None, b"k19"),
        (2, b"in.replies:2:poisoned", None, b"k3")]
    assert copies[0][1] == out[5] and copies[1][1] == out[7], "the prediction itself, byte for byte"
    assert copies[2][1] == out[14] and copies[3][1] == out[15]
    assert [h[HEADER_OFFSET] for *_, h in copies] == [b"5", b"7", b"14", b"15", b"19", b"3"]
    assert copies[-1][3][DLQ_STAGE] == b"model", "a dead-lettered record's copy carries the dead letter's headers"
    assert tracker.committable() == {}, "the span waits for its copies"
    pub.release()
    assert tracker.committable() == {("in", 0): 20}
    metrics = processor._metrics.replies
    assert metrics.labels("sent")._value.get() == 6 and metrics.labels("refused")._value.get() == 5


def test_a_record_s_trace_context_and_copied_headers_go_onto_its_prediction_dead_letter_and_reply(
        model_dir: Path) -> None:
    processor, pub = make(model_dir, reply_topics=frozenset({"in.replies"}), copy_headers="tenant,traceparent")
    parent = [b"00-%032x-%016x-01" % (i + 1, i + 1) for i in range(3)]

    def watched(address: bytes | None = None, trace: bytes | None = None, state: bytes | None = None,
                tenant: bytes | None = None) -> AddressHeaders:  # in `watched_headers(("tenant",))`'s order
        return (address, None, None, None, trace, state, tenant)

    replies = {1: watched(trace=parent[0], state=b"v=1"), 3: watched(trace=parent[1], tenant=b"acme"),
               5: watched(address=b"in.replies:1:five", trace=parent[2]), 6: watched(tenant=b"alone")}
    batch, tracker = batch_of(events(8, poison_rows=[3]), pub, replies)
    processor.process(batch)
    out = {offset: h for (_, _, offset), (t, _, _, h) in zip(pub.sources(), [s for s in pub.sent if s[0] == "out"],
                                                              strict=True)}
    assert out == {0: {}, 1: {"traceparent": parent[0], "tracestate": b"v=1"}, 2: {}, 4: {},
                   5: {"traceparent": parent[2]}, 6: {"tenant": b"alone"}, 7: {}}
    [(_, _, _, dead)] = [s for s in pub.sent if s[0] == "dlq"]
    assert dead[HEADER_OFFSET] == b"3" and dead["traceparent"] == parent[1] and dead["tenant"] == b"acme"
    [(_, _, _, reply)] = [s for s in pub.sent if s[0] == "in.replies"]
    assert reply["stream.reply"] == b"in.replies:1:five" and reply["traceparent"] == parent[2]
    assert reply[HEADER_OFFSET] == b"5"
    assert tracker.committable() == {("in", 0): 8}
    assert pub.joined == 1, "the traced records go in the batch's one buffer, their headers beside it"
    with_provenance, pub2 = make(model_dir, provenance_headers=True, copy_headers="tenant")
    with_provenance.process(batch_of(events(3), pub2, {1: watched(trace=parent[0], tenant=b"acme")})[0])
    by_offset = {offset: h for (_, _, offset), (t, _, _, h) in zip(
        pub2.sources(), [s for s in pub2.sent if s[0] == "out"], strict=True)}
    assert by_offset[1] == {HEADER_TOPIC: b"in", HEADER_PARTITION: b"0", HEADER_OFFSET: b"1",
                            "traceparent": parent[0], "tenant": b"acme"}
    assert by_offset[0] == {HEADER_TOPIC: b"in", HEADER_PARTITION: b"0", HEADER_OFFSET: b"0"}


class CountingHandler(PoisonHandler):
    """Reports a token count per input from its ``prepare`` (as a text model does): the features' first value."""

    def prepare(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        return {**inputs, "tokens": np.abs(inputs["features"][:, 1] * 100).astype(np.int32) + 1}


def test_a_reply_carries_the_tokens_the_model_reported_for_its_own_input(model_dir: Path) -> None:
    processor, pub = make(model_dir, handler=CountingHandler(model_dir), reply_topics=frozenset({"in.replies"}))
    values = events(12, poison_rows=[4])
    batch, _ = batch_of(values, pub, {2: own(b"in.replies:0:a"), 4: own(b"in.replies:0:b"),
                                      9: spring(b"in.replies", None, b"c")})
    processor.process(batch)
    expected = {i: int(abs(decode(REGISTRY, v)[1]["features"][1] * 100)) + 1  # type: ignore[arg-type]
                for i, v in enumerate(values)}
    copies = {int(h[HEADER_OFFSET]): h for t, _, _, h in pub.sent if t == "in.replies"}
    assert sorted(copies) == [2, 4, 9]
    assert [copies[i]["stream.usage.tokens"] for i in (2, 4, 9)] == [b"%d" % expected[i] for i in (2, 4, 9)]
    assert all("stream.usage.tokens" not in h for t, _, _, h in pub.sent if t != "in.replies"), "replies only"
    processor, pub = make(model_dir, reply_topics=frozenset({"in.replies"}))  # a model that reports none
    processor.process(batch_of(events(3), pub, {1: own(b"in.replies:0:a")})[0])
    assert next(h for t, _, _, h in pub.sent if t == "in.replies").get("stream.usage.tokens") is None


def test_without_reply_topics_no_address_is_answered(model_dir: Path) -> None:
    processor, pub = make(model_dir)
    batch, tracker = batch_of(events(4), pub, {1: own(b"in.replies:0:x"), 2: spring(b"in.replies", None, b"y")})
    processor.process(batch)
    assert pub.topics() == ["out"] * 4 and tracker.committable() == {("in", 0): 4}


class Recorded(PoisonHandler):
    """Keeps each batch's postprocessed outputs, to check what the publisher is given."""

    def __init__(self, model_dir: Path) -> None:
        super().__init__(model_dir)
        self.given: list[dict[str, np.ndarray]] = []

    def postprocess(self, raw: torch.Tensor) -> dict[str, np.ndarray]:
        self.given.append(super().postprocess(raw))
        return self.given[-1]


@pytest.mark.parametrize("poison", [[], [3]])
def test_a_batch_run_in_one_piece_publishes_its_outputs_without_a_copy(model_dir: Path, poison: list[int]) -> None:
    """A batch's outputs were copied whole once they arrived (a MiniLM batch of 4,096: 6 MB); only a batch run in
    pieces (a poison record isolated) is joined, into outputs of its own."""
    handler = Recorded(model_dir)
    processor, pub = make(model_dir, handler=handler)
    batch, _ = batch_of(events(8, poison), pub)
    begun = processor.submit(processor.prepare(batch))
    _rows, outputs, _dead = processor._infer_isolating(begun.inputs, begun.flight)
    first = handler.given[0 if not poison else -1]
    assert all((outputs[k] is first[k]) == (not poison) for k in first)
    assert len(outputs["fraud_score"]) == 8 - len(poison)


@pytest.mark.parametrize("poison", [[0], [7], [19], [3, 4, 15], list(range(20))])
def test_poison_records_are_isolated_and_the_rest_published(model_dir: Path, poison: list[int]) -> None:
    processor, pub = make(model_dir)
    batch, tracker = batch_of(events(20, poison), pub)
    processor.process(batch)
    dead = [(int(h[HEADER_OFFSET]), h) for t, _, _, h in pub.sent if t == "dlq"]
    assert sorted(o for o, _ in dead) == poison
    assert all(h[DLQ_STAGE] == b"model" and h[DLQ_MODEL].startswith(b"demo-fraud-mlp") for _, h in dead)
    preds = [decode(REGISTRY, v)[1]["event_id"] for t, v, _, _ in pub.sent if t == "out" and v]
    expected = [e for i, e in enumerate(generate_events(20, seed=9).event_ids) if i not in poison]
    assert preds == expected  # order kept
    assert tracker.committable() == {("in", 0): 20}, "dead letters acknowledge their records too"
    assert batch.deliveries[0].dead == len(poison)
    assert pub.kicks == [20], "predictions and dead letters go out together"


def test_bad_bytes_go_to_the_dlq_with_key_value_and_headers(model_dir: Path) -> None:
    processor, pub = make(model_dir)
    good = events(3)
    values: list[bytes | None] = [good[0], b"\x07garbage", None, good[1], b"\x00" * 20_000, good[2]]
    batch, tracker = batch_of(values, pub)
    processor.process(batch)
    dlq = {int(h[HEADER_OFFSET]): (v, k, h) for t, v, k, h in pub.sent if t == "dlq"}
    assert {o: h[DLQ_ERROR_REASON] for o, (_, _, h) in dlq.items()} == {
        1: b"bad-magic", 2: b"null-value", 4: b"oversized"}
    assert dlq[1][0] == b"\x07garbage" and dlq[1][1] == b"k1"
    assert dlq[4][0] is None and dlq[4][2]["stream.dlq.value.bytes"] == b"20000"
    assert pub.topics().count("out") == 3
    assert tracker.committable() == {("in", 0): 6}


def test_without_dlq_a_bad_record_stops_and_acknowledges_nothing(model_dir: Path) -> None:
    processor, pub = make(model_dir, dlq=None)
    batch, tracker = batch_of([events(1)[0], b"\x01bad"], pub)
    with pytest.raises(StreamError, match=r"no --dlq-topic.*in\[0\]@1"):
        processor.process(batch)
    assert tracker.committable() == {}


class FlakyHandler(PoisonHandler):
    def __init__(self, model_dir: Path, failures: int) -> None:
        super().__init__(model_dir)
        self.failures = failures
        self.calls = 0

    def predict(self, inputs: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError("transient")
        return super().predict(inputs)


def test_transient_errors_are_retried_before_splitting(model_dir: Path) -> None:
    handler = FlakyHandler(model_dir, failures=2)
    processor, pub = make(model_dir, handler=handler, retries=2)
    batch, _ = batch_of(events(8), pub)
    processor.process(batch)
    assert handler.calls == 3 and pub.topics() == ["out"] * 8


class DeadDevice(PoisonHandler):
    def predict(self, inputs: torch.Tensor) -> torch.Tensor:
        raise UnrecoverableModelError("device lost")


def test_systemic_error_stops_without_acknowledging(model_dir: Path) -> None:
    processor, pub = make(model_dir, handler=DeadDevice(model_dir))
    batch, tracker = batch_of(events(4), pub)
    with pytest.raises(UnrecoverableModelError):
        processor.process(batch)
    assert pub.sent == [] and tracker.committable() == {}


def test_a_flood_of_records_the_model_cannot_take_is_dead_lettered_and_the_stream_goes_on(
        model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    processor, pub = make(model_dir, max_fraction=0.2)
    short = encode(EVENT, {**generate_events(1, seed=3).records()[0], "features": [0.5] * 31})  # 31 of 32
    for _ in range(30):  # 3,000 in a row: the decode stage's, never the breaker's
        processor.process(batch_of([short] * 100, pub)[0])
    batch, tracker = batch_of(events(50), pub)
    processor.process(batch)
    assert pub.topics() == ["dlq"] * 3000 + ["out"] * 50, "the records behind them are predicted"
    assert tracker.committable() == {("in", 0): 50}
    assert processor._metrics.dead_letters.labels("decode", "shape")._value.get() == 3000
    processor.rejected.flush()
    first, rest = [r.getMessage() for r in caplog.records if "decode stage" in r.getMessage()]
    assert "100 input records dead-lettered at the decode stage" in first, "the first of them at once"
    assert "2,900 input records dead-lettered at the decode stage" in rest and "(shape 2,900)" in rest, rest
    assert "in[0]@99" in rest, "where the latest one was"


def test_a_model_that_fails_on_every_record_still_trips_the_breaker(model_dir: Path) -> None:
    processor, pub = make(model_dir, max_fraction=0.3)
    for _ in range(3):
        processor.process(batch_of(events(50), pub)[0])
    # the model failed on 50 of the 200 records it was given: 25 %, under 30 %
    processor.process(batch_of(events(50, poison_rows=range(50)), pub)[0])
    with pytest.raises(StoppedOnPurpose, match="the model failed on 100 of the last 250") as stopped:
        processor.process(batch_of(events(50, poison_rows=range(50)), pub)[0])
    assert stopped.value.reason == "dead-letter-breaker" and (stopped.value.partition, stopped.value.offset) == (0, 0)


def test_breaker_window_forgets_old_batches() -> None:
    breaker = DeadLetterBreaker(0.5, window=100)
    for _ in range(10):
        breaker.record(100, 0)
    breaker.record(100, 40)  # 40 % of the window: fine
    with pytest.raises(StreamError):
        breaker.record(100, 60)


def test_model_error_type_is_preserved_for_single_bad_rows(model_dir: Path) -> None:
    engine = InferenceEngine(PoisonHandler(model_dir), torch.device("cpu"))
    with pytest.raises(ModelError, match="poison"):
        engine.run(np.full((1, 32), POISON_MARK, dtype=np.float32))


def test_dead_letters_keep_input_order_across_stages(model_dir: Path) -> None:
    processor, pub = make(model_dir)
    values = events(6, poison_rows=[1])  # row 1: model error (found after decoding)
    values[4] = b"\x09bad"  # row 4: decode error (found first)
    batch, _ = batch_of(values, pub)
    processor.process(batch)
    assert [int(h[HEADER_OFFSET]) for t, _, _, h in pub.sent if t == "dlq"] == [1, 4]


def test_an_unreachable_registry_is_waited_out_and_a_stop_abandons_the_batch(model_dir: Path) -> None:
    from stream.codec.registry import RegistryUnavailable
    from stream.pipeline.processing import Abandoned

    processor, pub = make(model_dir)
    real = processor._decode_stage.decoder
    failures = [2]

    class Flaky:
        def decode_batch(self, values: Any, max_bytes: int | None = None) -> Any:
            if failures[0]:
                failures[0] -= 1
                raise RegistryUnavailable("schema registry http://r: schema id 1: ConnectError")
            return real.decode_batch(values, max_bytes)

    processor._decode_stage.decoder = Flaky()  # type: ignore[assignment]
    batch, tracker = batch_of(events(5), pub)
    processor.process(batch)
    assert len(pub.sent) == 5 and failures == [0], "published once the registry answered"
    assert processor._metrics.registry_retries._value.get() == 2

    failures[0] = 1
    stopping = [True]
    processor._stopping = lambda: stopping[0]
    batch, tracker = batch_of(events(3), pub)
    with pytest.raises(Abandoned):
        processor.process(batch)
    assert len(pub.sent) == 5, "nothing of the abandoned batch published"
    assert tracker.committable() == {}, "nor acknowledged"


class OutOfMemoryOver(PoisonHandler):
    """Runs out of device memory on any batch of more than ``rows`` rows (a CUDA allocator's error, on the CPU)."""

    def __init__(self, model_dir: Path, rows: int) -> None:
        super().__init__(model_dir)
        self.rows = rows
        self.sizes: list[int] = []

    def predict(self, inputs: torch.Tensor) -> torch.Tensor:
        self.sizes.append(len(inputs))
        if len(inputs) > self.rows:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return super().predict(inputs)


def test_out_of_device_memory_splits_the_batch_without_retrying_it_or_losing_a_row(model_dir: Path) -> None:
    handler = OutOfMemoryOver(model_dir, rows=4)
    processor, pub = make(model_dir, handler=handler, retries=3)
    batch, tracker = batch_of(events(16), pub)
    processor.process(batch)
    assert pub.topics() == ["out"] * 16 and tracker.committable() == {("in", 0): 16}
    assert handler.sizes == [16, 8, 4, 4, 8, 4, 4], "split at once, never the same size twice"
    assert processor._metrics.oom_splits._value.get() == 3
    assert processor._metrics.model_retries._value.get() == 0
    # a single row that does not fit is dead-lettered as such, the rest published
    handler = OutOfMemoryOver(model_dir, rows=0)
    processor, pub = make(model_dir, handler=handler, retries=3)
    batch, tracker = batch_of(events(2), pub)
    processor.process(batch)
    assert [h[DLQ_ERROR_REASON] for t, _, _, h in pub.sent] == [b"out-of-memory"] * 2
    assert tracker.committable() == {("in", 0): 2}


def test_text_model_dead_letters_null_empty_and_non_utf8_texts_and_counts_cut_ones(model_dir: Path) -> None:
    from stream.models.demo import TEXT_COPY_FIELDS, TEXT_EMBEDDING_SCHEMA, TEXT_EVENT_SCHEMA
    from stream.models.minilm import MiniLMHandler

    text_event = REGISTRY.by_name(TEXT_EVENT_SCHEMA)
    texts: list[str | None] = ["A normal sentence.", None, "", "   \t\n", "XXXX", "word " * 1500, "Another one."]
    values = [encode(text_event, {"event_id": f"e{i}", "key": "k", "ts_ms": i, "text": t})
              for i, t in enumerate(texts)]
    values[4] = values[4].replace(b"XXXX", b"\xff\xfe\xc3\x28")  # not UTF-8
    handler = MiniLMHandler()
    processor, pub = make(model_dir, handler=handler, input_schema=TEXT_EVENT_SCHEMA,
                          output_schema=TEXT_EMBEDDING_SCHEMA, copy_fields=TEXT_COPY_FIELDS)
    batch, tracker = batch_of(values, pub)
    processor.process(batch)
    dead = {int(h[HEADER_OFFSET]): h[DLQ_ERROR_REASON] for t, _, _, h in pub.sent if t == "dlq"}
    assert dead == {1: b"null-input", 2: b"empty-input", 3: b"empty-input", 4: b"corrupt-avro"}
    messages = {int(h[HEADER_OFFSET]): h[DLQ_ERROR_MESSAGE] for t, _, _, h in pub.sent if t == "dlq"}
    assert b"not UTF-8" in messages[4] and b"input text" in messages[2]
    assert tracker.committable() == {("in", 0): 7}
    out = [t for t, *_ in pub.sent].count("out")
    assert out == 3
    predictions = [decode(REGISTRY, v)[1] for t, v, _, _ in pub.sent if t == "out"]
    assert [p["event_id"] for p in predictions] == ["e0", "e5", "e6"]
    want = handler.embed(["A normal sentence.", "word " * 1500, "Another one."])
    got = np.asarray([p["embedding"] for p in predictions], dtype=np.float32)
    assert float(np.abs(got - want).max()) == 0.0 and got.shape == (3, 384)
    assert processor._metrics.inputs_truncated._value.get() == 1  # counted once, not again by embed() above


def other_thread_ran_during(call: Any, window_s: float = 0.1) -> bool:
    """Whether another Python thread ran while ``call`` was in C: with a switch interval of a second the calling
    thread is never made to give the GIL up between reading the other thread's counter and entering the call, so
    the counter can only move meanwhile if the call released the GIL itself. ``call`` (which must give the same
    result each time) is made again until the counter moves or ``window_s`` has passed: one call of a few
    milliseconds can end before a loaded machine's scheduler wakes the other thread (seen in CI: the unit tests
    beside another pytest process on two cores), while a window far under the switch interval still cannot let it
    in through a call that holds the GIL.

    The spinning thread gives the GIL up itself every few thousand counts (a 0.1 ms sleep): with a switch interval
    of a second the calling thread would otherwise wait up to a second to get it back after each call that released
    it, and at the start (about a second per probe: 7 of the GIL test's 10 s here). A call that holds the GIL still
    keeps it from running at all."""
    import sys
    import threading
    import time

    counter = [0]
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            counter[0] += 1
            if counter[0] % 4096 == 0:
                time.sleep(0.0001)

    previous = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    thread = threading.Thread(target=spin, daemon=True)
    try:
        thread.start()
        while counter[0] == 0:
            time.sleep(0.0001)  # until the spinning thread runs
        before = counter[0]
        deadline = time.perf_counter() + window_s
        call()
        while counter[0] == before and time.perf_counter() < deadline:
            call()
        after = counter[0]
    finally:
        stop.set()
        sys.setswitchinterval(previous)
        thread.join()
    return after > before


class GilProbe:
    """Stands in for the C codec module: runs ``run_plan`` and ``encode_rows`` under `other_thread_ran_during`."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.ran: list[tuple[str, bool]] = []

    def __getattr__(self, name: str) -> Any:
        real = getattr(self.module, name)
        if name not in ("run_plan", "encode_rows"):
            return real

        def probed(*args: Any) -> Any:
            # A call that releases the GIL lets the spinning thread in only if the OS schedules it within the
            # window (on a loaded machine it may not be): up to five tries. A call that holds the GIL can never let
            # it in (each window is far shorter than the one-second switch interval), so five tries still say
            # False. Both calls probed here write the same output each time they are made.
            out: list[Any] = []
            ran = False
            for _ in range(5):
                out.clear()
                ran = other_thread_ran_during(lambda: out.append(real(*args)))
                if ran:
                    break
            self.ran.append((name, ran))
            return out[0]
        return probed


@pytest.mark.skipif(decoder_module._nativecodec is None, reason="the C codec is not built")
def test_the_c_codec_decodes_and_encodes_a_batch_without_holding_the_gil(model_dir: Path) -> None:
    """So that the prepare pool scales: a batch's decode (the worker's joined records) and its predictions'
    encode run in C while the other stages' threads run Python."""
    processor, pub = make(model_dir)
    probe = GilProbe(decoder_module._nativecodec)
    processor._decode_stage.decoder._native = probe
    processor._encoder._native = probe
    batch, _ = batch_of(events(20_000), pub)
    decoded, errors = processor._decode_stage.decoder.decode_batch(batch.records)
    assert errors == [] and len(decoded) == 20_000
    processor._decode_stage.decoder.decode_batch(batch.records.values())
    assert probe.ran == [("run_plan", True), ("run_plan", False)], \
        "the joined records are decoded without the GIL, a list of bytes objects with it (the probe tells apart)"
    outputs = processor.engine.run({"features": np.zeros((20_000, 32), dtype=np.float32)}).outputs
    processor._encoder.encode_joined(decoded, outputs, model_name="m", model_version="1", predicted_ts_ms=0,
                                     batch_size=20_000, source=InputSource("in", batch.partitions, batch.offsets))
    assert probe.ran[2:] == [("encode_rows", True)]
