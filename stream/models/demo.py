"""The demo model: a small tabular fraud-scoring MLP over the 32 event features.

Weights are stored as safetensors plus a small JSON config and loaded without pickle.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load as load_safetensors
from torch import nn

from stream.errors import UnrecoverableModelError
from stream.models.demo_names import EVENT_SCHEMA as EVENT_SCHEMA
from stream.models.demo_names import PREDICTION_SCHEMA as PREDICTION_SCHEMA
from stream.models.demo_names import TEXT_COPY_FIELDS as TEXT_COPY_FIELDS
from stream.models.demo_names import TEXT_EMBEDDING_SCHEMA as TEXT_EMBEDDING_SCHEMA
from stream.models.demo_names import TEXT_EVENT_SCHEMA as TEXT_EVENT_SCHEMA
from stream.models.files import read_model_file
from stream.models.spec import InputSpec, OutputSpec

# The repository's artifacts/ folder (`make model`); an installed package (the image) has none: STREAM_MODEL_DIR.
DEFAULT_MODEL_DIR = Path(os.environ.get("STREAM_MODEL_DIR") or Path(__file__).resolve().parents[2] / "artifacts"
                         / "demo-fraud")
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


class FraudMLP(nn.Module):
    def __init__(self, n_features: int = 32, hidden: tuple[int, ...] = (64, 32)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = n_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            width = h
        layers.append(nn.Linear(width, 1))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.net(x)
        return logits.squeeze(-1)  # (n,)


class DemoFraudHandler:
    """Model handler for FraudMLP: takes ``features`` (float32[n_features]); outputs ``fraud_score``
    (probability) and ``is_fraud``.

    The demo's own schemas are named here, and only here: the worker reads ``stream.demo.FraudEvent`` and writes
    ``stream.demo.FraudPrediction`` from the local schemas folder unless told otherwise."""

    input_schema = EVENT_SCHEMA
    output_schema = PREDICTION_SCHEMA
    copy_fields = (("event_id", "event_id"), ("event_ts_ms", "ts_ms"))  # (prediction field, input field)
    outputs: tuple[OutputSpec, ...] = (OutputSpec("fraud_score", "float"), OutputSpec("is_fraud", "boolean"))

    def __init__(self, model_dir: Path | None = None) -> None:
        self.model_dir = Path(model_dir) if model_dir is not None else DEFAULT_MODEL_DIR
        self.name = "demo-fraud-mlp"
        self.version = "unloaded"
        self.n_features = 32
        self.inputs: tuple[InputSpec, ...] = (InputSpec("features", "float32", (self.n_features,)),)
        self.threshold = 0.5
        self._model: FraudMLP | None = None
        self._pin = False

    def load(self, device: torch.device) -> None:
        config_path = self.model_dir / CONFIG_FILE
        weights_path = self.model_dir / WEIGHTS_FILE
        if not config_path.is_file() or not weights_path.is_file():
            raise UnrecoverableModelError(
                f"demo model not found in {self.model_dir} (needs {CONFIG_FILE} and {WEIGHTS_FILE}); "
                "train it with `python -m stream train-model`"
            )
        config: dict[str, Any] = json.loads(read_model_file(config_path))
        self.name = str(config["name"])
        self.version = str(config["version"])
        self.n_features = int(config["n_features"])
        self.inputs = (InputSpec("features", "float32", (self.n_features,)),)
        self.threshold = float(config.get("threshold", 0.5))
        model = FraudMLP(self.n_features, tuple(config["hidden"]))
        model.load_state_dict(load_safetensors(read_model_file(weights_path)))
        self._model = model.to(device).eval()
        self._pin = device.type == "cuda"

    def collate(self, inputs: Mapping[str, Any], device: torch.device) -> torch.Tensor:
        # On CUDA the engine hands over page-locked memory: the copy runs asynchronously on its copy stream.
        return torch.from_numpy(inputs["features"]).to(device, non_blocking=self._pin)

    def predict(self, inputs: torch.Tensor) -> torch.Tensor:
        assert self._model is not None, "load() first"
        return torch.sigmoid(self._model(inputs))

    def postprocess(self, raw: torch.Tensor) -> dict[str, np.ndarray]:
        scores = raw.float().cpu().numpy()
        return {"fraud_score": scores, "is_fraud": scores >= self.threshold}
