"""This project's download cache (``STREAM_CACHE_DIR``, default ``~/.cache/stream``): Kafka's and the benchmark's
jars, Apicurio Registry's runner, compiled classes, Debian's Prometheus, the Quix venv. Each entry is a folder
filled once, by one process at a time, and marked complete last, so that an interrupted fill is done again and
two processes that need the same entry at once (``make test``'s two pytest processes on a fresh machine) never
write it together: the second waits for the first and then finds it complete."""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)
COMPLETE = ".complete"

# One lock for the whole cache, so that Maven runs one at a time too (two of them writing the same artifact into
# ~/.m2 at once is the same race one level down). Re-entrant within a process: a fill may need another entry.
_held = threading.RLock()
_depth = 0
_lock_file: int | None = None


def cache_dir() -> Path:
    base = os.environ.get("STREAM_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "stream")
    return Path(base)


def resolved(folder: Path) -> bool:
    return (folder / COMPLETE).is_file()


def mark_resolved(folder: Path, marker: str) -> None:
    """Written last, once everything the folder needs is in it: `resolved` from then on."""
    (folder / COMPLETE).write_text(marker + "\n")


@contextmanager
def cache_lock() -> Iterator[None]:
    """Hold the cache's lock (an ``flock`` on ``<cache>/.lock``; other processes wait for it)."""
    global _depth, _lock_file
    with _held:
        if _depth == 0:
            root = cache_dir()
            root.mkdir(parents=True, exist_ok=True)
            fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log.info("waiting for another process filling the cache %s", root)
                fcntl.flock(fd, fcntl.LOCK_EX)
            _lock_file = fd
        _depth += 1
        try:
            yield
        finally:
            _depth -= 1
            if _depth == 0 and _lock_file is not None:
                os.close(_lock_file)  # closing releases the flock
                _lock_file = None


def fill_once(folder: Path, fill: Callable[[], str]) -> Path:
    """``folder``, filled by ``fill`` (which returns the text of its completion marker) unless it is complete
    already; the fill runs under `cache_lock`, after a second look, so it runs once however many ask."""
    if resolved(folder):
        return folder
    with cache_lock():
        if not resolved(folder):
            folder.mkdir(parents=True, exist_ok=True)
            mark_resolved(folder, fill())
    return folder
