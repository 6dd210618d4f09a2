"""The one way jars come from Maven Central (`stream.local.maven`): the pom it writes, a folder resolved once, and
the error when Maven or Java is missing. The downloads themselves run wherever a local broker starts."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from stream.errors import BrokerError
from stream.local import maven

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
    (libs / maven.COMPLETE).write_text("4.3.1\n")
    assert maven.copy_dependencies(libs, tmp_path, maven.pom("r", []), what="Kafka", needs="Apache Kafka needs",
                                   marker="4.3.1") == libs
    assert not (tmp_path / "pom.xml").exists(), "nothing asked of Maven"


def test_the_cache_follows_stream_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAM_CACHE_DIR", str(tmp_path))
    assert maven.cache_dir() == tmp_path
