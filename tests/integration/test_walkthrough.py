"""The README's walkthrough ("One event by hand"), its commands read from the README and run as a user runs them:
on the embedded broker, free ports in place of 9092 and 8080, the long-running ones in the background. So the
README cannot drift from what works."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import torch

from stream.local.broker import free_port
from stream.models.demo import DemoFraudHandler

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- walkthrough -->"
LONG_RUNNING = ("python -m stream broker", "python -m stream worker", "python -m stream gateway")


def walkthrough() -> list[str]:
    """The commands of the README's walkthrough block, continuation lines joined."""
    text = (ROOT / "README.md").read_text()
    assert MARK in text, "the README lost its walkthrough"
    block = text.split(MARK, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]


def test_the_readme_s_commands_serve_one_event_from_broker_to_prediction(tmp_path: Path) -> None:
    commands = walkthrough()
    assert [c.split()[3] if c.startswith("python -m stream") else c.split()[0] for c in commands] == [
        "train-model", "broker", "topics", "worker", "gateway", "curl", "read"]
    kafka, http = free_port(), free_port()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "STREAM_MODEL_DIR": str(tmp_path / "artifacts" / "demo-fraud"),
           # Tansu answers a new group's first join after about half the session timeout (45 s by default)
           "KAFKA_CONSUMER_SESSION_TIMEOUT_MS": "6000"}
    background: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(command: str, name: str, ready: Callable[[str], bool]) -> None:
        log = tmp_path / f"{name}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(["bash", "-c", f"exec {command}"], stdout=out, stderr=subprocess.STDOUT,
                                    env=env, cwd=tmp_path, start_new_session=True)
        background.append((proc, log))
        deadline = time.monotonic() + 120
        while not ready(log.read_text(errors="replace")):
            assert proc.poll() is None, f"{name} exited {proc.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"{name} not ready within 120 s:\n{log.read_text()[-3000:]}"
            time.sleep(0.2)

    def gateway_ready(_: str) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{http}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    outputs = {}
    try:
        for command in commands:
            command = command.replace("9092", str(kafka)).replace("localhost:8080", f"127.0.0.1:{http}") \
                .replace("--port 8080", f"--port {http}")
            name = command.split()[3] if command.startswith("python -m stream") else command.split()[0]
            if command.startswith(LONG_RUNNING):
                start(command, name, {"broker": lambda log: f"bootstrap=127.0.0.1:{kafka}" in log,
                                      "worker": lambda log: " assigned " in log,
                                      "gateway": gateway_ready}[name])
                continue
            done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, cwd=tmp_path,
                                  timeout=180)
            assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
            outputs[name] = done.stdout
    finally:
        for proc, _ in reversed(background):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc, _log in reversed(background):
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    for proc, log in background:
        assert proc.returncode == 0, f"{proc.args} exited {proc.returncode}:\n{log.read_text()[-3000:]}"

    answer = json.loads(outputs["curl"])
    handler = DemoFraudHandler(Path(env["STREAM_MODEL_DIR"]))  # the model the walkthrough trained, run directly
    handler.load(torch.device("cpu"))
    with torch.inference_mode():
        expected = float(handler.predict(torch.full((1, 32), 0.5)).numpy()[0])
    assert answer["event_id"] == "ev-1" and answer["fraud_score"] == pytest.approx(expected, abs=1e-6), answer
    [line] = [json.loads(x) for x in outputs["read"].splitlines()]
    assert line["value"] == answer and line["key"] == "acct-7" and line["topic"] == "predictions", line
