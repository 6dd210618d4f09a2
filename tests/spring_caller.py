"""Spring Kafka's ``ReplyingKafkaTemplate`` as a caller of the worker (``tests/spring/ReplyingCaller.java``):
spring-kafka and its dependencies from Maven Central into the cache as the project resolves its other Java
artifacts (`stream.local.maven`), the caller compiled with ``javac`` once per source hash."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from stream.local.broker import SLF4J_VERSION
from stream.local.cache import cache_dir
from stream.local.maven import compiled, copy_dependencies, pom

SPRING_KAFKA_VERSION = "4.1.2"
SOURCES = Path(__file__).resolve().parent / "spring"


def spring_libs() -> Path:
    libs = cache_dir() / f"spring-kafka-{SPRING_KAFKA_VERSION}" / "libs"
    deps = [("org.springframework.kafka", "spring-kafka", SPRING_KAFKA_VERSION),
            ("org.slf4j", "slf4j-nop", SLF4J_VERSION)]
    return copy_dependencies(libs, libs.parent / "pom", pom("spring-replying-caller", deps),
                             what=f"spring-kafka {SPRING_KAFKA_VERSION}", needs="the Spring caller needs",
                             marker=SPRING_KAFKA_VERSION)


def caller_classes() -> Path:
    libs = spring_libs()
    return compiled(SOURCES.glob("*.java"), libs, libs.parent, "classes", needs="the Spring caller needs")


def call(bootstrap: str, input_topic: str, reply_topic: str, requests: list[tuple[bytes | None, bytes]],
         work: Path, *extra: str, reply_timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """Send each (key, value) through a ReplyingKafkaTemplate and wait for its reply; one dict a request, in order
    (``value`` and ``headers`` decoded from base64, or ``error``). Each request waits ``reply_timeout_s`` at most."""
    listing = work / "spring-requests.txt"
    listing.write_text("".join(f"{base64.b64encode(k or b'').decode()} {base64.b64encode(v).decode()}\n"
                               for k, v in requests))
    java = shutil.which("java") or "java"
    classpath = f"{caller_classes()}:{spring_libs()}/*"
    command = [java, "-Xmx256m", "-cp", classpath, "ReplyingCaller", bootstrap, input_topic, reply_topic, str(listing),
               "--timeout-s", str(int(reply_timeout_s)), *extra]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=reply_timeout_s + 60, check=False)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = (exc.stderr or b"").decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        raise AssertionError(f"the Spring caller did not end within {reply_timeout_s + 60:.0f} s:\n{out[-3000:]}"
                             f"{err[-3000:]}") from None
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines or lines[-1].get("done") != len(requests):
        raise AssertionError(f"the Spring caller failed ({proc.returncode}):\n{proc.stdout[-3000:]}"
                             f"{proc.stderr[-3000:]}")
    answers = lines[:-1]
    for a in answers:
        if "value" in a:
            a["value"] = base64.b64decode(a["value"])
            a["headers"] = {k: base64.b64decode(v) for k, v in a["headers"].items()}
            a["sent_correlation"] = base64.b64decode(a["sent_correlation"])
    return answers
