"""Jars from Maven Central into this project's cache (`stream.local.cache`), once: the local Kafka broker's, the
benchmark's JVM contenders' and Apicurio Registry's runner. One way of asking Maven for them (a throwaway pom and
``dependency:copy-dependencies``, or ``dependency:copy`` of one artifact), under the cache's lock, one error naming
what failed; and one way of compiling Java sources against them (`compiled`)."""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

from stream.errors import BrokerError
from stream.local.cache import cache_lock, fill_once, resolved

log = logging.getLogger(__name__)
_TIMEOUT_S = 900


def pom(artifact_id: str, dependencies: Sequence[tuple[str, str, str]]) -> str:
    """A pom of no code whose runtime dependencies are ``(group, artifact, version)``."""
    deps = "\n".join(f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version>"
                     "</dependency>" for g, a, v in dependencies)
    return (f'<project xmlns="http://maven.apache.org/POM/4.0.0">\n  <modelVersion>4.0.0</modelVersion>\n'
            f"  <groupId>local.stream</groupId><artifactId>{artifact_id}</artifactId><version>1</version>\n"
            f"  <dependencies>\n{deps}\n  </dependencies>\n</project>\n")


def _mvn(needs: str) -> str:
    mvn = shutil.which("mvn")
    if mvn is None or shutil.which("java") is None:
        raise BrokerError(f"{needs} `java` (17+) and `mvn` on PATH")
    return mvn


def _run(args: list[str], cwd: Path, what: str) -> None:
    with cache_lock("maven"):  # one Maven at a time: two writing one artifact into ~/.m2 is the cache's race again
        proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        raise BrokerError(f"maven could not resolve {what}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")


def copy_dependencies(libs: Path, pom_dir: Path, pom_xml: str, *, what: str, needs: str, marker: str) -> Path:
    """The runtime dependencies of ``pom_xml`` (with theirs) as jars in ``libs``, resolved once (``marker`` is
    written into the completion file); returns ``libs``. ``needs`` begins the error when Maven or Java is missing
    ("Apache Kafka needs")."""
    if resolved(libs):
        return libs
    mvn = _mvn(needs)

    def fill() -> str:
        pom_dir.mkdir(parents=True, exist_ok=True)
        (pom_dir / "pom.xml").write_text(pom_xml)
        log.info("resolving %s with Maven into %s", what, libs)
        _run([mvn, "-q", "-B", "dependency:copy-dependencies", f"-DoutputDirectory={libs}", "-DincludeScope=runtime"],
             pom_dir, what)
        return marker

    return fill_once(libs, fill)


def copy_artifact(coordinates: str, into: Path, *, what: str, needs: str) -> None:
    """One artifact (``group:artifact:version[:type[:classifier]]``) into ``into``; for a caller's `fill_once`,
    which unpacks it."""
    mvn = _mvn(needs)
    into.mkdir(parents=True, exist_ok=True)
    log.info("fetching %s with Maven into %s", what, into)
    _run([mvn, "-q", "-B", "dependency:copy", f"-Dartifact={coordinates}", f"-DoutputDirectory={into}"], into, what)


def compiled(sources: Iterable[Path], libs: Path, out_parent: Path, prefix: str, *, needs: str) -> Path:
    """``sources`` compiled with ``javac --release 17`` against the jars in ``libs``, once per hash of the sources,
    into ``out_parent/<prefix>-<hash>``; returns that folder. ``needs`` begins the error when ``javac`` is missing
    ("the JVM contenders need")."""
    ordered = sorted(sources)
    digest = hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in ordered)).hexdigest()[:16]
    out = out_parent / f"{prefix}-{digest}"

    def fill() -> str:
        javac = shutil.which("javac")
        if javac is None:
            raise BrokerError(f"{needs} `javac` (a JDK 17+) on PATH")
        proc = subprocess.run([javac, "-d", str(out), "-cp", f"{libs}/*", "--release", "17", *map(str, ordered)],
                              capture_output=True, text=True, timeout=300, check=False)
        if proc.returncode != 0:
            raise BrokerError(f"javac failed:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        return digest

    return fill_once(out, fill)
