"""Child processes stopped by PID (`stream.local.children`): SIGTERM only once the child catches it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from stream.local.children import catches, wait_until_catching


def test_catches_reads_whether_a_process_has_a_handler_for_a_signal() -> None:
    previous = signal.signal(signal.SIGUSR1, lambda *_: None)
    try:
        assert catches(os.getpid(), signal.SIGUSR1) is True
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        assert catches(os.getpid(), signal.SIGUSR1) is False
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert catches(2**22 + 12345, signal.SIGTERM) is None  # no such process


def test_waits_until_the_child_catches_sigterm() -> None:
    # A child that installs its SIGTERM handler only after 1.5 s, then exits 0 on SIGTERM.
    code = ("import signal, sys, time; time.sleep(1.5); "
            "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); time.sleep(30)")
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        started = time.monotonic()
        wait_until_catching(proc, signal.SIGTERM, started + 10.0)
        assert time.monotonic() - started >= 1.0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        proc.kill()
        proc.wait()
