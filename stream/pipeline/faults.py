"""Test-only fault injection: ``STREAM_TEST_KILL_AT=<phase>`` with ``STREAM_TEST_KILL_AFTER=<n>`` makes the
worker SIGKILL itself the n-th time it reaches that phase (the chaos suite places kills this way).
Unset (always, in production) it costs one dict lookup per batch."""

from __future__ import annotations

import os
import signal

PHASES = ("after-poll", "during-inference", "after-produce", "after-delivery", "in-transaction")
_AT = os.environ.get("STREAM_TEST_KILL_AT", "")
_AFTER = int(os.environ.get("STREAM_TEST_KILL_AFTER", "1") or "1")
_count = {phase: 0 for phase in PHASES}

if _AT and _AT not in PHASES:
    raise SystemExit(f"STREAM_TEST_KILL_AT={_AT!r}: not one of {', '.join(PHASES)}")


def reach(phase: str) -> None:
    """Called by the worker at each phase; kills the process when the configured point is reached."""
    if phase != _AT:
        return
    _count[phase] += 1
    if _count[phase] >= _AFTER:
        os.kill(os.getpid(), signal.SIGKILL)
