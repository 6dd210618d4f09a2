"""OpenAI's embeddings API on the gateway (`stream.gateway.openai`), driven by the real ``openai`` SDK over the
app in process, with a stand-in for the durable queue (the Kafka path: tests/integration/test_gateway_openai.py)."""

from __future__ import annotations

import base64

import numpy as np
import openai
import pytest
from starlette.testclient import TestClient

from tests.unit.gateway.fakes import FakeQueue, gateway, text_gateway, vector

MODEL = "all-MiniLM-L6-v2"


def sdk(queue: FakeQueue, max_texts: int = 4) -> tuple[openai.OpenAI, TestClient]:
    _, http = None, text_gateway(queue, max_texts=max_texts)[0]
    return openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=http, max_retries=2), http


def test_the_sdk_gets_each_text_s_embedding_in_order_as_base64_by_default_and_as_floats() -> None:
    queue = FakeQueue()
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
    queue = FakeQueue()
    client, http = sdk(queue)
    with pytest.raises(openai.NotFoundError) as missing:
        client.embeddings.create(model="text-embedding-3-small", input="x")
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("text-embedding-3-small")
    for bad, param, says in [
            ({"input": [[1, 2, 3]]}, "input", "token ids are not accepted: send the text"),
            ({"input": [1, 2]}, "input", "token ids"), ({"input": []}, "input", "non-empty"),
            ({"input": ["a", " "]}, "input", "input[1]: the text is empty"),
            ({"input": ["a"] * 5}, "input", "at most 4 (--max-texts)"),
            ({"input": "a", "dimensions": 4}, "dimensions", "384 dimensions"),
            ({"input": "a", "encoding_format": "int8"}, "encoding_format", "'float' or 'base64'"),
            ({"input": "a", "user": 7}, "user", "valid string"),
            ({"input": "a", "model": 7}, "model", "valid string")]:
        answer = http.post("/v1/embeddings", json={"model": MODEL, **bad})
        assert answer.status_code == 400, (bad, answer.text)
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
    queue = FakeQueue(max_pending=3)
    queue.pending = 2
    _, http = sdk(queue)
    busy = http.post("/v1/embeddings", json={"model": MODEL, "input": ["a", "b"]})
    assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
    assert busy.json()["error"]["code"] == "rate_limit_exceeded" and queue.sent == []


def test_tei_s_embed_answers_a_list_of_vectors_and_its_own_errors() -> None:
    queue = FakeQueue()
    _, http = sdk(queue)
    assert http.post("/embed", json={"inputs": "one"}).json() == [pytest.approx(vector("one"))]
    got = http.post("/embed", json={"inputs": ["one", "two words"], "normalize": True, "truncate": True}).json()
    assert got == [pytest.approx(vector("one")), pytest.approx(vector("two words"))]
    assert http.post("/", json={"inputs": ["one"], "truncation_direction": "Right"}).json() == [
        pytest.approx(vector("one"))]  # TEI answers POST / as /embed (huggingface_hub's InferenceClient posts there)
    for body, status, kind in [({"inputs": []}, 422, "validation"), ({"inputs": ["a", ""]}, 422, "empty"),
                               ({"inputs": "a", "normalize": False}, 422, "validation"),
                               ({"inputs": "a", "truncation_direction": "Left"}, 422, "validation"),
                               ({"inputs": ["POISON"]}, 424, "backend"), ({"inputs": ["SLOW"]}, 504, "backend")]:
        answer = http.post("/embed", json=body)
        assert answer.status_code == status and answer.json()["error_type"] == kind, (body, answer.text)


def test_without_a_text_field_the_routes_say_why() -> None:
    http, _ = gateway()  # the demo's schema: no text field
    answer = http.post("/v1/embeddings", json={"model": MODEL, "input": "x"})
    assert answer.status_code == 404 and "has no field 'text'" in answer.json()["error"]["message"]
    assert http.get("/v1/models").status_code == 404


def test_a_text_the_model_cannot_take_is_refused_before_anything_is_sent() -> None:
    queue = FakeQueue()
    _, http = sdk(queue)
    answer = http.post("/v1/embeddings", json={"model": MODEL, "input": ["fine", "x" * 1_100_000]})
    assert answer.status_code == 413 and answer.json()["error"]["code"] == "request_too_large"
    assert queue.sent == []


def test_huggingface_hub_s_inference_client_embeds_through_the_root_url_as_against_tei() -> None:
    """`InferenceClient(model=URL).feature_extraction` posts to the URL itself, which TEI answers as /embed."""
    import threading
    import time

    import uvicorn
    from huggingface_hub import InferenceClient

    from stream.local.broker import free_port

    http, _ = text_gateway(FakeQueue(), max_texts=4)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(http.app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        client = InferenceClient(model=f"http://127.0.0.1:{port}")
        got = client.feature_extraction("one")
        assert np.asarray(got).reshape(-1).tolist() == pytest.approx(vector("one"))
        both = client.feature_extraction("two words", truncate=True, truncation_direction="right")
        assert np.asarray(both).reshape(-1).tolist() == pytest.approx(vector("two words"))
        # TEI's GET /info: the model and the gateway's own limits (the library asks it of its hf-inference provider)
        info = InferenceClient(model=f"http://127.0.0.1:{port}", provider="hf-inference").get_endpoint_info()
        assert info["model_id"] == MODEL and info["model_type"] == {"embedding": {"pooling": "mean"}}
        assert info["max_client_batch_size"] == 4 and info["max_input_length"] == 256 and info["auto_truncate"]
    finally:
        server.should_exit = True
        thread.join(10)
