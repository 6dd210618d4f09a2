"""The Open Inference Protocol on the gateway (`stream.gateway.kserve`): requests built and answers read by
``tritonclient.http``'s own code (binary tensors, its default, and JSON), over the app in process with a stand-in
for the durable queue (the Kafka path: tests/integration/test_gateway_kserve.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from starlette.testclient import TestClient

from tests.unit.gateway.fakes import FakeQueue, gateway, text_gateway


def app(queue: FakeQueue, **settings: Any) -> TestClient:
    return gateway(queue, **settings)[0]


def infer(http: TestClient, inputs: list[triton.InferInput], outputs: list[triton.InferRequestedOutput] | None = None,
          model: str = "demo-fraud-mlp") -> triton.InferResult:
    body, json_size = triton.InferenceServerClient.generate_request_body(inputs, outputs)
    headers = {} if json_size is None else {"Inference-Header-Content-Length": str(json_size)}
    answer = http.post(f"/v2/models/{model}/infer", content=body, headers=headers)
    assert answer.status_code == 200, answer.text
    length = answer.headers.get("inference-header-content-length")
    return triton.InferenceServerClient.parse_response_body(answer.content,
                                                            header_length=int(length) if length else None)


def features(n: int) -> np.ndarray:
    return np.random.default_rng(n).normal(size=(n, 32)).astype(np.float32)


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_s_request_gets_one_row_per_event_of_each_output(binary: bool) -> None:
    queue = FakeQueue()
    http = app(queue)
    x = features(5)
    given = triton.InferInput("features", list(x.shape), "FP32")
    given.set_data_from_numpy(x, binary_data=binary)
    result = infer(http, [given], None if binary else [triton.InferRequestedOutput(n, binary_data=False)
                                                       for n in ("fraud_score", "is_fraud", "event_id")])
    scores = result.as_numpy("fraud_score")
    assert scores.dtype == np.float32 and scores.shape == (5,)
    assert scores.tolist() == pytest.approx(x.sum(axis=1).tolist(), rel=1e-5)
    assert result.as_numpy("is_fraud").tolist() == (x.sum(axis=1) > 0).tolist()
    ids = [v.decode() if isinstance(v, bytes) else v for v in result.as_numpy("event_id").tolist()]
    assert ids == [e["event_id"] for e in queue.sent], "each row is its own event's"
    assert result.get_response()["model_version"] == "v7"
    # The fields no tensor gave: fresh ids, the time.
    assert len({e["key"] for e in queue.sent}) == 5 and all(e["ts_ms"] > 1_700_000_000_000 for e in queue.sent)
    if binary:
        assert result.as_numpy("input_offset").dtype == np.int64, "every output when none is asked for"


def test_a_text_model_takes_a_bytes_tensor_and_answers_a_matrix() -> None:
    queue = FakeQueue()
    http, _ = text_gateway(queue)
    texts = np.array([b"one", b"twenty two", b"x"], dtype=np.object_)
    given = triton.InferInput("text", [3], "BYTES")
    given.set_data_from_numpy(texts)
    result = infer(http, [given], [triton.InferRequestedOutput("embedding")], model="all-MiniLM-L6-v2")
    assert result.as_numpy("embedding").shape == (3, 8)
    assert [e["text"] for e in queue.sent] == ["one", "twenty two", "x"]


def test_metadata_health_and_errors_in_the_protocol_s_shape() -> None:
    queue = FakeQueue()
    http = app(queue)
    assert http.get("/v2").json()["extensions"] == ["binary_tensor_data"]
    assert http.get("/v2/health/live").json() == {"live": True} and http.get("/v2/health/ready").json() == {
        "ready": True}
    meta = http.get("/v2/models/demo-fraud-mlp").json()
    assert {i["name"]: (i["datatype"], i["shape"]) for i in meta["inputs"]} == {
        "event_id": ("BYTES", [-1]), "key": ("BYTES", [-1]), "ts_ms": ("INT64", [-1]), "features": ("FP32", [-1, -1])}
    assert {"fraud_score": "FP32", "is_fraud": "BOOL"}.items() <= {o["name"]: o["datatype"]
                                                                  for o in meta["outputs"]}.items()
    assert http.get("/v2/models/demo-fraud-mlp/versions/3/ready").status_code == 200
    assert http.get("/v2/models/other").status_code == 404 and "other" in http.get("/v2/models/other").json()["error"]

    def post(body: dict[str, Any]) -> tuple[int, str]:
        answer = http.post("/v2/models/demo-fraud-mlp/infer", json=body)
        return answer.status_code, answer.json()["error"]

    row = [0.1] * 32
    for body, says in [
            ({"inputs": []}, "inputs: List should have at least 1 item"),
            ({"inputs": [{"name": "nope", "datatype": "FP32", "shape": [1], "data": [1]}]}, "no input nope"),
            ({"inputs": [{"name": "key", "datatype": "BYTES", "shape": [1], "data": ["k"]}]},
             "inputs features are required"),
            ({"inputs": [{"name": "features", "datatype": "FP32", "shape": [2, 32], "data": row}]},
             "32 values in data"),
            ({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 32], "data": row},
                         {"name": "key", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]}]}, "differ"),
            ({"inputs": [{"name": "features", "datatype": "BYTES", "shape": [1, 32], "data": row}]},
             "BYTES data are strings"),
            ({"inputs": [{"name": "features", "datatype": "FP16", "shape": [1, 32], "data": row}]},
             "datatype FP16, the model's metadata says FP32"),
            ({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 31], "data": row[:31]}]},
             "event 0: the workers would dead-letter this event (shape)"),
            ({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 2**62, 4], "data": row}]},
             "its shape [1, 4611686018427387904, 4] says 18446744073709551616"),
            ({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 2**62, 4],
                          "parameters": {"binary_data_size": 0}}]}, "more than the body holds"),
            ({"inputs": [{"name": "features", "datatype": "FP32", "shape": [True, 32], "data": row}]},
             "a size is a whole number"),
            ({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 32], "data": ["a"] * 32}]},
             "FP32 data are numbers"),
            ({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 32], "data": row,
                          "parameters": [1]}]}, "valid dictionary"),
            ({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 32], "data": row,
                          "parameters": "x"}]}, "valid dictionary"),
            ({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 32], "data": row}],
              "parameters": [1]}, "valid dictionary"),
            ({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 32], "data": row}],
              "outputs": [{"name": "fraud_score", "parameters": [1]}]}, "valid dictionary"),
            ({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 32], "data": row}], "id": 7},
             "valid string"),
            ({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 32], "data": row},
                         {"name": "ts_ms", "datatype": "INT64", "shape": [1], "data": [2**70]}]}, "whole numbers"),
            ({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 32], "data": row},
                         {"name": "key", "datatype": "BYTES", "shape": [1], "data": [5]}]}, "BYTES data are strings"),
            ({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 32], "data": row}],
              "outputs": [{"name": "nope"}]}, "no output 'nope'")]:
        status, message = post(body)
        assert status == 400 and says in message, (body, message)
    assert queue.sent == [], "nothing of a refused request reached the topic"
    status, message = post({"inputs": [{"name": "features", "datatype": "FP32", "shape": [2, 32],
                                        "data": row + [-5.0] * 32}]})
    assert status == 500 and message.startswith("event 1: dead-lettered at the model stage")
    status, message = post({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 32],
                                        "data": [5.0] * 32}]})
    assert status == 504 and "no prediction within" in message
    # A binary header that does not fit its body
    for length in (b"99", "²".encode(), b"-1", b"1" * 40):
        answer = http.post("/v2/models/demo-fraud-mlp/infer", content=b"{}", headers={
            "Inference-Header-Content-Length": length})
        assert answer.status_code == 400 and "Inference-Header-Content-Length" in answer.json()["error"], length
    # No worker: 503 at once, and readiness says so
    queue.serving = False
    assert post({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 32], "data": row}]})[0] == 503
    assert http.get("/v2/health/ready").json() == {"ready": False}
