"""Child processes (worker processes for the demo, the tests, the chaos suite and the benchmark; brokers):
started, signalled and reaped by PID; they die with their parent (`die_with_parent`)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_SUMMARY = re.compile(
    r"worker summary: consumed=(\d+) predicted=(\d+) dead_lettered=(\d+) committed=(\d+) batches=(\d+)")


def die_with_parent() -> None:
    """Child-side (preexec): get SIGTERM when the parent dies, so a killed test run leaves nothing behind."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class StopSignals:
    """SIGTERM and SIGINT handled from the moment this is made, for a command that starts a server and then waits:
    one that arrives while the server starts ends the start (``SystemExit(0)``, through the start's own clean-up of
    what it began) instead of being lost (as a container's PID 1 a process ignores a signal it has no handler
    for); once `started`, each is noted in ``received`` for the waiting loop.

    Python runs a handler at whatever line the main thread is at, and a few places cannot raise: an at-fork hook
    (logging's, run by every ``subprocess`` start with a ``preexec_fn``), a finalizer. There the exit is reported
    to `sys.unraisablehook` and dropped; this catches it there and raises it again 10 ms later (SIGALRM), from
    wherever the start then is."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self._starting = True
        self._unraisable_before = sys.unraisablehook
        sys.unraisablehook = self._unraisable
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def started(self) -> None:
        self._starting = False
        signal.setitimer(signal.ITIMER_REAL, 0)
        sys.unraisablehook = self._unraisable_before

    def _handle(self, signum: int, _frame: object) -> None:
        self.received.append(signum)
        self._end_start()

    def _end_start(self, *_: object) -> None:
        if self._starting:
            raise SystemExit(0)

    def _unraisable(self, unraisable: Any) -> None:
        if self._starting and self.received and isinstance(unraisable.exc_value, SystemExit):
            signal.signal(signal.SIGALRM, self._end_start)
            signal.setitimer(signal.ITIMER_REAL, 0.01)
            return
        self._unraisable_before(unraisable)


def catches(pid: int, signum: int) -> bool | None:
    """Whether process ``pid`` has a handler for ``signum`` (its ``SigCgt`` mask in ``/proc``); None where that
    cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except OSError:
        return None
    return None


def wait_until_catching(proc: subprocess.Popen[bytes], signum: int, deadline: float) -> None:
    """Until ``proc`` catches ``signum``, has exited, or ``deadline`` (monotonic) passes; where ``/proc`` cannot
    tell, half a second from now."""
    while proc.poll() is None and time.monotonic() < deadline:
        caught = catches(proc.pid, signum)
        if caught is None:
            time.sleep(0.5)
            return
        if caught:
            return
        time.sleep(0.02)


class WorkerProcess:
    """A ``python -m stream worker`` child process, logging to a file; stopped by PID."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None,
                 cwd: Path | None = None, wrap: Callable[[list[str]], list[str]] | None = None,
                 command: str = "worker") -> None:
        """``cwd``: run the ``stream`` package found there (another checkout: the benchmark's A/B runs).
        ``wrap``: the command line to run instead, given the worker's (it must exec the worker in the same PID:
        the chaos suite's network namespace). ``command``: another ``python -m stream`` command (``gateway``)."""
        self.log_path = log_path
        self.started = time.monotonic()
        self._log = open(log_path, "wb")  # noqa: SIM115 - lives as long as the process
        line = [sys.executable, "-m", "stream", command, *args]
        self.proc = subprocess.Popen(wrap(line) if wrap is not None else line, stdout=self._log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env={**os.environ, **(env or {})}, preexec_fn=die_with_parent, cwd=cwd)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def terminate(self, timeout_s: float = 60.0) -> int:
        """SIGTERM and wait; SIGKILL if it does not exit within the bound. Returns the exit code."""
        if self.proc.poll() is None:
            # Before the interpreter runs its first line no handler can exist: wait until the process catches
            # SIGTERM (a loaded machine took over half a second to get there), up to 10 s from its start.
            wait_until_catching(self.proc, signal.SIGTERM, self.started + 10.0)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()
        return int(self.proc.returncode)

    def wait(self, timeout_s: float) -> int | None:
        """Exit code once the process exits within ``timeout_s``, else None."""
        try:
            return int(self.proc.wait(timeout_s))
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def summary(self) -> dict[str, int] | None:
        match = _SUMMARY.search(self.output())
        if match is None:
            return None
        keys = ("consumed", "predicted", "dead_lettered", "committed", "batches")
        return dict(zip(keys, map(int, match.groups()), strict=True))
