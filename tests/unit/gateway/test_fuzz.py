"""Every route of the gateway fuzzed against its own OpenAPI document by schemathesis (generated and mutated
bodies, paths and headers): never a 500, every status and body the one the document gives; and the v2 binary
framing under hypothesis. Both schema layouts: the demo's events (no text routes) and texts (every route)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.config import SchemathesisConfig

from tests.unit.gateway.fakes import gateway, text_gateway

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          negative_data_rejection]
DEMO, _ = gateway()
TEXTS, _ = text_gateway()
# A request the document's schema refuses must be refused: 413 (too many events) and 408 count as refusals too.
CONFIG = SchemathesisConfig.from_dict({"checks": {"negative_data_rejection": {
    "expected-statuses": [400, 401, 404, 405, 408, 413, 415, 422, 429]}}})
demo = schemathesis.openapi.from_asgi("/openapi.json", DEMO.app, config=CONFIG)
texts = schemathesis.openapi.from_asgi("/openapi.json", TEXTS.app, config=CONFIG)
FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


@demo.parametrize()
@FUZZ
def test_the_demo_gateway_answers_every_generated_request_as_its_document_says(case: Any) -> None:
    case.call_and_validate(checks=CHECKS)


@texts.parametrize()
@FUZZ
def test_the_text_gateway_answers_every_generated_request_as_its_document_says(case: Any) -> None:
    case.call_and_validate(checks=CHECKS)


ROW = np.linspace(-1, 1, 32, dtype="<f4")


def framed(head: dict[str, Any], blob: bytes) -> tuple[bytes, dict[str, str]]:
    header = json.dumps(head).encode()
    return header + blob, {"Inference-Header-Content-Length": str(len(header))}


@settings(max_examples=300, deadline=None)
@given(rows=st.integers(0, 3), cut=st.integers(-8, 8), size_delta=st.integers(-8, 8), extra=st.binary(max_size=12),
       datatype=st.sampled_from(["FP32", "FP64", "FP16", "INT32", "BYTES", "BOOL"]),
       length_delta=st.integers(-3, 3), shape_tail=st.lists(st.integers(0, 40), max_size=3))
def test_any_binary_framing_is_a_prediction_or_a_400(rows: int, cut: int, size_delta: int, extra: bytes,
                                                     datatype: str, length_delta: int, shape_tail: list[int]) -> None:
    blob = np.tile(ROW, rows).tobytes()
    blob = blob[:len(blob) + cut] if cut < 0 else blob + b"\x00" * cut
    head = {"inputs": [{"name": "features", "datatype": datatype, "shape": [rows, *shape_tail],
                        "parameters": {"binary_data_size": max(0, len(blob) + size_delta)}}],
            "parameters": {"binary_data_output": True}}
    body, headers = framed(head, blob + extra)
    headers["Inference-Header-Content-Length"] = str(max(0, int(headers["Inference-Header-Content-Length"])
                                                     + length_delta))
    answer = DEMO.post("/v2/models/demo-fraud-mlp/infer", content=body, headers=headers)
    assert answer.status_code in (200, 400, 413), answer.text
    if answer.status_code == 200:
        length = int(answer.headers["inference-header-content-length"])
        outputs = json.loads(answer.content[:length])["outputs"]
        assert {o["name"] for o in outputs} >= {"fraud_score", "is_fraud"}
    else:
        assert set(answer.json()) == {"error"}


def test_a_well_framed_binary_request_is_predicted() -> None:
    body, headers = framed({"inputs": [{"name": "features", "datatype": "FP32", "shape": [2, 32],
                                        "parameters": {"binary_data_size": 256}}]}, np.tile(ROW, 2).tobytes())
    answer = DEMO.post("/v2/models/demo-fraud-mlp/infer", content=body, headers=headers)
    assert answer.status_code == 200 and len(answer.json()["outputs"][0]["data"]) == 2
    pytest.importorskip("tritonclient")
