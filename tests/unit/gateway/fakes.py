"""The gateway as `python -m stream gateway` assembles it (`stream.gateway.make_app`: settings, schemas, the model's
decode stage, every protocol), over a stand-in for the durable queue that answers each event at once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
from starlette.testclient import TestClient

from stream.codec import SchemaRegistry, decode
from stream.codec.registry import FolderRegistry
from stream.gateway import make_app
from stream.gateway.auth import KeySource
from stream.gateway.client import Prediction
from stream.gateway.errors import GatewayError, NoWorkers, Overloaded, RequestTimeout, dead_lettered
from stream.gateway.settings import load_gateway_settings

REGISTRY = SchemaRegistry.from_dir()
Outcome = dict[str, Any] | GatewayError


def demo_outcome(event: dict[str, Any]) -> Outcome:
    """A made-up prediction: the features' sum as the score; a sum under -100 fails the model, over 100 is late."""
    if "text" in event:
        text = event["text"]
        if "POISON" in text:
            return dead_lettered("model", "model-error", "boom", 0, 7)
        if "SLOW" in text:
            return RequestTimeout(2.0, 0, 8)
        return {"event_id": event["event_id"], "event_ts_ms": event["ts_ms"], "embedding": vector(text),
                "model_name": "all-MiniLM-L6-v2", "model_version": "v7", "predicted_ts_ms": 1, "batch_size": 1,
                "input_topic": "in", "input_partition": 0, "input_offset": 12}
    score = float(np.float32(sum(event["features"])))
    if score < -100:
        return dead_lettered("model", "model-error", "boom", 0, 3)
    if score > 100:
        return RequestTimeout(1.0, 0, 4)
    return {"event_id": event["event_id"], "model_name": "demo-fraud-mlp", "model_version": "v7",
            "fraud_score": score, "is_fraud": score > 0, "event_ts_ms": event["ts_ms"], "predicted_ts_ms": 1,
            "batch_size": 1, "input_topic": "in", "input_partition": 0, "input_offset": 12}


def vector(text: str) -> list[float]:
    """A made-up embedding of a text (float32 values, as the prediction's decoded record holds)."""
    return np.random.default_rng(len(text) + ord(text[0])).random(8, dtype=np.float32).tolist()


class FakeQueue:
    """`stream.gateway.client.PredictionClient` as the door sees it: room under ``max_pending`` (``pending``
    already taken), a worker serving or not, every event decoded and answered by ``outcome``."""

    def __init__(self, outcome: Callable[[dict[str, Any]], Outcome] = demo_outcome, max_pending: int = 100) -> None:
        self.outcome = outcome
        self.max_pending = max_pending
        self.pending = 0
        self.serving = True
        self.sent: list[dict[str, Any]] = []
        self.keys: list[bytes | None] = []
        self.contexts: list[list[tuple[str, bytes]]] = []  # each send's headers besides the reply address
        self.replies_read = self.foreign_replies = 0

    def check_room(self, count: int) -> None:
        if not self.serving:
            raise NoWorkers("no worker serves in")
        if self.pending + count > self.max_pending:
            raise Overloaded(f"{self.pending} events are waiting (--max-pending {self.max_pending})")

    def send(self, values: Sequence[bytes], keys: Sequence[bytes | None] | None = None,
             context: Sequence[tuple[str, bytes]] = ()) -> list[Future[Prediction]]:
        self.check_room(len(values))
        self.contexts.append(list(context))
        futures = []
        for i, value in enumerate(values):
            event = decode(REGISTRY, value)[1]
            self.sent.append(event)
            self.keys.append(keys[i] if keys else None)
            future: Future[Prediction] = Future()
            result = self.outcome(event)
            if isinstance(result, GatewayError):
                future.set_exception(result)
            else:
                tokens = len(event["text"].split()) + 2 if isinstance(event.get("text"), str) else None
                future.set_result(Prediction(result, 0, len(self.sent) - 1, tokens=tokens))
            futures.append(future)
        return futures

    def alive(self) -> bool:
        return True

    def ready(self) -> list[str]:
        return [] if self.serving else ["no worker serves in"]


def gateway(queue: FakeQueue | None = None, *, keys: KeySource | None = None, max_input_bytes: int = 998_976,
            **settings: Any) -> tuple[TestClient, FakeQueue]:
    """The app in process (``settings``: the gateway's, by name), and its queue."""
    queue = queue or FakeQueue(max_pending=settings.get("max_pending", 1000))
    given = {"input_topic": "in", "bootstrap_servers": "127.0.0.1:1", **settings}
    app, _ = make_app(load_gateway_settings(given, environ={}), FolderRegistry.from_dir(None), queue,
                      max_input_bytes, keys)
    return TestClient(app, raise_server_exceptions=False), queue


def text_gateway(queue: FakeQueue | None = None, **settings: Any) -> tuple[TestClient, FakeQueue]:
    return gateway(queue, model="minilm", input_schema="stream.demo.TextEvent",
                   output_schema="stream.demo.TextEmbedding", **settings)


def event(**overrides: Any) -> dict[str, Any]:
    """A demo event as a caller sends it."""
    return {"event_id": "e-1", "key": "acct-1", "ts_ms": 1_700_000_000_000, "features": [0.1] * 32, **overrides}
