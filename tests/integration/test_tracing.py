"""OpenTelemetry spans from `python -m stream gateway` and `python -m stream worker` with
``OTEL_EXPORTER_OTLP_ENDPOINT`` set, exported over OTLP/HTTP to a receiver in the test (`stream.bench.otlp`, which
decodes them with OpenTelemetry's own protobuf classes): a caller's trace through the gateway and the worker, spans
for the input records that carry a trace context and for none of the others, a dead letter's marked as such."""

from __future__ import annotations

import itertools
import secrets
import time
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Producer

from producers.events import generate_events
from stream.bench.otlp import OtlpReceiver, ReceivedSpan
from stream.codec import SchemaRegistry, encode
from stream.models.demo import EVENT_SCHEMA
from tests.gateway_cli import Gateway, events
from tests.integration.harness import Pipeline, wait_for_assignment

pytestmark = pytest.mark.integration
SERVER, CONSUMER = 2, 5  # OTLP's span kinds
ERROR = 2  # OTLP's status code


def children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> dict[str, ReceivedSpan]:
    return {s.name: s for s in spans if s.parent_id == parent.span_id and s.trace_id == parent.trace_id}


def wait_for(receiver: OtlpReceiver, enough: int, timeout_s: float = 30.0) -> list[ReceivedSpan]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        spans = receiver.snapshot()
        if sum(s.name.startswith("process ") for s in spans) >= enough:
            return spans
        time.sleep(0.1)
    raise AssertionError(f"fewer than {enough} record spans within {timeout_s}s: "
                         f"{sorted({s.name for s in receiver.snapshot()})}")


def test_a_traced_request_and_traced_records_get_spans_and_untraced_records_none(
        pipeline: Pipeline, tmp_path: Path) -> None:
    with OtlpReceiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.start(), "OTEL_BSP_SCHEDULE_DELAY": "100",
               "OTEL_SERVICE_NAME": "fraud-worker"}
        worker = pipeline.worker("--max-wait-ms", "5", "--dlq-topic", pipeline.input.replace("-in-", "-dlq-"),
                                 env=env)
        gateway = Gateway(pipeline.bootstrap, pipeline.input, tmp_path / "gw.log",
                          env={k: v for k, v in env.items() if k != "OTEL_SERVICE_NAME"})
        try:
            wait_for_assignment(worker)
            gateway.wait_ready()
            # 1. A caller's request with its trace context, through the gateway.
            caller_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)
            answer = httpx.post(f"{gateway.url}/v1/predict", json=events(1, seed=3)[0], timeout=30,
                                headers={"traceparent": f"00-{caller_trace}-{caller_span}-01"})
            assert answer.status_code == 200, answer.text
            # 2. Records produced to the input topic: every third with a trace context of its own, one with an
            # unsampled one, all timestamped 3 s before now (their time in Kafka); and one not Avro, traced, which
            # is dead-lettered at decode.
            schema = SchemaRegistry.from_dir().by_name(EVENT_SCHEMA)
            producer = Producer({"bootstrap.servers": pipeline.bootstrap})
            stamp = int(time.time() * 1000) - 3000
            traced: dict[str, str] = {}  # event id (or "poison") -> its trace id
            for i, record in enumerate(generate_events(30, seed=9).records()):
                headers = None
                if i == 1:  # not sampled upstream (flags 00): carried, but no span
                    headers = [("traceparent", f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-00".encode())]
                if i % 3 == 0:
                    traced[str(record["event_id"])] = trace = secrets.token_hex(16)
                    headers = [("traceparent", f"00-{trace}-{secrets.token_hex(8)}-01".encode())]
                producer.produce(pipeline.input, encode(schema, record), str(record["key"]).encode(),
                                 headers=headers, timestamp=stamp)
            traced["poison"] = trace = secrets.token_hex(16)
            producer.produce(pipeline.input, b"not avro", b"k", timestamp=stamp,
                             headers=[("traceparent", f"00-{trace}-{secrets.token_hex(8)}-01".encode())])
            assert producer.flush(30) == 0
            del producer
            spans = wait_for(receiver, 1 + len(traced))
            assert worker.terminate() == 0 and gateway.stop() == 0  # both flush what they still hold
            spans = receiver.snapshot()
        finally:
            gateway.process.kill()

    # The request: the gateway's SERVER span is a child of the caller's; the worker's record span of the gateway's.
    [request] = [s for s in spans if s.kind == SERVER]
    assert request.name == "POST /v1/predict" and request.service == "stream-gateway"
    assert (request.trace_id, request.parent_id) == (caller_trace, caller_span)
    assert request.attributes["http.response.status_code"] == 200
    records = [s for s in spans if s.name == f"process {pipeline.input}"]
    assert all(s.kind == CONSUMER and s.service == "fraud-worker" for s in records)
    [through] = [s for s in records if s.trace_id == caller_trace]
    assert through.parent_id == request.span_id  # (its timestamp is in ms: up to 1 ms before the request)
    assert request.start_ns - 1_000_000 <= through.start_ns <= request.end_ns
    # Records with a trace context, and no other: one span each, in that record's own trace.
    assert sorted(s.trace_id for s in records if s is not through) == sorted(traced.values())
    for s in records:
        steps = children(spans, s)
        poison = s.trace_id == traced["poison"]
        assert set(steps) == ({"kafka", "batch", "publish"} if poison else {"kafka", "batch", "device", "publish"})
        order = [steps[n] for n in ("kafka", "batch", "device", "publish") if n in steps]
        assert order[0].start_ns == s.start_ns and order[-1].end_ns == s.end_ns
        assert all(a.end_ns == b.start_ns for a, b in itertools.pairwise(order)), order
        assert s.attributes["messaging.destination.name"] == pipeline.input
        if s is not through:  # produced 3 s ago: its wait in Kafka starts at its timestamp
            assert steps["kafka"].start_ns == stamp * 1_000_000
            assert steps["kafka"].end_ns - steps["kafka"].start_ns >= 2_900_000_000
        assert (s.status == ERROR) == poison
        if poison:
            assert s.attributes["stream.dead_letter.stage"] == "decode"
    # Each batch span links the record spans it carried; every record span is linked from one.
    batches = [s for s in spans if s.name == "inference batch"]
    linked = [link for b in batches for link in b.links]
    assert sorted(linked) == sorted((s.trace_id, s.span_id) for s in records)
    assert all(b.attributes["stream.batch.size"] >= len(b.links) for b in batches)
