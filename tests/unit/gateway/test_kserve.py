"""The Open Inference Protocol on the gateway (`stream.gateway.kserve`): requests built and answers read by
``tritonclient.http``'s own code (binary tensors, its default, and JSON), over the app in process with a stand-in
for the durable queue (the Kafka path: tests/integration/test_gateway_kserve.py)."""

from __future__ import annotations

import json
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton
from starlette.applications import Starlette
from starlette.testclient import TestClient

from stream.codec import DEFAULT_SCHEMAS_DIR
from stream.gateway.app import read_body
from stream.gateway.client import DeadLettered, Prediction, RequestTimeout
from stream.gateway.kserve import InferenceApi

EVENT = json.loads((DEFAULT_SCHEMAS_DIR / "fraud_event.avsc").read_text())
PREDICTION = json.loads((DEFAULT_SCHEMAS_DIR / "fraud_prediction_v2.avsc").read_text())
TEXT = json.loads((DEFAULT_SCHEMAS_DIR / "text_event.avsc").read_text())


class Queue:
    """The PredictionClient's part the API uses: a made-up prediction of each event at once, or its failure."""

    def __init__(self) -> None:
        self.max_pending, self.pending = 100, 0
        self.sent: list[dict[str, Any]] = []

    def alive(self) -> bool:
        return True

    def ready(self) -> bool:
        return True

    def encode(self, event: dict[str, Any]) -> bytes:
        return json.dumps(event).encode()

    def submit_encoded(self, value: bytes) -> Future[Prediction]:
        event = json.loads(value)
        self.sent.append(event)
        future: Future[Prediction] = Future()
        if "text" in event:
            record: dict[str, Any] = {"event_id": event["event_id"], "embedding": [float(len(event["text"]))] * 3}
        else:
            score = float(np.float32(sum(event["features"])))
            if score < -100:
                future.set_exception(DeadLettered("model", "model-error", "boom", 0, 3))
                return future
            if score > 100:
                future.set_exception(RequestTimeout(1.0, 0, 4))
                return future
            record = {"event_id": event["event_id"], "fraud_score": score, "is_fraud": score > 0,
                      "model_version": "v7", "input_offset": 12}
        future.set_result(Prediction(record, 0, 1))
        return future


def app(queue: Queue, schema: dict[str, Any] = EVENT, output: dict[str, Any] | None = PREDICTION,
        name: str = "demo-fraud-mlp") -> TestClient:
    api = InferenceApi(queue, schema, output, model_name=name,  # type: ignore[arg-type]
                       read_body=lambda r: read_body(r, 1_000_000))
    return TestClient(Starlette(routes=api.routes(lambda handler: handler)))


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
    queue = Queue()
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
    queue = Queue()
    http = app(queue, TEXT, None, "all-MiniLM-L6-v2")
    texts = np.array([b"one", b"twenty two", b"x"], dtype=np.object_)
    given = triton.InferInput("text", [3], "BYTES")
    given.set_data_from_numpy(texts)
    result = infer(http, [given], [triton.InferRequestedOutput("embedding")], model="all-MiniLM-L6-v2")
    assert result.as_numpy("embedding").tolist() == [[3.0] * 3, [10.0] * 3, [1.0] * 3]
    assert [e["text"] for e in queue.sent] == ["one", "twenty two", "x"]


def test_metadata_health_and_errors_in_the_protocol_s_shape() -> None:
    queue = Queue()
    http = app(queue)
    assert http.get("/v2").json()["extensions"] == ["binary_tensor_data"]
    assert http.get("/v2/health/live").status_code == 200 and http.get("/v2/health/ready").status_code == 200
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
            ({"inputs": []}, "non-empty list of inputs"),
            ({"inputs": [{"name": "nope", "datatype": "FP32", "shape": [1], "data": [1]}]}, "no input nope"),
            ({"inputs": [{"name": "key", "datatype": "BYTES", "shape": [1], "data": ["k"]}]},
             "inputs features are required"),
            ({"inputs": [{"name": "features", "datatype": "FP32", "shape": [2, 32], "data": row}]},
             "32 values in data"),
            ({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 32], "data": row},
                         {"name": "key", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]}]}, "differ"),
            ({"inputs": [{"name": "features", "datatype": "BYTES", "shape": [1, 32], "data": row}]},
             "array of numbers"),
            ({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 32], "data": row}],
              "outputs": [{"name": "nope"}]}, "no output 'nope'")]:
        status, message = post(body)
        assert status == 400 and says in message, (body, message)
    status, message = post({"inputs": [{"name": "features", "datatype": "FP32", "shape": [2, 32],
                                        "data": row + [-5.0] * 32}]})
    assert status == 500 and message.startswith("event 1: dead-lettered at the model stage")
    status, message = post({"inputs": [{"name": "features", "datatype": "FP32", "shape": [1, 32],
                                        "data": [5.0] * 32}]})
    assert status == 504 and "no prediction within" in message
    # A binary header that does not fit its body
    answer = http.post("/v2/models/demo-fraud-mlp/infer", content=b"{}", headers={
        "Inference-Header-Content-Length": "99"})
    assert answer.status_code == 400 and "Inference-Header-Content-Length" in answer.json()["error"]
