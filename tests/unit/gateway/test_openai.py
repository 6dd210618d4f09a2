"""OpenAI's embeddings API on the gateway (`stream.gateway.openai`), driven by the real ``openai`` SDK over the
app in process, with a stand-in for the durable queue (the Kafka path: tests/integration/test_gateway_openai.py)."""

from __future__ import annotations

import base64
import json
from concurrent.futures import Future
from typing import Any

import numpy as np
import openai
import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from stream.codec import DEFAULT_SCHEMAS_DIR
from stream.gateway.app import read_body
from stream.gateway.client import DeadLettered, Prediction, Refused, RequestTimeout
from stream.gateway.openai import EmbeddingsApi, unavailable_routes
from stream.gateway.texts import TextEvents

SCHEMA = json.loads((DEFAULT_SCHEMAS_DIR / "text_event.avsc").read_text())
MODEL = "all-MiniLM-L6-v2"


def vector(text: str) -> list[float]:
    """A made-up embedding of a text (float32 values, as the prediction's decoded record holds)."""
    return np.random.default_rng(len(text) + ord(text[0])).random(8, dtype=np.float32).tolist()


class Queue:
    """The PredictionClient's part the API uses: each text's prediction at once (or its failure)."""

    def __init__(self, max_pending: int = 100) -> None:
        self.max_pending = max_pending
        self.pending = 0
        self.sent: list[dict[str, Any]] = []

    def encode(self, event: dict[str, Any]) -> bytes:
        if "REFUSE" in event["text"]:
            raise Refused("the event does not match the input schema", ["text: too odd"])
        return json.dumps(event).encode()

    def submit_encoded(self, value: bytes) -> Future[Prediction]:
        event = json.loads(value)
        self.sent.append(event)
        future: Future[Prediction] = Future()
        text = event["text"]
        if "POISON" in text:
            future.set_exception(DeadLettered("model", "model-error", "boom", 0, 7))
        elif "SLOW" in text:
            future.set_exception(RequestTimeout(2.0, 0, 8))
        else:
            future.set_result(Prediction({"event_id": event["event_id"], "embedding": vector(text)}, 0, 1,
                                         tokens=len(text.split()) + 2))
        return future


def sdk(queue: Queue, dimensions: int | None = 8, max_texts: int = 4) -> tuple[openai.OpenAI, TestClient]:
    texts = TextEvents(SCHEMA, None, {})
    api = EmbeddingsApi(queue, texts, model_name=MODEL, embedding_field="embedding",  # type: ignore[arg-type]
                        dimensions=dimensions, max_texts=max_texts, read_body=lambda r: read_body(r, 100_000))
    http = TestClient(Starlette(routes=api.routes(lambda handler: handler)))
    return openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=2), http


def test_the_sdk_gets_each_text_s_embedding_in_order_as_base64_by_default_and_as_floats() -> None:
    queue = Queue()
    client, http = sdk(queue)
    texts = ["a first text", "the second one, longer", "3"]
    for encoding in (None, "float", "base64"):
        kwargs = {} if encoding is None else {"encoding_format": encoding}
        got = client.embeddings.create(model=MODEL, input=texts, **kwargs)  # type: ignore[arg-type]
        assert [d.index for d in got.data] == [0, 1, 2] and got.model == MODEL
        for d, text in zip(got.data, texts, strict=True):
            # base64 asked for by its caller: the SDK hands the string over as it came
            values = (np.frombuffer(base64.b64decode(d.embedding), "<f4").tolist() if encoding == "base64"
                      else d.embedding)
            assert values == pytest.approx(vector(text)), encoding
        assert got.usage.prompt_tokens == got.usage.total_tokens == sum(len(t.split()) + 2 for t in texts)
    one = client.embeddings.create(model=MODEL, input="alone")
    assert len(one.data) == 1 and one.data[0].embedding == pytest.approx(vector("alone"))
    raw = http.post("/v1/embeddings", json={"model": MODEL, "input": ["xy"]}).json()  # no format: floats
    assert raw["data"][0]["embedding"] == pytest.approx(vector("xy"))
    # Each text became an event of the input schema: the text, fresh ids, the time.
    event = queue.sent[0]
    assert event["text"] == "a first text" and len(event["event_id"]) == 32 and event["key"] != event["event_id"]
    assert event["ts_ms"] > 1_700_000_000_000
    assert [m.id for m in client.models.list()] == [MODEL] and client.models.retrieve(MODEL).id == MODEL


def test_errors_have_the_api_s_shape_and_a_failed_text_is_named_by_its_index() -> None:
    queue = Queue()
    client, http = sdk(queue)
    with pytest.raises(openai.NotFoundError) as missing:
        client.embeddings.create(model="text-embedding-3-small", input="x")
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("text-embedding-3-small")
    for bad, param, says in [
            ({"input": [[1, 2, 3]]}, "input", "token ids are not accepted: send the text"),
            ({"input": [1, 2]}, "input", "token ids"), ({"input": []}, "input", "non-empty"),
            ({"input": ["a", " "]}, "input", "input[1] is empty"),
            ({"input": ["a"] * 5}, "input", "at most 4 (--max-texts)"),
            ({"input": "a", "dimensions": 4}, "dimensions", "8 dimensions"),
            ({"input": "a", "encoding_format": "int8"}, "encoding_format", "float or base64"),
            ({"input": ["fine", "REFUSE me"]}, "input", "input[1]: the event does not match")]:
        answer = http.post("/v1/embeddings", json={"model": MODEL, **bad})
        assert answer.status_code == 400, bad
        error = answer.json()["error"]
        assert error["param"] == param and says in error["message"] and error["type"] == "invalid_request_error"
    assert queue.sent == [], "nothing of a refused request reached the topic"
    assert http.post("/v1/embeddings", json={"input": "a"}).json()["error"]["param"] == "model"
    assert http.post("/v1/embeddings", content=b"{not json").status_code == 400
    # A dead-lettered text fails the whole request, naming it; the SDK is told not to retry (no second copy).
    with pytest.raises(openai.InternalServerError) as dead:
        client.embeddings.create(model=MODEL, input=["ok", "POISON", "ok too"])
    assert "input[1]" in dead.value.message and len(queue.sent) == 3, "sent once: no retry"
    late = http.post("/v1/embeddings", json={"model": MODEL, "input": ["SLOW"]})
    assert late.status_code == 504 and late.headers["x-should-retry"] == "false"
    with pytest.raises(openai.APIStatusError) as timeout:
        client.embeddings.create(model=MODEL, input="SLOW again")
    assert timeout.value.status_code == 504 and sum("SLOW again" in e["text"] for e in queue.sent) == 1


def test_a_full_queue_is_429_with_retry_after_before_anything_is_sent() -> None:
    queue = Queue(max_pending=3)
    queue.pending = 2
    _, http = sdk(queue)
    busy = http.post("/v1/embeddings", json={"model": MODEL, "input": ["a", "b"]})
    assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
    assert busy.json()["error"]["code"] == "rate_limit_exceeded" and queue.sent == []


def test_tei_s_embed_answers_a_list_of_vectors_and_its_own_errors() -> None:
    queue = Queue()
    _, http = sdk(queue)
    assert http.post("/embed", json={"inputs": "one"}).json() == [pytest.approx(vector("one"))]
    got = http.post("/embed", json={"inputs": ["one", "two words"], "normalize": True, "truncate": True}).json()
    assert got == [pytest.approx(vector("one")), pytest.approx(vector("two words"))]
    for body, status, kind in [({"inputs": []}, 422, "validation"), ({"inputs": ["a", ""]}, 422, "empty"),
                               ({"inputs": "a", "normalize": False}, 422, "validation"),
                               ({"inputs": ["POISON"]}, 424, "backend"), ({"inputs": ["SLOW"]}, 504, "backend")]:
        answer = http.post("/embed", json=body)
        assert answer.status_code == status and answer.json()["error_type"] == kind, (body, answer.text)


def test_without_a_text_field_the_routes_say_why() -> None:
    http = TestClient(Starlette(routes=unavailable_routes("the input schema stream.demo.FraudEvent has no field "
                                                          "'text'")))
    answer = http.post("/v1/embeddings", json={"model": MODEL, "input": "x"})
    assert answer.status_code == 404 and "has no field 'text'" in answer.json()["error"]["message"]
    assert http.get("/v1/models").status_code == 404
