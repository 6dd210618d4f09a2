"""The image as operators deploy it (`make image-test`, in CI after `make test`): the Dockerfile built by a real
engine (`tests.engine`: the caller's, or Debian's docker.io started here without bridge or iptables), with the
legacy builder (no BuildKit: the cpu target must build alone with any builder), on the host's network, and its
containers run as the manifests run them: read-only root filesystem, a tmpfs for /tmp, no capabilities, no new
privileges, the image's own user. Against the session's broker on the host: the worker predicts what an
independent reader then finds, answers its probes, and stops on ``docker stop`` with everything committed; the
gateway, ``stream top`` and the embedded broker run from the image too.

Where PyTorch's CPU index cannot be reached (here only PyPI can), the cpu target is built with
``TORCH_CPU_INDEX=`` (PyPI's torch, knowingly); the rest of the build is the one users run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from stream.kafka.topics import create_topics, wait_ready
from stream.local.broker import free_port
from stream.models.demo import EVENT_SCHEMA
from tests.conftest import BrokerInfo
from tests.engine import assert_hardened, build_image, docker
from tests.gateway_cli import events
from tests.image import ROOT
from tests.integration.harness import Pipeline
from tests.probes import get
from tests.verify import committed_offsets, end_offsets

pytestmark = [pytest.mark.image, pytest.mark.timeout(2400)]

# How deploy/k8s runs the container (its securityContext and /tmp emptyDir), as docker run flags.
AS_THE_MANIFESTS_RUN_IT = ["--network", "host", "--read-only", "--tmpfs", "/tmp", "--cap-drop", "ALL",
                           "--security-opt", "no-new-privileges"]


class Containers:
    """Containers of one test, named uniquely, removed at its end whatever happened; their logs kept in tmp_path
    (shown under a failed test)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.names: list[str] = []

    def run(self, image: str, *command: str, detach: bool = True, flags: tuple[str, ...] = ()) -> str:
        name = f"stream-image-test-{uuid.uuid4().hex[:10]}"
        self.names.append(name)
        out = docker("run", *(["-d"] if detach else ["--rm"]), "--name", name, *AS_THE_MANIFESTS_RUN_IT, *flags,
                     image, *command, timeout_s=300)
        return name if detach else out.stdout

    def logs(self, name: str) -> str:
        done = docker("logs", name, check=False, timeout_s=60)
        return done.stdout + done.stderr

    def wait_log(self, name: str, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if text in self.logs(name):
                return
            state = docker("inspect", "-f", "{{.State.Status}}", name, timeout_s=60).stdout.strip()
            assert state == "running", f"{name} is {state}:\n{self.logs(name)[-4000:]}"
            time.sleep(0.5)
        raise AssertionError(f"{name}: no {text!r} within {timeout_s:.0f} s:\n{self.logs(name)[-4000:]}")

    def wait_http(self, name: str, port: int, path: str, status: int, timeout_s: float) -> None:
        """Until 127.0.0.1:``port`` answers ``path`` with ``status``; the container's logs if it stops or time
        runs out."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                got = get(port, path)
            except (urllib.error.URLError, OSError) as exc:
                got = (0, str(exc))
            if got[0] == status:
                return
            state = docker("inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", name, timeout_s=60).stdout
            assert state.startswith("running") and time.monotonic() < deadline, \
                f"{name} ({state.strip()}): {path} on {port} answered {got}:\n{self.logs(name)[-4000:]}"
            time.sleep(0.5)

    def remove_all(self) -> None:
        for name in self.names:
            (self.tmp / f"{name}.log").write_text(self.logs(name))
            docker("rm", "-f", "-v", name, check=False, timeout_s=120)


@pytest.fixture
def containers(engine: str, tmp_path: Path) -> Iterator[Containers]:
    made = Containers(tmp_path)
    yield made
    made.remove_all()


def test_the_worker_predicts_as_its_own_user_on_a_read_only_root_and_stops_with_everything_committed(
        cpu_image: str, containers: Containers, broker: BrokerInfo, unique_name: Callable[[str], str],
        model_dir: Path, tmp_path: Path) -> None:
    line = Pipeline(broker, unique_name, model_dir, tmp_path)
    sent = line.produce(3000, seed=58)
    port = free_port()
    worker_command = ["stream", "worker", "--bootstrap-servers", line.bootstrap, "--input-topic", line.input,
                      "--output-topic", line.output, "--group-id", line.group, "--metrics-port", str(port),
                      "--commit-interval-ms", "200"]
    flags = ("-e", "KAFKA_CONSUMER_SESSION_TIMEOUT_MS=6000")
    worker = containers.run(cpu_image, *worker_command, flags=flags)
    assert_hardened(worker)
    containers.wait_http(worker, port, "/healthz", 200, 120)
    reader = line.reader()
    assert reader.read_until(sent, 120), f"{reader.missing(sent)} of {len(sent)} not predicted:\n" \
                                         f"{containers.logs(worker)[-4000:]}"
    assert reader.duplicates() == 0 and reader.unexpected(sent) == 0
    assert all(0.0 <= float(p.record["fraud_score"]) <= 1.0 for p in reader.predictions)  # type: ignore[arg-type]
    containers.wait_http(worker, port, "/readyz", 200, 60)
    # More events while it runs, then docker stop: it finishes what it holds, commits and exits 0; a second
    # container takes over from the committed offsets, and in the end every event has one prediction.
    more = line.produce(2000, seed=59, start=3000)
    assert docker("stop", "-t", "40", worker, timeout_s=120).returncode == 0
    assert docker("inspect", "-f", "{{.State.ExitCode}}", worker).stdout.strip() == "0", containers.logs(worker)
    logs = containers.logs(worker)
    assert "Permission denied" not in logs and "Read-only file system" not in logs, logs[-4000:]
    assert "shutdown summary:" in logs, logs[-2000:]
    successor = containers.run(cpu_image, *worker_command, flags=flags)
    assert reader.read_until(sent | more, 120), f"{reader.missing(sent | more)} of {len(sent | more)} not " \
                                                f"predicted:\n{containers.logs(successor)[-4000:]}"
    assert reader.duplicates() == 0 and reader.unexpected(sent | more) == 0
    docker("stop", "-t", "40", successor, timeout_s=120)
    assert docker("inspect", "-f", "{{.State.ExitCode}}", successor).stdout.strip() == "0"
    assert line.committed_problems() == [], (committed_offsets(line.bootstrap, line.group, line.input),
                                             end_offsets(line.bootstrap, line.input))
    reader.close()


def test_the_gateway_and_stream_top_run_from_the_image(
        cpu_image: str, containers: Containers, broker: BrokerInfo, unique_name: Callable[[str], str],
        model_dir: Path, tmp_path: Path) -> None:
    line = Pipeline(broker, unique_name, model_dir, tmp_path)
    metrics = free_port()
    worker = containers.run(cpu_image, "stream", "worker", "--bootstrap-servers", line.bootstrap,
                            "--input-topic", line.input, "--output-topic", line.output, "--group-id", line.group,
                            "--metrics-port", str(metrics), flags=("-e", "KAFKA_CONSUMER_SESSION_TIMEOUT_MS=6000"))
    gateway_port = free_port()
    gateway = containers.run(cpu_image, "stream", "gateway", "--bootstrap-servers", line.bootstrap,
                             "--input-topic", line.input, "--port", str(gateway_port), "--input-schema",
                             EVENT_SCHEMA)
    containers.wait_http(worker, metrics, "/readyz", 200, 120)
    containers.wait_http(gateway, gateway_port, "/readyz", 200, 120)
    assert_hardened(gateway)
    asked = events(5, seed=60)
    with httpx.Client(base_url=f"http://127.0.0.1:{gateway_port}", timeout=30) as http:
        for event in asked:
            answer = http.post("/v1/predict", json=event)
            assert answer.status_code == 200, answer.text
            assert answer.json()["event_id"] == event["event_id"]
            assert 0.0 <= answer.json()["fraud_score"] <= 1.0
    table = containers.run(cpu_image, "stream", "top", "--once", f"127.0.0.1:{metrics}", detach=False,
                           flags=("-e", "COLUMNS=200"))
    [row] = [r for r in table.splitlines() if f"127.0.0.1:{metrics}" in r]
    assert "ready" in row and "demo-fraud-mlp" in row, table
    for name in (gateway, worker):
        docker("stop", "-t", "40", name, timeout_s=120)
        assert docker("inspect", "-f", "{{.State.ExitCode}}", name).stdout.strip() == "0", containers.logs(name)


def test_the_embedded_broker_runs_from_the_image_on_a_read_only_root(cpu_image: str, containers: Containers) -> None:
    port = free_port()
    broker = containers.run(cpu_image, "stream", "broker", "--kind", "tansu", "--port", str(port))
    deadline = time.monotonic() + 60
    while True:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                break
        assert time.monotonic() < deadline, containers.logs(broker)[-3000:]
        time.sleep(0.2)
    wait_ready(f"127.0.0.1:{port}", 30)
    assert_hardened(broker)  # the broker's process too: the image's user, no capability
    assert create_topics(f"127.0.0.1:{port}", ["image-test"], 2) == {"image-test": "created"}
    docker("stop", "-t", "20", broker, timeout_s=60)
    code = docker("inspect", "-f", "{{.State.ExitCode}}", broker).stdout.strip()
    assert code == "0", containers.logs(broker)[-3000:]


def test_the_image_is_what_the_dockerfile_says(cpu_image: str) -> None:
    config = json.loads(docker("image", "inspect", cpu_image).stdout)[0]["Config"]
    assert config["User"] == "10001:10001"
    assert config["Entrypoint"] == ["python", "-m"] and config["Cmd"] == ["stream", "worker"]
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["HOME"] == "/tmp" and env["STREAM_MODEL_DIR"] == "/app/artifacts/demo-fraud"


def test_the_cuda_target_builds_without_a_gpu(engine: str, containers: Containers) -> None:
    """The cuda target needs no GPU to build: torch's CUDA build, the same wheel and model; its worker starts on
    the CPU where there is no GPU (a container without --gpus)."""
    if os.environ.get("STREAM_TEST_IMAGE_CUDA", "1") == "0":
        pytest.skip("STREAM_TEST_IMAGE_CUDA=0")
    tag = "stream-inference:0.1.0-cuda"
    build_image("cuda", tag, ROOT)
    probe = containers.run(tag, "stream", "--help", detach=False)
    assert "worker" in probe
    cuda = subprocess.run(["docker", "run", "--rm", *AS_THE_MANIFESTS_RUN_IT, "--entrypoint", "python", tag, "-c",
                           "import torch; print(torch.version.cuda)"], capture_output=True, text=True, timeout=300,
                          check=True).stdout.strip()
    assert cuda not in ("", "None"), "the cuda target's torch is not the CUDA build"
