"""Test-only model handlers, loadable by worker processes as ``--model tests.handlers:Name``."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

from producers.events import generate_events
from stream.codec import SchemaRegistry, encode
from stream.models.demo import EVENT_SCHEMA, DemoFraudHandler

POISON_MARK = 999.0  # an event whose first feature equals this makes the model raise


class PoisonHandler(DemoFraudHandler):
    """The demo model, except that it raises on any batch containing a poison-marked event."""

    def predict(self, inputs: torch.Tensor) -> torch.Tensor:
        if bool((inputs[:, 0] == POISON_MARK).any()):
            raise ValueError("poison feature value in batch")
        return super().predict(inputs)


class SleepyHandler(DemoFraudHandler):
    """Sleeps ``STREAM_TEST_SLEEP_S`` seconds on its first batch (longer than max.poll.interval.ms)."""

    def __init__(self, model_dir: Path | None = None) -> None:
        super().__init__(model_dir)
        self._slept = False

    def _sleep_once(self) -> None:
        if not self._slept:
            self._slept = True
            time.sleep(float(os.environ.get("STREAM_TEST_SLEEP_S", "0")))

    def predict(self, inputs: torch.Tensor) -> torch.Tensor:
        self._sleep_once()
        return super().predict(inputs)


class HangingHandler(DemoFraudHandler):
    """The demo model, except that with ``STREAM_TEST_HANG`` set its first forward pass never returns (an hour):
    a hung device, or a deadlock in a model's own code."""

    def __init__(self, model_dir: Path | None = None) -> None:
        super().__init__(model_dir)
        self._hang = bool(os.environ.get("STREAM_TEST_HANG"))

    def predict(self, inputs: torch.Tensor) -> torch.Tensor:
        if self._hang:
            logging.getLogger(__name__).warning("HangingHandler: this forward pass never returns")
            time.sleep(3600)
        return super().predict(inputs)


class BrokenHandler(SleepyHandler):
    """A broken model: raises on every batch (after sleeping ``STREAM_TEST_SLEEP_S`` seconds on its first)."""

    def predict(self, inputs: torch.Tensor) -> torch.Tensor:
        self._sleep_once()
        raise RuntimeError("this model is broken")


class SlowHandler(DemoFraudHandler):
    """The demo model plus ``STREAM_TEST_BATCH_SLEEP_S`` seconds per batch: a model slower than the input."""

    def __init__(self, model_dir: Path | None = None) -> None:
        super().__init__(model_dir)
        self._sleep_s = float(os.environ.get("STREAM_TEST_BATCH_SLEEP_S", "0.05"))

    def predict(self, inputs: torch.Tensor) -> torch.Tensor:
        time.sleep(self._sleep_s)
        return super().predict(inputs)


def bad_values() -> dict[str, bytes | None]:
    """One input value per dead-letter category (``oversized`` assumes ``--max-input-bytes 4096``)."""
    event = SchemaRegistry.from_dir().by_name(EVENT_SCHEMA)
    good = generate_events(1, seed=1).records()[0]
    framed = encode(event, good)
    return {
        "bad-magic": b"\x05" + framed[1:],
        "unknown-schema": b"\x00\x00\x00\x10\x00" + framed[5:],
        "corrupt-avro": framed[:-9],
        "shape": encode(event, {**good, "features": [0.1] * 7}),
        "incompatible-schema": encode(SchemaRegistry.from_dir().by_name("stream.demo.FraudPrediction"), {
            "event_id": "e", "model_name": "m", "model_version": "v", "fraud_score": 0.5, "is_fraud": False,
            "event_ts_ms": 0, "predicted_ts_ms": 0, "batch_size": 1, "input_topic": "t", "input_partition": 0,
            "input_offset": 0}),
        "non-finite": encode(event, {**good, "features": [float("nan")] * 32}),
        "null-value": None,
        "oversized": framed + b"\x00" * 5000,
        "model-error": encode(event, {**good, "event_id": "poison", "features": [POISON_MARK] + [0.0] * 31}),
    }
