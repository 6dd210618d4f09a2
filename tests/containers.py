"""The test fixtures' brokers and registry, chosen in one order (README, "Development and tests"):

1. ``KAFKA_BOOTSTRAP_SERVERS`` / ``SCHEMA_REGISTRY_URL``: a cluster and registry of the caller's;
2. ``STREAM_TEST_BROKER=kafka|tansu|container`` forces that broker;
3. Apache Kafka and Apicurio Registry as local processes, where ``java`` and ``mvn`` exist (CI here);
4. the same two as containers with testcontainers, where a container engine answers and Java is missing;
5. else the embedded Tansu broker, and the registry's tests are skipped
   (with ``STREAM_REQUIRE_KAFKA=1``, as in CI, 4 and 5 are failures instead).

The containers are the images docker-compose.yml runs (``apache/kafka``, ``apicurio/apicurio-registry-mem``) at the
versions the local processes run."""

from __future__ import annotations

import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from stream.local.broker import KAFKA_VERSION, free_port
from stream.local.registry_server import REGISTRY_API, REGISTRY_VERSION

Choice = Literal["external", "kafka", "tansu", "container", "unavailable"]
KAFKA_IMAGE = f"apache/kafka:{KAFKA_VERSION}"
REGISTRY_IMAGE = f"apicurio/apicurio-registry-mem:{REGISTRY_VERSION}"


def engine_available(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether a container engine answers the Docker API's ``/_ping`` where testcontainers would look
    (``DOCKER_HOST``: ``unix://`` or ``tcp://``; else the default socket)."""
    host = environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    try:
        if host.startswith("unix://"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(3)
            address: Any = host[len("unix://"):]
        elif host.startswith("tcp://"):
            name, _, port = host[len("tcp://"):].rstrip("/").rpartition(":")
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.settimeout(3)
            address = (name, int(port))
        else:
            return False
        with sock:
            sock.connect(address)
            sock.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            return sock.recv(64).startswith((b"HTTP/1.0 200", b"HTTP/1.1 200"))
    except (OSError, ValueError):
        return False


def broker_choice(environ: Mapping[str, str], java: bool, engine: Callable[[], bool]) -> Choice:
    """Which broker the session fixture starts (see the module's docstring)."""
    if environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        return "external"
    forced = environ.get("STREAM_TEST_BROKER", "auto")
    if forced in ("kafka", "tansu", "container"):
        return forced  # type: ignore[return-value]
    if java:
        return "kafka"
    if environ.get("STREAM_REQUIRE_KAFKA") == "1":
        return "unavailable"
    return "container" if engine() else "tansu"


def registry_choice(environ: Mapping[str, str], java: bool, engine: Callable[[], bool]) -> Choice:
    if environ.get("SCHEMA_REGISTRY_URL"):
        return "external"
    if java:
        return "kafka"  # Apicurio as a local process, beside the local Kafka
    if environ.get("STREAM_REQUIRE_KAFKA") == "1":
        return "unavailable"
    return "container" if engine() else "unavailable"


@dataclass
class Started:
    """A started container: its address for clients, and how to stop it."""

    address: str
    container: Any

    def stop(self) -> None:
        self.container.stop()


def kafka_container_env(host_port: int) -> dict[str, str]:
    """A single KRaft node: clients on the host reach ``127.0.0.1:<host_port>`` (bound to the container's 9092);
    the broker's own traffic uses a listener inside the container."""
    return {
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": "PLAINTEXT://:9092,BROKER://:19092,CONTROLLER://:9093",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://127.0.0.1:{host_port},BROKER://localhost:19092",
        "KAFKA_INTER_BROKER_LISTENER_NAME": "BROKER",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "PLAINTEXT:PLAINTEXT,BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
    }


def start_kafka_container(timeout_s: float = 120.0) -> Started:
    from testcontainers.core.container import DockerContainer

    from stream.kafka.topics import wait_ready

    port = free_port()
    container = DockerContainer(KAFKA_IMAGE).with_bind_ports(9092, port).with_envs(**kafka_container_env(port))
    container.start()
    started = Started(f"127.0.0.1:{port}", container)
    try:
        wait_ready(started.address, timeout_s)
    except BaseException:
        started.stop()
        raise
    return started


def start_registry_container(timeout_s: float = 120.0) -> Started:
    from testcontainers.core.container import DockerContainer

    container = DockerContainer(REGISTRY_IMAGE).with_exposed_ports(8080)
    container.start()
    started = Started("", container)
    try:
        url = f"http://{container.get_container_host_ip()}:{container.get_exposed_port(8080)}{REGISTRY_API}"
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{url}/subjects", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the registry container did not answer at {url} within {timeout_s}s") from None
                time.sleep(0.5)
        started.address = url
    except BaseException:
        started.stop()
        raise
    return started
