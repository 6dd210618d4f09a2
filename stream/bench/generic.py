"""The benchmark's second layout: a record that is not the demo's (a dozen named scalars of five types, a string
id, a string and a nullable long), a model over the scalars, and the copied id and nullable long on every
prediction. Its drain stands beside the demo's so that the field plans are measured on a layout they were not
shaped around.

``python -m stream worker --model stream.bench.generic:ReadingHandler --schemas-dir DIR --input-schema
bench.generic.Reading --copy-fields reading_id,site`` with ``DIR`` from `write_schemas`.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from confluent_kafka import Producer
from fastavro import parse_schema, schemaless_writer

from stream.codec.columns import normalize, reader_columns
from stream.codec.encoder import derive_schema
from stream.models import InputSpec, OutputSpec

SCALARS = [("temp", "double"), ("humidity", "double"), ("pressure", "double"), ("wind", "double"),
           ("volt", "float"), ("amp", "float"), ("load", "float"), ("count", "long"), ("uptime_s", "long"),
           ("errors", "long"), ("channel", "int"), ("alarm", "boolean")]
READING = {"type": "record", "name": "Reading", "namespace": "bench.generic", "fields": [
    {"name": "reading_id", "type": "string"},
    *({"name": name, "type": kind} for name, kind in SCALARS),
    {"name": "device", "type": "string"},
    {"name": "site", "type": ["null", "long"], "default": None},
]}
READING_ID = 101
PREDICTION_ID = 102
COPIES = "reading_id,site"


class ReadingHandler:
    """A small MLP (12 -> 64 -> 1, fixed random weights) over the reading's scalars; outputs ``score``."""

    inputs = tuple(InputSpec(name, "float32") for name, _ in SCALARS)
    outputs = (OutputSpec("score", "float"),)

    def __init__(self, model_dir: Path | None = None) -> None:
        self.name = "bench-readings"
        self.version = "random-7"
        self._model: torch.nn.Module | None = None

    def load(self, device: torch.device) -> None:
        torch.manual_seed(7)
        self._model = torch.nn.Sequential(torch.nn.Linear(len(SCALARS), 64), torch.nn.ReLU(),
                                          torch.nn.Linear(64, 1)).to(device).eval()

    def collate(self, inputs: Mapping[str, Any], device: torch.device) -> torch.Tensor:
        matrix = np.stack([inputs[name] for name, _ in SCALARS], axis=1)
        return torch.from_numpy(matrix).to(device)

    def predict(self, inputs: torch.Tensor) -> torch.Tensor:
        assert self._model is not None
        return torch.sigmoid(self._model(inputs)).squeeze(-1)

    def postprocess(self, raw: torch.Tensor) -> dict[str, np.ndarray]:
        return {"score": raw.float().cpu().numpy()}


def write_schemas(folder: Path) -> Path:
    """A schema folder holding the reading (id 101) and its derived prediction schema (id 102)."""
    folder.mkdir(parents=True, exist_ok=True)
    columns, _ = reader_columns(normalize(READING))
    by_path = {c.path: c for c in columns}
    handler = ReadingHandler()
    prediction = derive_schema(f"{handler.name}_prediction", "stream.predictions",
                               [(name, by_path[name]) for name in COPIES.split(",")], handler.outputs)
    (folder / "reading.avsc").write_text(json.dumps(READING, indent=1))
    (folder / "reading_prediction.avsc").write_text(json.dumps(prediction, indent=1))
    (folder / "registry.json").write_text(json.dumps({"schemas": {str(READING_ID): "reading.avsc",
                                                                  str(PREDICTION_ID): "reading_prediction.avsc"}}))
    return folder


def readings(count: int, seed: int, start: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    columns: dict[str, list[Any]] = {}
    for name, kind in SCALARS:
        if kind == "double":
            columns[name] = rng.normal(20, 5, count).tolist()
        elif kind == "float":
            columns[name] = rng.normal(1, 0.2, count).astype(np.float32).tolist()
        elif kind == "boolean":
            columns[name] = (rng.random(count) < 0.01).tolist()
        else:
            columns[name] = rng.integers(0, 2**20 if kind == "int" else 2**40, count).tolist()
    sites = rng.integers(0, 500, count)
    out = []
    for i in range(count):
        record = {name: col[i] for name, col in columns.items()}
        record["reading_id"] = f"r-{start + i}"
        record["device"] = f"dev-{int(sites[i]) % 97:03d}"
        record["site"] = None if sites[i] < 50 else int(sites[i])
        out.append(record)
    return out


def produce_readings(bootstrap: str, topic: str, count: int, seed: int = 2026, chunk: int = 100_000) -> int:
    """``count`` readings framed with id 101, produced to ``topic``; returns how many were acknowledged."""
    parsed = parse_schema(READING)
    header = b"\x00" + READING_ID.to_bytes(4, "big")
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10_000,
                         "compression.type": "lz4", "queue.buffering.max.messages": 2_000_000})
    acked = [0]

    def delivered(err: Any, _msg: Any) -> None:
        if err is None:
            acked[0] += 1

    for base in range(0, count, chunk):
        for record in readings(min(chunk, count - base), seed + base, base):
            buf = io.BytesIO()
            buf.write(header)
            schemaless_writer(buf, parsed, record)
            while True:
                try:
                    producer.produce(topic, buf.getvalue(), on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.05)
            producer.poll(0)
    producer.flush(120)
    return acked[0]
