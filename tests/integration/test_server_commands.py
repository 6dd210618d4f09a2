"""The local server commands (``python -m stream registry``, ``broker``) stopped while they start: SIGTERM ends the
start, stops what it began and exits 0 at once. (As a container's PID 1, a process ignores a signal it has no
handler for: a ``docker stop`` that came before the handler waited out its timeout and was killed, exit 137.)"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stream.local.broker import kafka_available
from stream.local.children import die_with_parent, wait_until_catching
from tests.cluster_cli import gone

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def children_of(pid: int) -> list[int]:
    found = []
    for status in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = status.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(status.parent.name))
    return found


@pytest.mark.parametrize("command", [["registry"], ["broker", "--kind", "kafka", "--nodes", "3"]])
def test_sigterm_while_a_server_starts_ends_the_start_and_exits_zero(command: list[str], tmp_path: Path) -> None:
    if not kafka_available():
        pytest.skip("needs java and mvn")
    with open(tmp_path / "out.log", "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "stream", *command], stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=die_with_parent)
    try:
        wait_until_catching(proc, signal.SIGTERM, time.monotonic() + 60)
        deadline = time.monotonic() + 60
        while not children_of(proc.pid):  # the server's JVM began
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "out.log").read_text()
            time.sleep(0.05)
        servers = children_of(proc.pid)
        assert "pid=" not in (tmp_path / "out.log").read_text(), "started already: not the case under test"
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, (tmp_path / "out.log").read_text()
        assert time.monotonic() - started < 25
        deadline = time.monotonic() + 30
        while not all(gone(pid) for pid in servers):
            assert time.monotonic() < deadline, f"left running: {servers}"
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
