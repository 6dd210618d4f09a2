"""`python -m stream gateway` as the tests and the gateway benchmark run it: a child process on a free port,
waited for until ready, and callers that send events and check what comes back."""

from __future__ import annotations

import ssl
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch

from producers.events import generate_events
from stream.local.broker import free_port
from stream.local.children import WorkerProcess
from stream.models.demo import EVENT_SCHEMA, DemoFraudHandler


class Gateway:
    """A gateway process on a free port of 127.0.0.1."""

    def __init__(self, bootstrap: str, input_topic: str, log: Path, *extra: str,
                 env: dict[str, str] | None = None, input_schema: str | None = EVENT_SCHEMA,
                 api_key: str | None = None, ca: Path | None = None) -> None:
        """``input_schema`` None: none given, the default (as the worker's); ``api_key``: the one this helper
        sends; ``ca``: the certificate its HTTPS (``--ssl-certfile``) is checked against."""
        self.port = free_port()
        self.url = f"{'https' if ca else 'http'}://127.0.0.1:{self.port}"
        self.verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=str(ca)) if ca else True
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        schema = ["--input-schema", input_schema] if input_schema else []
        self.process = WorkerProcess(
            ["--bootstrap-servers", bootstrap, "--input-topic", input_topic, "--port", str(self.port), *schema,
             *extra], log, env, command="gateway")

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        self._wait_for_200("/readyz", "ready", timeout_s)

    def wait_alive(self, timeout_s: float = 60.0) -> None:
        """Until it answers its liveness probe (it does from its start, before it is ready)."""
        self._wait_for_200("/healthz", "alive", timeout_s)

    def _wait_for_200(self, path: str, what: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.proc.poll() is None, self.process.output()[-3000:]
            try:
                if httpx.get(f"{self.url}{path}", timeout=1, verify=self.verify).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"gateway not {what} within {timeout_s}s:\n{self.process.output()[-3000:]}")

    def metric(self, name: str, labels: str = "") -> float:
        """A sample of its /metrics (0 when absent)."""
        text = httpx.get(f"{self.url}/metrics", timeout=5, verify=self.verify, headers=self.headers).text
        for line in text.splitlines():
            if line.startswith(f"{name}{labels} ") or (not labels and line.startswith(f"{name} ")):
                return float(line.split()[-1])
        return 0.0

    def stop(self) -> int:
        return self.process.terminate()


def events(count: int, seed: int, start: int = 0) -> list[dict[str, Any]]:
    """Demo events as JSON objects (features as floats, ts_ms the time of the call)."""
    block = generate_events(count, seed=seed, start=start)
    now = int(time.time() * 1000)
    return [{"event_id": e, "key": k, "ts_ms": now, "features": [float(x) for x in f]}
            for e, k, f in zip(block.event_ids, block.keys, block.features, strict=True)]


def expected_scores(model_dir: Path, sent: list[dict[str, Any]]) -> dict[str, float]:
    """The model run directly on the events: event id -> fraud score."""
    handler = DemoFraudHandler(model_dir)
    handler.load(torch.device("cpu"))
    x = torch.tensor(np.array([e["features"] for e in sent], dtype=np.float32))
    with torch.inference_mode():
        scores = handler.predict(x).numpy()
    return {e["event_id"]: float(s) for e, s in zip(sent, scores, strict=True)}
