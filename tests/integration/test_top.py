"""``python -m stream top`` in a pseudo-terminal against running workers: its screen (rendered by the terminal
emulator pyte) shows a row per replica with its state and rates, a killed replica turns "down", and Ctrl-C ends
it with exit code 0."""

from __future__ import annotations

import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable

import pyte
import pytest

from stream.local.broker import free_port
from tests.integration.harness import Pipeline, wait_for_assignment

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]
COLUMNS, LINES = 160, 30


class Terminal:
    """A child process on a pseudo-terminal of its own (its controlling terminal: Ctrl-C reaches it as SIGINT)."""

    def __init__(self, command: list[str]) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", LINES, COLUMNS, 0, 0))
        self.screen = pyte.Screen(COLUMNS, LINES)
        self.stream = pyte.ByteStream(self.screen)
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        self.proc = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                                     preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
                                     env={**env, "TERM": "xterm-256color"})
        os.close(slave)

    def read(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            ready, _, _ = select.select([self.master], [], [], left)
            if not ready:
                return
            try:
                data = os.read(self.master, 65536)
            except OSError:  # the child closed the terminal
                return
            if not data:
                return
            self.stream.feed(data)

    def text(self) -> str:
        return "\n".join(self.screen.display)

    def wait_for(self, ok: Callable[[str], bool], timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.read(0.5)
            if ok(self.text()):
                return self.text()
            assert self.proc.poll() is None, self.text()
        raise AssertionError(f"screen after {timeout_s}s:\n{self.text()}")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        os.close(self.master)


def row_of(text: str, replica: str) -> list[str]:
    """The cells of ``replica``'s row (rich draws the table with box characters between them)."""
    line = next((line for line in text.splitlines() if replica in line), "")
    return [cell.strip() for cell in re.split("[│┃]", line)[1:-1]]


def shown(text: str, replica: str) -> bool:
    row = row_of(text, replica)
    return len(row) == 12 and row[1] == "ready" and row[3] not in ("", "-")


def test_top_shows_every_replica_and_ends_on_ctrl_c(pipeline: Pipeline) -> None:
    ports = [free_port(), free_port()]
    workers = [pipeline.worker("--metrics-port", str(p)) for p in ports]
    for worker in workers:
        wait_for_assignment(worker)
    replicas = [f"127.0.0.1:{p}" for p in ports]
    term = Terminal([sys.executable, "-m", "stream", "top", *map(str, ports)])
    try:
        pipeline.produce(20_000, seed=81)
        # Both rows, ready, with their rates once two refreshes have passed.
        text = term.wait_for(lambda t: all(shown(t, r) for r in replicas), 30)
        assert row_of(text, "replica") == ["replica", "state", "model", "in/s", "out/s", "lag", "batch",
                                           "p99 e2e", "binds", "dead letters", "partitions", "mean output"], text
        assert sum(int(row_of(text, r)[-2]) for r in replicas) == 4, text  # the partitions between them
        assert all(row_of(text, r)[2] == "demo-fraud-mlp:1" for r in replicas), text
        workers[1].kill()
        text = term.wait_for(lambda t: row_of(t, replicas[1])[1:2] == ["down: Connection refused"], 15)
        assert row_of(text, replicas[0])[1] == "ready"
        os.write(term.master, b"\x03")
        term.read(1.0)
        assert term.proc.wait(10) == 0, term.text()
        assert "Traceback" not in term.text()
    finally:
        term.close()
