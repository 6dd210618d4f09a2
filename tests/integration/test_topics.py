"""`python -m stream topics create | list | describe | delete` against the session broker, as a user runs them."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import pytest
from confluent_kafka import Producer

from tests.conftest import BrokerInfo

pytestmark = pytest.mark.integration


def topics(bootstrap: str, *args: str) -> subprocess.CompletedProcess[str]:
    action, rest = args[0], args[1:]
    return subprocess.run([sys.executable, "-m", "stream", "topics", action, "--bootstrap-servers", bootstrap, *rest],
                          capture_output=True, text=True, timeout=120)


def test_topics_are_created_listed_described_with_their_offsets_and_deleted(broker: BrokerInfo) -> None:
    name, other = f"topics-{uuid.uuid4().hex[:8]}", f"topics-{uuid.uuid4().hex[:8]}"
    made = topics(broker.bootstrap, "create", "--partitions", "3", name, other)
    assert made.returncode == 0 and made.stdout.splitlines() == [f"{name}: created", f"{other}: created"], made
    assert topics(broker.bootstrap, "create", name).stdout.strip() == f"{name}: exists"
    producer = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(7):
        producer.produce(name, b"v", partition=i % 3)
    assert producer.flush(30) == 0
    del producer

    listed = topics(broker.bootstrap, "list")
    assert listed.returncode == 0 and f"{name}\tpartitions=3" in listed.stdout.splitlines(), listed
    assert not any(line.startswith("__") for line in listed.stdout.splitlines())
    described = topics(broker.bootstrap, "describe", name)
    assert described.returncode == 0, described
    lines = described.stdout.splitlines()
    assert lines[0] == f"{name}\tpartitions=3"
    rows = [dict(field.split("=", 1) for field in line.split()) for line in lines[1:]]
    assert [r["partition"] for r in rows] == ["0", "1", "2"]
    assert [r["offsets"] for r in rows] == ["0..3", "0..2", "0..2"] and [r["records"] for r in rows] == ["3", "2", "2"]
    assert all(r["leader"] in r["replicas"].split(",") and r["isr"] for r in rows), rows

    gone = topics(broker.bootstrap, "delete", name, other)
    assert gone.returncode == 0, gone
    assert sorted(gone.stdout.splitlines()) == sorted([f"{name}: deleted", f"{other}: deleted"])
    deadline = time.monotonic() + 30  # deletion completes on the brokers after the request is answered
    while any(line.startswith(f"{name}\t") for line in topics(broker.bootstrap, "list").stdout.splitlines()):
        assert time.monotonic() < deadline, f"{name} still listed 30 s after its deletion"
        time.sleep(0.5)
    missing = topics(broker.bootstrap, "describe", name)
    assert missing.returncode == 1 and f"no such topic: {name}" in missing.stderr, missing
    assert topics(broker.bootstrap, "delete", name).returncode == 1
