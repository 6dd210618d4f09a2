"""Test-only model handlers, loadable by worker processes as ``--model tests.handlers:Name``."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import torch

from stream.models.demo import DemoFraudHandler

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

    def predict(self, inputs: torch.Tensor) -> torch.Tensor:
        if not self._slept:
            self._slept = True
            time.sleep(float(os.environ.get("STREAM_TEST_SLEEP_S", "0")))
        return super().predict(inputs)


def poison_features(n: int) -> np.ndarray:
    x = np.zeros((n, 32), dtype=np.float32)
    x[:, 0] = POISON_MARK
    return x
