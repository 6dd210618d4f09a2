"""A simulated device behind MiniLM's real host path, for measuring the worker's stages without a GPU.

`SimulatedDevice` is ``--model minilm`` up to the device: the same decoding, tokenizer, length sorting and pass
planning (`MiniLMHandler.prepare`), the same 384-float output encoded and published. Its ``predict`` does no
arithmetic: it sleeps ``ns_per_token`` for every padded token of the batch's passes, without holding the GIL, as a
kernel the host waits for would, and returns zeros. ``ns_per_token`` 0 is the *free model*: what the host path
alone can drain (the host ceiling). The setting comes from ``--model-dir``, a JSON file (``{"ns_per_token": N}``);
the tokenizer and the embedding size come from the installed all-MiniLM-L6-v2 weights, as ``--model minilm``'s do.
``{"ns_per_token": N, "tokenizer": "library"}`` tokenizes every text with the tokenizers library instead of the C
WordPiece (the benchmark's figure for what that saves).

    python -m stream worker ... --model stream.bench.simulated:SimulatedDevice --model-dir sim.json
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from stream.errors import UnrecoverableModelError
from stream.models.demo import DemoFraudHandler
from stream.models.minilm import MiniLMHandler


def write_spec(path: Path, ns_per_token: float, tokenizer: str = "native") -> Path:
    """The ``--model-dir`` file of a simulated device taking ``ns_per_token`` a padded token (0: free);
    ``tokenizer`` "library": the tokenizers library for every text."""
    path.write_text(json.dumps({"ns_per_token": ns_per_token, "tokenizer": tokenizer}))
    return path


class SimulatedDevice(MiniLMHandler):
    """MiniLM's handler with a device that sleeps ``ns_per_token`` a padded token (GIL released) and returns
    zeros."""

    def __init__(self, model_dir: Path | None = None) -> None:
        spec: dict[str, Any] = {}
        ns_per_token = 0.0
        if model_dir is not None:
            try:
                spec = json.loads(Path(model_dir).read_text())
                ns_per_token = float(spec["ns_per_token"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise UnrecoverableModelError(f"simulated device: {model_dir} is not a JSON file with "
                                              f"ns_per_token: {exc}") from exc
            if spec.get("tokenizer", "native") not in ("native", "library"):
                raise UnrecoverableModelError(f"simulated device: {model_dir}: tokenizer is native or library, "
                                              f"not {spec['tokenizer']!r}")
        super().__init__(None, native_tokenizer=spec.get("tokenizer", "native") == "native")
        self.ns_per_token = ns_per_token
        self.name = "simulated-device" if self.ns_per_token > 0 else "free-model"

    def load(self, device: torch.device) -> None:
        super().load(torch.device("cpu"))  # the tokenizer and the output size; the weights stay unused
        self.version = f"{self.ns_per_token:g}ns-per-token"

    def predict(self, inputs: tuple[Any, ...]) -> torch.Tensor:
        _ids, lengths, _inverse, passes = inputs
        if self.ns_per_token > 0:
            time.sleep(self.ns_per_token * 1e-9 * sum((p.stop - p.start) * p.length for p in passes))
        return torch.zeros((len(lengths), self.outputs[0].size), dtype=torch.float32)


class DelayedDemo(DemoFraudHandler):
    """The demo model on a slower simulated device: each batch's forward pass also sleeps (GIL released)
    ``BENCH_SIM_MS_PER_BATCH`` plus ``BENCH_SIM_MS_PER_RECORD`` a record (environment variables, 0 by default).
    The gateway's benchmark uses it to make the worker, not the gateway, the bound in its burst::

        BENCH_SIM_MS_PER_RECORD=2 python -m stream worker ... --model stream.bench.simulated:DelayedDemo
    """

    def __init__(self, model_dir: Path | None = None) -> None:
        super().__init__(model_dir)
        try:
            self.ms_per_batch = float(os.environ.get("BENCH_SIM_MS_PER_BATCH", "0"))
            self.ms_per_record = float(os.environ.get("BENCH_SIM_MS_PER_RECORD", "0"))
        except ValueError as exc:
            raise UnrecoverableModelError(f"simulated device: {exc}") from exc

    def predict(self, inputs: torch.Tensor) -> torch.Tensor:
        time.sleep((self.ms_per_batch + self.ms_per_record * len(inputs)) / 1000.0)
        return super().predict(inputs)
