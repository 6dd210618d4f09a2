"""The fixtures' choice of broker and registry (docs/development.md: the caller's, local processes, Tansu) and the
Kafka container's listeners. No container engine runs here: `engine_available` is False, and the containers
themselves are started only where one does."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest
import yaml

from stream.local.broker import free_port
from tests.containers import (
    KAFKA_IMAGE,
    REGISTRY_IMAGE,
    broker_choice,
    engine_available,
    kafka_container_env,
    registry_choice,
)

YES, NO = (lambda: True), (lambda: False)


@pytest.mark.parametrize(("env", "java", "engine", "broker", "registry"), [
    ({"KAFKA_BOOTSTRAP_SERVERS": "k:9092", "SCHEMA_REGISTRY_URL": "http://r"}, True, YES, "external", "external"),
    ({}, True, YES, "kafka", "kafka"),  # java and mvn: local processes even where an engine answers (CI here)
    ({}, False, YES, "container", "container"),
    ({}, False, NO, "tansu", "unavailable"),
    ({"STREAM_REQUIRE_KAFKA": "1"}, False, YES, "unavailable", "unavailable"),
    ({"STREAM_TEST_BROKER": "tansu"}, True, NO, "tansu", "kafka"),
    ({"STREAM_TEST_BROKER": "container"}, True, NO, "container", "kafka"),
])
def test_the_fixture_order(env: dict[str, str], java: bool, engine: object, broker: str, registry: str) -> None:
    assert broker_choice(env, java, engine) == broker  # type: ignore[arg-type]
    assert registry_choice(env, java, engine) == registry  # type: ignore[arg-type]


def test_the_kafka_container_advertises_the_host_port_to_clients() -> None:
    env = kafka_container_env(41234)
    assert "PLAINTEXT://127.0.0.1:41234" in env["KAFKA_ADVERTISED_LISTENERS"]
    listeners = {entry.split("://")[0] for entry in env["KAFKA_LISTENERS"].split(",")}
    assert listeners == {name.split(":")[0] for name in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(",")}
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] in listeners


def test_the_containers_are_the_images_compose_runs() -> None:
    services = yaml.safe_load((Path(__file__).resolve().parents[3] / "docker-compose.yml").read_text())["services"]
    assert services["kafka"]["image"] == KAFKA_IMAGE
    assert services["registry"]["image"] == REGISTRY_IMAGE


def test_an_engine_is_one_that_answers_the_ping(tmp_path: Path) -> None:
    assert engine_available({"DOCKER_HOST": f"unix://{tmp_path}/none.sock"}) is False
    assert engine_available({"DOCKER_HOST": f"tcp://127.0.0.1:{free_port()}"}) is False
    assert engine_available({"DOCKER_HOST": "ssh://somewhere"}) is False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:  # a stand-in engine: answers /_ping
        server.bind(str(tmp_path / "engine.sock"))
        server.listen(1)

        def answer() -> None:
            conn, _ = server.accept()
            with conn:
                conn.recv(1024)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK")

        thread = threading.Thread(target=answer)
        thread.start()
        assert engine_available({"DOCKER_HOST": f"unix://{tmp_path}/engine.sock"}) is True
        thread.join(5)
