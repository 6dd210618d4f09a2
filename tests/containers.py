"""The test fixtures' brokers and registry, chosen in one order (docs/development.md):

1. ``KAFKA_BOOTSTRAP_SERVERS`` / ``SCHEMA_REGISTRY_URL``: a cluster and registry of the caller's;
2. ``STREAM_TEST_BROKER=kafka|tansu|container`` forces that broker;
3. Apache Kafka and Apicurio Registry as local processes, where ``java`` and ``mvn`` exist (CI here);
4. the same two as containers with testcontainers, where a container engine answers and Java is missing;
5. else the embedded Tansu broker, and the registry's tests are skipped
   (with ``STREAM_REQUIRE_KAFKA=1``, as in CI, 4 and 5 are failures instead).

The containers are the images docker-compose.yml runs (``apache/kafka``, ``apicurio/apicurio-registry-mem``) at the
versions the local processes run; ``STREAM_TEST_KAFKA_IMAGE`` / ``STREAM_TEST_REGISTRY_IMAGE`` name others of the same
software (`make compose-images` builds them where no registry serves those). On an engine with no bridge network
(``dockerd --bridge=none``) they run on the host's network, each on free ports of 127.0.0.1; where testcontainers'
Ryuk (its reaper of forgotten containers) cannot be pulled it is left off, and the fixtures stop what they start."""

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


def kafka_image(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get("STREAM_TEST_KAFKA_IMAGE") or KAFKA_IMAGE


def registry_image(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get("STREAM_TEST_REGISTRY_IMAGE") or REGISTRY_IMAGE


def kafka_container_env(host_port: int, controller_port: int | None = None) -> dict[str, str]:
    """A single KRaft node: clients on the host reach ``127.0.0.1:<host_port>`` (bound to the container's 9092);
    the broker's own traffic uses a listener inside the container. With ``controller_port``, on the host's network:
    every listener on 127.0.0.1, the controller on that port."""
    if controller_port is not None:
        listeners = {"KAFKA_LISTENERS": f"PLAINTEXT://127.0.0.1:{host_port},CONTROLLER://127.0.0.1:{controller_port}",
                     "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://127.0.0.1:{host_port}",
                     "KAFKA_INTER_BROKER_LISTENER_NAME": "PLAINTEXT",
                     "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                     "KAFKA_CONTROLLER_QUORUM_VOTERS": f"1@127.0.0.1:{controller_port}"}
    else:
        listeners = {"KAFKA_LISTENERS": "PLAINTEXT://:9092,BROKER://:19092,CONTROLLER://:9093",
                     "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://127.0.0.1:{host_port},BROKER://localhost:19092",
                     "KAFKA_INTER_BROKER_LISTENER_NAME": "BROKER",
                     "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP":
                         "PLAINTEXT:PLAINTEXT,BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT",
                     "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093"}
    return {
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        **listeners,
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
    }


def _testcontainers() -> bool:
    """Ready testcontainers for this engine: Ryuk off where its image cannot be had. Whether the engine has a
    bridge network (else the containers go on the host's)."""
    import docker
    from testcontainers.core.config import testcontainers_config

    client = docker.from_env()
    try:
        if not testcontainers_config.ryuk_disabled:
            try:
                client.images.get(testcontainers_config.ryuk_image)
            except docker.errors.ImageNotFound:
                try:
                    client.images.pull(testcontainers_config.ryuk_image)
                except docker.errors.APIError:
                    testcontainers_config.ryuk_disabled = True
        return bool(client.networks.list(names=["bridge"]))
    finally:
        client.close()


def start_kafka_container(timeout_s: float = 120.0) -> Started:
    from testcontainers.core.container import DockerContainer

    from stream.kafka.topics import wait_ready

    port = free_port()
    container = DockerContainer(kafka_image())
    if _testcontainers():
        container = container.with_bind_ports(9092, port).with_envs(**kafka_container_env(port))
    else:
        container = container.with_kwargs(network_mode="host").with_envs(**kafka_container_env(port, free_port()))
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

    container = DockerContainer(registry_image())
    host_port = None if _testcontainers() else free_port()
    if host_port is None:
        container = container.with_exposed_ports(8080)
    else:
        container = container.with_kwargs(network_mode="host").with_envs(QUARKUS_HTTP_HOST="127.0.0.1",
                                                                          QUARKUS_HTTP_PORT=str(host_port))
    container.start()
    started = Started("", container)
    try:
        url = (f"http://{container.get_container_host_ip()}:{container.get_exposed_port(8080)}{REGISTRY_API}"
               if host_port is None else f"http://127.0.0.1:{host_port}{REGISTRY_API}")
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
