"""The compose stack started by a real engine (`make image-test`): docker-compose.yml as users have it, with
deploy/compose/host-network.yml over it for this machine (no registry, no bridge networks: the host's network and
locally built images of the same Kafka, Apicurio Registry and Prometheus). Two worker replicas share the input's
partitions, the stack's own producer sends events, an independent reader finds one prediction for each, Prometheus
scrapes both replicas, and ``down`` leaves nothing behind."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from producers.events import generate_events
from stream.kafka.topics import admin
from tests.compose_images import build_compose_images
from tests.engine import assert_hardened, compose_command, docker
from tests.image import ROOT
from tests.verify import OutputReader

pytestmark = [pytest.mark.image, pytest.mark.timeout(1800)]

PROJECT = "stream-compose-test"
FILES = ["-f", str(ROOT / "docker-compose.yml"), "-f", str(ROOT / "deploy" / "compose" / "host-network.yml")]
PORTS = {"Kafka": 9092, "Kafka's controller": 9093, "the registry": 8080, "Prometheus": 9090,
         **{f"a worker's metrics ({p})": p for p in range(9100, 9108)}}
BOOTSTRAP = "127.0.0.1:9092"
EVENTS = 5000
SEED = 7


def compose(*args: str, timeout_s: float = 600, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*compose_command(), "-p", PROJECT, *FILES, *args], capture_output=True, text=True,
                          timeout=timeout_s, check=False, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker compose {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-3000:]}"
                             f"{proc.stderr[-3000:]}\n{logs()}")
    return proc


def logs() -> str:
    done = subprocess.run([*compose_command(), "-p", PROJECT, *FILES, "logs", "--no-color", "--tail", "40"],
                          capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)
    return done.stdout[-8000:] + done.stderr[-2000:]


def left_behind() -> list[str]:
    label = f"label=com.docker.compose.project={PROJECT}"
    containers = docker("ps", "-a", "-q", "--filter", label).stdout.split()
    volumes = docker("volume", "ls", "-q", "--filter", label).stdout.split()
    return [f"container {c}" for c in containers] + [f"volume {v}" for v in volumes]


def prometheus(query: str) -> list[dict[str, object]]:
    url = "http://127.0.0.1:9090/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as reply:
        return list(json.load(reply)["data"]["result"])


def wait(condition: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f} s: {what}\n{logs()}"
        time.sleep(1)


@pytest.fixture
def stack(cpu_image: str, tmp_path: Path) -> Iterator[None]:
    build_compose_images()
    busy = []
    for what, port in PORTS.items():
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                busy.append(f"{what}: 127.0.0.1:{port}")
    assert not busy, f"the override's ports are taken on this machine: {busy}"
    try:
        yield
    finally:
        (tmp_path / "compose.log").write_text(logs())
        compose("down", "--volumes", "--remove-orphans", "--timeout", "60", check=False)


def test_the_stack_predicts_with_two_replicas_prometheus_scrapes_both_and_down_leaves_nothing(stack: None) -> None:
    compose("up", "-d", "--no-build", "--scale", "worker=2", "kafka", "registry", "topics", "worker", "prometheus")
    workers = compose("ps", "-q", "worker").stdout.split()
    assert len(workers) == 2, workers

    def healthy() -> bool:
        states = [docker("inspect", "-f", "{{.State.Health.Status}}", w).stdout.strip() for w in workers]
        assert "unhealthy" not in states, states
        return states == ["healthy", "healthy"]

    wait(healthy, 240, "both workers healthy (their health checks probe their own replica's port)")
    for w in workers:  # as the manifests run them (docker-compose.yml's x-hardened), as the kernel sees it
        assert_hardened(w)
    # The stack's own producer, told to send a few thousand events instead of a million.
    compose("run", "--rm", "--no-deps", "producer", "producers", "--bootstrap-servers", BOOTSTRAP, "--topic",
            "events", "--count", str(EVENTS), "--seed", str(SEED), timeout_s=300)
    sent = set(generate_events(EVENTS, seed=SEED).event_ids)
    reader = OutputReader(BOOTSTRAP, "predictions")
    assert reader.read_until(sent, 180), f"{reader.missing(sent)} of {EVENTS} not predicted\n{logs()}"
    assert reader.duplicates() == 0 and reader.unexpected(sent) == 0
    reader.close()
    # The two replicas share the input's eight partitions.
    client = admin(BOOTSTRAP)  # kept: its futures fail once it is gone
    [group] = client.describe_consumer_groups(["inference"]).values()
    members = group.result(timeout=30).members
    shares = [sorted(tp.partition for tp in m.assignment.topic_partitions if tp.topic == "events") for m in members]
    assert len(shares) == 2 and all(shares) and sorted(p for s in shares for p in s) == list(range(8)), shares
    # Prometheus scrapes both: `up` is 1 for exactly two of the range's ports, and each has predicted something.
    def scraped() -> tuple[set[str], set[str]]:
        up = {str(r["metric"]["instance"]) for r in prometheus('up{job="stream"} == 1')}  # type: ignore[index]
        predicted = {str(r["metric"]["instance"])  # type: ignore[index]
                     for r in prometheus('stream_predictions_total{job="stream"} > 0')}
        return up, predicted

    wait(lambda: len(scraped()[0]) == 2 and scraped()[0] == scraped()[1], 60,
         "Prometheus: up == 1 for two targets, each with predictions")

    compose("down", "--volumes", "--remove-orphans", "--timeout", "60")
    assert left_behind() == []
