"""A local schema registry: Apicurio Registry (Apache-2.0), its runner from Maven Central, in-memory storage,
serving the Confluent-compatible API. On 127.0.0.1, stopped by PID, like the brokers (`stream.local.broker`)."""

from __future__ import annotations

import logging
import shutil
import subprocess
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from stream.errors import BrokerError
from stream.local.broker import LocalProcess, free_port
from stream.local.cache import cache_dir, fill_once
from stream.local.children import die_with_parent
from stream.local.maven import copy_artifact

log = logging.getLogger(__name__)
REGISTRY_VERSION = "2.6.13.Final"  # Apicurio Registry, Apache-2.0; its 2.x runner needs Java 11+
REGISTRY_API = "/apis/ccompat/v7"  # Apicurio's Confluent-compatible API


def registry_home() -> Path:
    return cache_dir() / f"apicurio-registry-{REGISTRY_VERSION}"


def ensure_registry_jar() -> Path:
    """Fetch Apicurio Registry's runner (``io.apicurio:apicurio-registry-app:<version>:tar.gz:all``) from Maven
    Central into the cache and unpack it (once); returns the runner jar."""
    home = registry_home()
    jar = home / f"apicurio-registry-app-{REGISTRY_VERSION}-runner.jar"

    def fill() -> str:
        download = home / "download"
        copy_artifact(f"io.apicurio:apicurio-registry-app:{REGISTRY_VERSION}:tar.gz:all", download,
                      what=f"Apicurio Registry {REGISTRY_VERSION}", needs="the local schema registry needs")
        archive = download / f"apicurio-registry-app-{REGISTRY_VERSION}-all.tar.gz"
        if not archive.is_file():
            raise BrokerError(f"maven fetched no {archive.name}")
        with tarfile.open(archive) as tar:
            tar.extractall(home, filter="data")
        archive.unlink()
        if not jar.is_file():
            raise BrokerError(f"{archive.name} holds no {jar.name}")
        return REGISTRY_VERSION

    fill_once(home, fill)
    return jar


class LocalRegistry(LocalProcess):
    """A running Apicurio Registry (in-memory storage); ``url`` is its Confluent-compatible API."""

    def __init__(self, port: int, proc: subprocess.Popen[bytes], workdir: Path) -> None:
        super().__init__(port, proc, workdir)
        self.url = f"http://127.0.0.1:{port}{REGISTRY_API}"


def start_registry(port: int | None = None, *, timeout_s: float = 90.0, heap_mib: int = 384) -> LocalRegistry:
    """Apicurio Registry on 127.0.0.1 (in-memory: its schemas live as long as the process), ready when its
    Confluent-compatible API answers."""
    jar = ensure_registry_jar()
    port = port or free_port()
    workdir = Path(tempfile.mkdtemp(prefix="stream-registry-"))
    log_file = workdir / "registry.log"
    java = shutil.which("java") or "java"
    with open(log_file, "wb") as out:
        proc = subprocess.Popen(
            [java, "-Xms64m", f"-Xmx{heap_mib}m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
             f"-Dquarkus.http.port={port}", "-Dquarkus.http.host=127.0.0.1", "-Dquarkus.log.level=WARN",
             f"-Djava.io.tmpdir={workdir}", "-jar", str(jar)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir,
            preexec_fn=die_with_parent)
    registry = LocalRegistry(port, proc, workdir)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                tail = log_file.read_text(errors="replace")[-3000:]
                raise BrokerError(f"the schema registry exited with code {proc.returncode} during start-up:\n{tail}")
            try:
                with urllib.request.urlopen(f"{registry.url}/subjects", timeout=2) as reply:
                    if reply.status == 200:
                        return registry
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise BrokerError(f"the schema registry did not answer on {registry.url} within {timeout_s:.0f}s "
                                  f"(log: {log_file})")
            time.sleep(0.2)
    except BaseException as exc:
        registry.fail_start(exc)
        raise
