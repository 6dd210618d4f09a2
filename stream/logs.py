"""The command-line processes' logging: one line a record on stderr, with the process id."""

from __future__ import annotations

import logging
import sys


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(level=getattr(logging, level), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s[%(process)d] %(message)s")
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # the schema registry client logs every request
