"""An HTTP GET on a worker's metrics port (`/metrics`, `/healthz`, `/readyz`): (status, body), 5xx included."""

from __future__ import annotations

import urllib.error
import urllib.request


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
