"""The one way jars come from Maven Central (`stream.local.maven`): the pom it writes, a folder resolved once, and
the error when Maven or Java is missing; Java sources compiled once per hash (`compiled`); the cache they go into
(`stream.local.cache`), filled once by one process at a time. The downloads themselves run wherever a local broker
starts."""

from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from stream.errors import BrokerError
from stream.local import cache, maven

NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def test_the_pom_lists_each_dependency_once() -> None:
    root = ET.fromstring(maven.pom("x-runtime", [("org.apache.kafka", "kafka-tools", "4.3.1"),
                                                  ("org.slf4j", "slf4j-nop", "2.0.17")]))
    assert root.findtext("m:artifactId", namespaces=NS) == "x-runtime"
    deps = [(d.findtext("m:groupId", namespaces=NS), d.findtext("m:artifactId", namespaces=NS),
             d.findtext("m:version", namespaces=NS)) for d in root.iterfind("m:dependencies/m:dependency", NS)]
    assert deps == [("org.apache.kafka", "kafka-tools", "4.3.1"), ("org.slf4j", "slf4j-nop", "2.0.17")]


def test_a_resolved_folder_is_not_resolved_again_and_a_missing_maven_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(maven.shutil, "which", lambda _name: None)  # no mvn, no java
    libs = tmp_path / "libs"
    with pytest.raises(BrokerError, match=r"^Apache Kafka needs `java` \(17\+\) and `mvn` on PATH"):
        maven.copy_dependencies(libs, tmp_path, maven.pom("r", []), what="Kafka", needs="Apache Kafka needs",
                                marker="4.3.1")
    libs.mkdir()
    (libs / cache.COMPLETE).write_text("4.3.1\n")
    assert maven.copy_dependencies(libs, tmp_path, maven.pom("r", []), what="Kafka", needs="Apache Kafka needs",
                                   marker="4.3.1") == libs
    assert not (tmp_path / "pom.xml").exists(), "nothing asked of Maven"


def test_the_cache_follows_stream_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_CACHE_DIR", str(tmp_path))
    assert cache.cache_dir() == tmp_path


_FILL = """
import sys, time
from pathlib import Path
from stream.local.cache import fill_once
folder, runs = Path(sys.argv[1]), Path(sys.argv[2])
def fill():
    with runs.open("a") as f:
        f.write("fill\\n")
    time.sleep(1.0)  # long enough for the other process to ask meanwhile
    (folder / "payload").write_text("whole")
    return "v1"
fill_once(folder, fill)
assert (folder / "payload").read_text() == "whole", "returned before the folder was filled"
"""


def test_two_processes_asking_for_one_entry_fill_it_once(tmp_path: Path) -> None:
    """`make test`'s two pytest processes on a fresh machine: the second waits for the first's fill (they once
    wrote Kafka's jars into one folder together, and Maven failed in one of them)."""
    import subprocess
    import sys

    folder, runs = tmp_path / "entry", tmp_path / "runs"
    env = {**os.environ, "STREAM_CACHE_DIR": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", _FILL, str(folder), str(runs)], env=env,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    assert runs.read_text() == "fill\n"
    assert cache.resolved(folder) and (folder / cache.COMPLETE).read_text() == "v1\n"


def test_a_failed_fill_leaves_the_entry_incomplete_and_a_fill_may_need_another_entry(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_CACHE_DIR", str(tmp_path))
    outer, inner = tmp_path / "outer", tmp_path / "inner"

    def broken() -> str:
        raise BrokerError("download failed")

    with pytest.raises(BrokerError, match="download failed"):
        cache.fill_once(outer, broken)
    assert not cache.resolved(outer)
    # the lock was given back, and a fill that needs another entry takes it again without waiting on itself
    assert cache.fill_once(outer, lambda: (cache.fill_once(inner, lambda: "i"), "o")[1]) == outer
    assert cache.resolved(inner) and cache.resolved(outer)


def test_sources_compile_once_per_hash_and_javac_s_errors_are_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, libs, out = tmp_path / "src", tmp_path / "libs", tmp_path / "out"
    src.mkdir(), libs.mkdir()
    hello = src / "Hello.java"
    hello.write_text("public class Hello { public static void main(String[] a) { System.out.println(1); } }\n")
    first = maven.compiled([hello], libs, out, "classes", needs="the test needs")
    assert first.parent == out and first.name.startswith("classes-") and (first / "Hello.class").is_file()
    assert cache.resolved(first)
    (first / "Hello.class").unlink()  # a second ask with the same sources finds the entry complete: no javac
    assert maven.compiled([hello], libs, out, "classes", needs="the test needs") == first
    assert not (first / "Hello.class").exists()

    hello.write_text("public class Hello { int x = ; }\n")  # another hash, and javac refuses it
    with pytest.raises(BrokerError, match=r"(?s)^javac failed:.*Hello\.java"):
        maven.compiled([hello], libs, out, "classes", needs="the test needs")
    assert not any(cache.resolved(p) for p in out.iterdir() if p != first)

    monkeypatch.setattr(maven.shutil, "which", lambda _name: None)
    hello.write_text("public class Hello {}\n")
    with pytest.raises(BrokerError, match=r"^the test needs `javac` \(a JDK 17\+\) on PATH"):
        maven.compiled([hello], libs, out, "classes", needs="the test needs")
