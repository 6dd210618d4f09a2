"""What a failed test's report shows besides its traceback: the lines that the servers it used (the session's
broker, cluster and registry) and the processes it started (``*.log`` files in its ``tmp_path``: workers,
gateways) wrote while it ran, so that a failure in CI explains itself from CI's log alone (the servers' folders are
removed at the end of the session, and nobody reads a CI machine's temp folder)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from stream.local.broker import file_tail

TAIL_LINES = 40


class FailureLogs:
    """Log files by the fixture that owns them; for each test, where each file ended when the test began."""

    def __init__(self) -> None:
        self._sources: dict[str, Callable[[], list[Path]]] = {}
        self._starts: dict[Path, int] = {}

    def watch(self, fixture: str, files: Callable[[], list[Path]]) -> None:
        """The logs of a server that ``fixture`` started; ``files`` lists them (a restarted node may add one)."""
        self._sources[fixture] = files

    def forget(self, fixture: str) -> None:
        self._sources.pop(fixture, None)

    def mark(self) -> None:
        """A test begins: what the files hold now is not its business."""
        self._starts = {f: _size(f) for files in self._sources.values() for f in files()}

    def sections(self, item: pytest.Item) -> list[tuple[str, str]]:
        used = set(getattr(item, "fixturenames", ()))
        found: list[tuple[str, Path]] = [(fixture, f) for fixture, files in self._sources.items() if fixture in used
                                         for f in files()]
        tmp = getattr(item, "funcargs", {}).get("tmp_path")
        if isinstance(tmp, Path):
            found += [("tmp_path", f) for f in sorted(tmp.rglob("*.log"))]
        out = []
        for owner, path in found:
            text = file_tail(path, TAIL_LINES, self._starts.get(path, 0) if owner != "tmp_path" else 0)
            if text:
                out.append((f"{owner}: {path.name}, last {TAIL_LINES} lines written during the test ({path})", text))
        return out


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
