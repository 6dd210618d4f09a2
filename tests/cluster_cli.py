"""`python -m stream broker --kind kafka --nodes 3` run as a user runs it, for the tests and the chaos suite: the
command in its own process, its output in files, its nodes found through the status file it writes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from stream.kafka.topics import admin
from stream.local.children import die_with_parent


def wait(condition: Any, timeout_s: float, what: str) -> float:
    """Seconds until ``condition()`` held; AssertionError naming ``what`` after ``timeout_s``."""
    start = time.monotonic()
    while time.monotonic() < start + timeout_s:
        if condition():
            return time.monotonic() - start
        time.sleep(0.2)
    raise AssertionError(f"not within {timeout_s:.0f} s: {what}")


def partition_replicas(bootstrap: str, topic: str) -> dict[int, tuple[int, list[int], list[int]]]:
    """Each partition's leader, replicas and in-sync replicas."""
    md = admin(bootstrap).list_topics(topic, timeout=10)
    return {p: (m.leader, list(m.replicas), list(m.isrs)) for p, m in md.topics[topic].partitions.items()}


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie is gone but for its exit status
    except FileNotFoundError:
        return True


class ClusterCommand:
    """The broker command in its own process, its output in files; `close` leaves nothing running."""

    def __init__(self, tmp: Path, *extra: str) -> None:
        self.out, self.err = tmp / "cluster.out", tmp / "cluster.err"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "stream", "broker", "--kind", "kafka", "--nodes", "3",
                                          *extra], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                         preexec_fn=die_with_parent)
        self.pids: set[int] = set()
        wait(lambda: "status: " in self.out.read_text() or self.proc.poll() is not None, 240,
              "the cluster command printing its status file")
        assert self.proc.poll() is None, self.err.read_text()[-3000:]
        lines = self.out.read_text().splitlines()
        self.bootstrap = lines[0].rsplit("bootstrap=", 1)[1]
        self.status_path = Path(lines[1].split()[1])
        self.status()

    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = json.loads(self.status_path.read_text())
        self.pids |= {n["pid"] for n in status["nodes"] if n["pid"]}
        return status

    def node_pid(self, node_id: int) -> int:
        pid = self.status()["nodes"][node_id - 1]["pid"]
        assert pid, self.status()
        return int(pid)

    def log(self) -> str:
        return self.err.read_text()

    def node_command(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "stream", "broker-node", *args, "--cluster",
                               str(self.status_path)], capture_output=True, text=True, timeout=200)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        for pid in self.pids:  # by PID, only what this command started (it is gone: they are orphans now)
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


