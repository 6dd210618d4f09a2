"""The gateway's own protocol (`stream.gateway.app`) and its one request path (`stream.gateway.door`), as
`python -m stream gateway` assembles them, over a stand-in for the queue (the Kafka path:
tests/integration/test_gateway.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from stream.gateway.errors import NotSent
from tests.unit.gateway.fakes import FakeQueue, event, gateway


def test_one_event_or_a_list_gets_its_predictions_in_order() -> None:
    http, queue = gateway()
    one = http.post("/v1/predict", json=event())
    assert one.status_code == 200 and one.json()["fraud_score"] == pytest.approx(3.2, rel=1e-6)
    listed = http.post("/v1/predict", json=[event(event_id="a"), event(event_id="b", features=[-0.1] * 32)])
    assert listed.status_code == 200 and [r["event_id"] for r in listed.json()] == ["a", "b"]
    assert [e["event_id"] for e in queue.sent] == ["e-1", "a", "b"]


@pytest.mark.parametrize(("body", "status", "says"), [
    (b"{not json", 400, "the body is not JSON"),
    (b"[" * 100_000, 400, "recursion limit"),
    (b'{"event_id": "\\ud800"}', 400, "not JSON"),
    (b"", 400, "empty"),
    (b"[]", 400, "an empty list"),
    (b'{"event_id": "e", "key": "k", "ts_ms": 1e400, "features": []}', 422, "ts_ms: inf is not"),
    (b"NaN", 400, "not JSON"),
    (b"7", 422, "an event is a JSON object"),
    (json.dumps(event(features="not a list")).encode(), 422, "does not match the input schema"),
    (json.dumps(event(feautres=[1.0])).encode(), 422, "feautres: no such field"),
    (json.dumps(event(ts_ms=2**70)).encode(), 422, "does not match the input schema"),
])
def test_a_malformed_request_is_a_4xx_saying_why_and_nothing_is_sent(body: bytes, status: int, says: str) -> None:
    http, queue = gateway()
    answer = http.post("/v1/predict", content=body)
    assert answer.status_code == status and says in answer.text, answer.text
    assert answer.json()["sent"] is False and queue.sent == []


@pytest.mark.parametrize(("features", "reason"), [([0.1] * 31, "shape"), ([1e39] * 32, "non-finite"),
                                                  ([0.1] * 33, "shape"), ([], "shape")])
def test_an_event_the_workers_would_dead_letter_is_422_naming_it_and_the_request_sends_nothing(
        features: list[float], reason: str) -> None:
    http, queue = gateway()
    answer = http.post("/v1/predict", json=[event(event_id="good"), event(event_id="bad", features=features)])
    assert answer.status_code == 422, answer.text
    body = answer.json()
    assert body["index"] == 1 and f"({reason})" in body["error"] and "input features (features)" in body["error"]
    assert body["problems"] and body["sent"] is False
    assert queue.sent == [], "all or nothing: the good event was not sent either"


def test_sizes_and_counts_over_their_limits_are_413() -> None:
    http, queue = gateway(max_body_bytes=4096, max_pending=3)
    big = http.post("/v1/predict", content=json.dumps(event(event_id="x" * 5000)))
    assert big.status_code == 413 and "--max-body-bytes" in big.json()["error"]
    http, queue = gateway(max_input_bytes=300, max_pending=3)
    one = http.post("/v1/predict", json=event(event_id="x" * 400))
    assert one.status_code == 413 and "--max-input-bytes 300" in one.json()["error"]
    many = http.post("/v1/predict", json=[event()] * 4)
    assert many.status_code == 413 and "--max-pending (3)" in many.json()["error"]
    assert queue.sent == []


def test_a_full_queue_or_no_worker_is_503_at_once_with_retry_after() -> None:
    queue = FakeQueue(max_pending=3)
    http, _ = gateway(queue)
    queue.pending = 2
    busy = http.post("/v1/predict", json=[event(), event()])
    assert busy.status_code == 503 and busy.headers["retry-after"] == "1" and busy.json()["sent"] is False
    queue.pending = 0
    queue.serving = False
    none = http.post("/v1/predict", json=event())
    assert none.status_code == 503 and none.headers["retry-after"] == "5" and "no worker" in none.json()["error"]
    ready = http.get("/readyz")
    assert ready.status_code == 503 and ready.json() == {"ready": False, "why": ["no worker serves in"]}
    assert queue.sent == []
    queue.serving = True
    assert http.get("/readyz").json() == {"ready": True}


def test_failures_after_sending_name_the_event_and_say_it_was_sent() -> None:
    http, _ = gateway()
    dead = http.post("/v1/predict", json=[event(), event(features=[-5.0] * 32)])
    assert dead.status_code == 500 and dead.json() == {
        "error": "dead-lettered at the model stage (model-error): boom", "sent": True, "index": 1, "stage": "model",
        "reason": "model-error", "input_partition": 0, "input_offset": 3}
    late = http.post("/v1/predict", json=event(features=[5.0] * 32))
    assert late.status_code == 504 and "retry-after" not in late.headers
    assert late.json()["may_still_be_predicted"] is True and late.json()["input_offset"] == 4


def test_a_broker_that_does_not_take_an_event_is_503_without_its_internal_error() -> None:
    class Refusing(FakeQueue):
        def send(self, values: Any, keys: Any = None, context: Any = ()) -> Any:
            raise NotSent("the broker's client did not take the event: try again shortly", index=0)

    http, _ = gateway(Refusing())
    answer = http.post("/v1/predict", json=event())
    assert answer.status_code == 503 and "Local: Queue full" not in answer.text and answer.headers["retry-after"]


def test_an_unexpected_error_is_a_500_without_a_traceback(caplog: pytest.LogCaptureFixture) -> None:
    def broken(e: dict[str, Any]) -> Any:
        raise RuntimeError("a bug")

    http, _ = gateway(FakeQueue(broken))
    answer = http.post("/v1/predict", json=event())
    assert answer.status_code == 500 and "Traceback" not in answer.text and "a bug" not in answer.text
    assert any("a bug" in (r.exc_text or "") for r in caplog.records)


def test_the_document_lists_every_route_and_unknown_routes_are_json_404s() -> None:
    http, _ = gateway()
    spec = http.get("/openapi.json").json()
    assert spec["openapi"] == "3.1.0"
    assert {"/v1/predict", "/healthz", "/readyz", "/metrics", "/v1/embeddings", "/embed",
            "/v2/models/{model}/infer", "/v2/models/{model}/versions/{version}/infer"} <= set(spec["paths"])
    event_schema = spec["paths"]["/v1/predict"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert event_schema["oneOf"][0]["required"] == ["event_id", "key", "ts_ms", "features"]
    assert set(spec["paths"]["/v1/predict"]["post"]["responses"]) >= {"200", "400", "413", "422", "500", "503",
                                                                     "504"}
    missing = http.get("/v3/nothing")
    assert missing.status_code == 404 and "openapi.json" in missing.json()["error"]
    assert http.get("/v1/predict").status_code == 405
    assert "stream_gateway_body_bytes 0.0" in http.get("/metrics").text


def test_the_gateway_checks_a_built_in_model_s_contract_without_torch() -> None:
    code = ("import sys; from stream.codec.registry import FolderRegistry; from stream.gateway import make_app; "
            "from stream.gateway.settings import load_gateway_settings; "
            "from tests.unit.gateway.fakes import FakeQueue; "
            "[make_app(load_gateway_settings({'input_topic': 'in', 'bootstrap_servers': 'b', **extra}, environ={}), "
            "FolderRegistry.from_dir(None), FakeQueue(), 1000) for extra in ({}, {'model': 'minilm', "
            "'input_schema': 'stream.demo.TextEvent'})]; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=Path(__file__).parents[3])


def test_concurrent_requests_share_one_decode_stage_run_and_each_gets_its_own_verdict() -> None:
    import asyncio

    import httpx

    http, queue = gateway()
    app: Any = http.app
    from stream.pipeline.contract import DecodeStage

    runs: list[int] = []
    real = DecodeStage.run

    def counted(self: DecodeStage, values: Any) -> Any:
        runs.append(len(values))
        return real(self, values)

    bodies = [[event(event_id=f"e{i}", features=[0.1] * (31 if i % 3 == 0 else 32))] * (1 + i % 2)
              for i in range(30)]

    async def call_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
            return await asyncio.gather(*(client.post("/v1/predict", json=b) for b in bodies))

    DecodeStage.run = counted  # type: ignore[method-assign]
    try:
        answers = asyncio.run(call_all())
    finally:
        DecodeStage.run = real  # type: ignore[method-assign]
    for i, answer in enumerate(answers):
        assert answer.status_code == (422 if i % 3 == 0 else 200), (i, answer.text)
    assert sum(runs) == sum(len(b) for b in bodies) and len(runs) < len(bodies), runs
    assert {e["event_id"] for e in queue.sent} == {f"e{i}" for i in range(30) if i % 3}


def test_each_event_s_key_field_is_its_record_key_on_every_route() -> None:
    from stream.errors import ConfigError

    http, queue = gateway()  # the demo's schema has a string field `key`: the default
    assert http.post("/v1/predict", json=[event(event_id="a", key="acct-7"), event(event_id="b", key="é")]
                     ).status_code == 200
    assert queue.keys == [b"acct-7", "é".encode()]
    text_http, text_queue = gateway(model="minilm", input_schema="stream.demo.TextEvent",
                                    output_schema="stream.demo.TextEmbedding")
    assert text_http.post("/embed", json={"inputs": ["one", "two"]}).status_code == 200
    assert len(text_queue.keys) == 2 and all(k and len(k) >= 8 for k in text_queue.keys)  # a fresh key each
    assert len(set(text_queue.keys)) == 2
    off, off_queue = gateway(key_field="")
    assert off.post("/v1/predict", json=event()).status_code == 200 and off_queue.keys == [None]
    by_id, id_queue = gateway(key_field="event_id")
    assert by_id.post("/v1/predict", json=event(event_id="e-9")).status_code == 200 and id_queue.keys == [b"e-9"]
    for bad, says in (("nope", "has no such field"), ("features", "not a string")):
        with pytest.raises(ConfigError, match=f"--key-field {bad}: the input schema .*{says}"):
            gateway(key_field=bad)


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_request_s_trace_context_goes_with_each_of_its_events_on_every_route() -> None:
    """W3C traceparent (and tracestate) on the request: headers of each record it sends, whatever the protocol."""
    http, queue = gateway()
    given = {"traceparent": TRACEPARENT, "tracestate": "vendor=abc"}
    assert http.post("/v1/predict", json=[event(event_id="a"), event(event_id="b")], headers=given).status_code == 200
    v2 = {"inputs": [{"name": "features", "shape": [1, 32], "datatype": "FP32", "data": [0.1] * 32}]}
    assert http.post("/v2/models/demo-fraud-mlp/infer", json=v2, headers={"traceparent": TRACEPARENT}
                     ).status_code == 200
    assert http.post("/v1/predict", json=event()).status_code == 200  # none: no headers
    expected = [("traceparent", TRACEPARENT.encode()), ("tracestate", b"vendor=abc")]
    assert queue.contexts == [expected, [expected[0]], []]
    text_http, text_queue = gateway(model="minilm", input_schema="stream.demo.TextEvent",
                                    output_schema="stream.demo.TextEmbedding")
    assert text_http.post("/embed", json={"inputs": ["one"]}, headers=given).status_code == 200
    assert text_http.post("/v1/embeddings", json={"model": "all-MiniLM-L6-v2", "input": ["one"]},
                          headers=given).status_code == 200
    assert text_queue.contexts == [expected, expected]


@pytest.mark.parametrize("parent", [
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # an all-zero trace id
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # an all-zero parent id
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # the forbidden version
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",  # no flags
    "x" * 10_000,
])
def test_an_invalid_traceparent_is_dropped_with_its_tracestate_and_the_request_served(parent: str) -> None:
    from stream.gateway.door import trace_context

    assert trace_context({"traceparent": parent, "tracestate": "a=b"}) == []
    http, queue = gateway()
    assert http.post("/v1/predict", json=event(), headers={"traceparent": parent, "tracestate": "a=b"}
                     ).status_code == 200
    assert queue.contexts == [[]]


def test_a_tracestate_over_512_characters_is_dropped_and_the_traceparent_kept() -> None:
    from stream.gateway.door import trace_context

    assert trace_context({"traceparent": TRACEPARENT, "tracestate": "a=" + "b" * 600}) == [
        ("traceparent", TRACEPARENT.encode())]


def test_while_it_starts_the_gateway_answers_its_probes_and_asks_every_caller_to_come_back() -> None:
    """`stream.gateway.Starting`, what the server answers with before the start-up has made the app: alive, not
    ready (and why), 503 with Retry-After in each protocol's error shape; then every request goes to the app."""
    from starlette.testclient import TestClient

    from stream.gateway import Starting

    starting = Starting()
    http = TestClient(starting, raise_server_exceptions=False)
    assert http.get("/healthz").json() == {"alive": True} and http.get("/v2/health/live").json() == {"live": True}
    ready = http.get("/readyz")
    assert ready.status_code == 503 and ready.headers["retry-after"] == "5"
    assert ready.json() == {"ready": False, "why": ["the gateway is starting: waiting for the Kafka brokers"]}
    assert http.get("/v2/health/ready").status_code == 503
    starting.phase = "creating its reply topic and reading its schemas"
    own = http.post("/v1/predict", json=event())
    assert own.status_code == 503 and own.headers["retry-after"] == "5"
    assert own.json() == {"error": "the gateway is starting (creating its reply topic and reading its schemas): "
                                   "try again shortly"}
    openai = http.post("/v1/embeddings", json={"model": "m", "input": "x"}).json()["error"]
    assert openai["code"] == "unavailable" and "starting" in openai["message"]
    assert "starting" in http.post("/embed", json={"inputs": "x"}).json()["error"]
    assert http.put("/healthz").status_code == 503  # a probe is a GET
    app, _queue = gateway()
    starting.app = app.app
    assert http.get("/healthz").json() == {"alive": True} and http.post("/v1/predict", json=event()).status_code == 200
