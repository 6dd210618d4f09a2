"""The images deploy/compose/host-network.yml runs where no registry serves apache/kafka, Apicurio's and
Prometheus's: the same software at the same versions, built here from what the project resolves already (Kafka's
jars and Apicurio's runner from Maven Central, Debian's Prometheus package) on a Debian base (the python:3.11-slim
stand-in where nothing can be pulled). ``python -m tests.compose_images`` (``make compose-images``)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from stream.local.broker import KAFKA_VERSION, ensure_kafka_jars
from stream.local.registry_server import REGISTRY_VERSION, ensure_registry_jar
from tests.engine import build, python_image, running_engine
from tests.image import ROOT
from tests.prometheus import ensure_prometheus

COMPOSE = ROOT / "deploy" / "compose"
PROMETHEUS_VERSION = "2.42.0"
KAFKA_IMAGE = f"stream-local/kafka:{KAFKA_VERSION}"
REGISTRY_IMAGE = f"stream-local/apicurio-registry-mem:{REGISTRY_VERSION}"
PROMETHEUS_IMAGE = f"stream-local/prometheus:{PROMETHEUS_VERSION}"


def _build(tag: str, dockerfile_dir: Path, files: dict[str, Path], base: str) -> None:
    """``docker build`` of ``dockerfile_dir``'s Dockerfile and files, with ``files`` (name in the context: a file or
    folder here) beside them."""
    context = Path(tempfile.mkdtemp(prefix="stream-compose-image-"))
    try:
        for item in dockerfile_dir.iterdir():
            shutil.copy2(item, context / item.name)
        for name, source in files.items():
            if source.is_dir():
                shutil.copytree(source, context / name, ignore=shutil.ignore_patterns(".complete", "download"))
            else:
                (context / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, context / name)
        build(context, tag, {"BASE_IMAGE": base})
    finally:
        shutil.rmtree(context, ignore_errors=True)


def build_compose_images() -> list[str]:
    """The three images, tagged as the override names them (the engine in ``DOCKER_HOST``)."""
    base = python_image()
    prometheus = ensure_prometheus()
    _build(KAFKA_IMAGE, COMPOSE / "kafka", {"libs": ensure_kafka_jars()}, base)
    _build(REGISTRY_IMAGE, COMPOSE / "registry", {"apicurio": ensure_registry_jar().parent}, base)
    _build(PROMETHEUS_IMAGE, COMPOSE / "prometheus",
           {"bin/prometheus": prometheus / "prometheus", "bin/promtool": prometheus / "promtool"}, base)
    return [KAFKA_IMAGE, REGISTRY_IMAGE, PROMETHEUS_IMAGE]


if __name__ == "__main__":
    with running_engine():
        for tag in build_compose_images():
            print(tag)
