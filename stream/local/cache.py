"""This project's download cache (``STREAM_CACHE_DIR``, default ``~/.cache/stream``): Kafka's and the benchmark's
jars, Apicurio Registry's runner, compiled classes, Debian's Prometheus, the Quix venv. Each entry is a folder
filled once, by one process at a time, and marked complete last, so that an interrupted fill is done again and
two processes that need the same entry at once (``make test``'s two pytest processes on a fresh machine) never
write it together: the second waits for the first and then finds it complete."""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)
COMPLETE = ".complete"


def cache_dir() -> Path:
    base = os.environ.get("STREAM_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "stream")
    return Path(base)


def resolved(folder: Path) -> bool:
    return (folder / COMPLETE).is_file()


def mark_resolved(folder: Path, marker: str) -> None:
    """Written last, once everything the folder needs is in it: `resolved` from then on."""
    (folder / COMPLETE).write_text(marker + "\n")


@contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Hold the cache's lock ``name`` (an ``flock`` on ``<cache>/.locks/<name>``; other holders wait for it)."""
    locks = cache_dir() / ".locks"
    locks.mkdir(parents=True, exist_ok=True)
    fd = os.open(locks / name, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process holding %s", locks / name)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the flock


def fill_once(folder: Path, fill: Callable[[], str]) -> Path:
    """``folder``, filled by ``fill`` (which returns the text of its completion marker) unless it is complete
    already; the fill runs under the folder's own lock, after a second look, so it runs once however many ask
    (entries fill side by side: one may need another)."""
    if resolved(folder):
        return folder
    with cache_lock(str(folder.resolve()).strip("/").replace("/", "_")):
        if not resolved(folder):
            folder.mkdir(parents=True, exist_ok=True)
            mark_resolved(folder, fill())
    return folder
