"""The model-handler protocol, built-in handler lookup, device placement and the batched forward pass."""

from __future__ import annotations

import importlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from stream.errors import ConfigError, ModelError, UnrecoverableModelError

log = logging.getLogger(__name__)


@runtime_checkable
class ModelHandler(Protocol):
    """What the worker needs from a model. Implementations must not keep per-batch state."""

    name: str
    version: str
    n_features: int
    output_fields: tuple[str, ...]

    def load(self, device: torch.device) -> None:
        """Load weights onto ``device``; raise UnrecoverableModelError if that is impossible."""

    def collate(self, features: np.ndarray, device: torch.device) -> torch.Tensor:
        """(n, n_features) float32 host array -> the model's input tensor on ``device``."""

    def predict(self, inputs: torch.Tensor) -> torch.Tensor:
        """One forward pass over the whole batch (called under ``torch.inference_mode``)."""

    def outputs(self, raw: torch.Tensor) -> dict[str, np.ndarray]:
        """Raw model output -> one host array per prediction field, each with one row per input."""


def select_device(spec: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; ``cpu`` / ``cuda[:i]`` as given (checked)."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {spec}: CUDA is not available on this machine")
    return device


def create_handler(name: str, model_dir: Path | None) -> ModelHandler:
    """A built-in handler by name (``demo``), or ``package.module:ClassName`` taking ``model_dir``."""
    if name == "demo":
        from stream.models.demo import DemoFraudHandler

        return DemoFraudHandler(model_dir)
    if ":" in name:
        module_name, _, cls_name = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), cls_name)
        except (ImportError, AttributeError) as exc:
            raise ConfigError(f"--model {name}: cannot import {cls_name} from {module_name}: {exc}") from exc
        handler = cls(model_dir)
        if not isinstance(handler, ModelHandler):
            raise ConfigError(f"--model {name}: {cls_name} does not implement the ModelHandler protocol")
        return handler
    raise ConfigError(f"--model {name!r}: unknown model (built-in: demo; or give package.module:ClassName)")


@dataclass(frozen=True)
class BatchResult:
    outputs: dict[str, np.ndarray]
    seconds: float


class InferenceEngine:
    """Runs a handler on a device, one forward pass per micro-batch, and checks its output shape."""

    def __init__(self, handler: ModelHandler, device: torch.device) -> None:
        self.handler = handler
        self.device = device
        try:
            handler.load(device)
        except UnrecoverableModelError:
            raise
        except Exception as exc:
            raise UnrecoverableModelError(f"model {handler.name} cannot load on {device}: {exc}") from exc
        log.info("model %s %s loaded on %s", handler.name, handler.version, device)

    def run(self, features: np.ndarray) -> BatchResult:
        n = len(features)
        started = time.perf_counter()
        try:
            with torch.inference_mode():
                inputs = self.handler.collate(features, self.device)
                raw = self.handler.predict(inputs)
                outputs = self.handler.outputs(raw)
        except UnrecoverableModelError:
            raise
        except torch.cuda.OutOfMemoryError as exc:
            raise ModelError(f"out of device memory on a batch of {n}: {exc}") from exc
        except RuntimeError as exc:
            if "CUDA error" in str(exc) or "device-side assert" in str(exc):
                # The CUDA context is unusable after these: no retry can succeed in this process.
                raise UnrecoverableModelError(f"device failure on {self.device}: {exc}") from exc
            raise ModelError(f"model {self.handler.name} failed on a batch of {n}: {exc}") from exc
        except Exception as exc:
            raise ModelError(f"model {self.handler.name} failed on a batch of {n}: {exc}") from exc
        seconds = time.perf_counter() - started
        for field in self.handler.output_fields:
            column = outputs.get(field)
            if column is None or len(column) != n:
                got = "missing" if column is None else f"{len(column)} rows"
                raise ModelError(f"model {self.handler.name} output {field!r}: expected {n} rows, got {got}")
        return BatchResult(outputs, seconds)
