"""Who may call the gateway: API keys, checked as ``Authorization: Bearer <key>`` on every route but the health
probes (``/healthz``, ``/readyz``), compared in constant time, refused with 401 in the error shape of the
protocol the route speaks.

An ASGI middleware of its own (not Starlette's ``BaseHTTPMiddleware``, which wraps every response in a task and a
stream): a request with a good key passes through untouched."""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from pathlib import Path
from typing import Any

from stream.errors import ConfigError

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

ENV_KEYS = "STREAM_GATEWAY_API_KEYS"  # comma-separated
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"})
MIN_KEY_CHARS = 16


def load_keys(given: Iterable[str], files: Iterable[str], environ: MutableMapping[str, str] | None = None
              ) -> list[str]:
    """The keys of ``--api-key`` flags, ``--api-key-file`` files (one a line; blank lines and ``#`` comments
    skipped) and the ``STREAM_GATEWAY_API_KEYS`` variable (comma-separated); ConfigError for a short or
    unreadable one."""
    env = os.environ if environ is None else environ
    keys = [k.strip() for k in given]
    keys += [k.strip() for k in env.get(ENV_KEYS, "").split(",") if k.strip()]
    for name in files:
        try:
            lines = Path(name).read_text().splitlines()
        except OSError as exc:
            raise ConfigError(f"--api-key-file {name}: {exc.strerror or exc}") from None
        found = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
        if not found:
            raise ConfigError(f"--api-key-file {name}: no key in it (one a line)")
        keys += found
    for k in keys:
        if len(k) < MIN_KEY_CHARS or any(c.isspace() for c in k):
            raise ConfigError(f"an API key must be at least {MIN_KEY_CHARS} characters without spaces (one of "
                              f"{len(keys)} is {len(k)} long); make one with `python3 -c 'import secrets; "
                              "print(secrets.token_urlsafe(32))'`")
    return list(dict.fromkeys(keys))


def unauthorized_body(path: str, message: str) -> dict[str, Any]:
    """A 401's body in the shape of the protocol ``path`` speaks: OpenAI's for ``/v1/embeddings`` and
    ``/v1/models``, TEI's for ``/embed``, the inference protocol's for ``/v2`` (the gateway's own elsewhere)."""
    if path.startswith(("/v1/embeddings", "/v1/models")):
        return {"error": {"message": message, "type": "invalid_request_error", "param": None,
                          "code": "invalid_api_key"}}
    if path == "/embed":  # text-embeddings-inference's
        return {"error": message, "error_type": "unauthorized"}
    return {"error": message}


class ApiKeys:
    """The middleware: ``app`` behind a check of ``keys`` (bytes compared with ``hmac.compare_digest`` against
    every key, so the time taken says nothing about which one nearly matched)."""

    def __init__(self, app: App, keys: list[str]) -> None:
        if not keys:
            raise ValueError("no API keys")
        self.app = app
        self._keys = [k.encode() for k in keys]

    def allowed(self, header: bytes | None) -> bool:
        if header is None or header[:7].lower() != b"bearer ":
            return False
        given = header[7:].strip()
        ok = False
        for key in self._keys:
            ok |= hmac.compare_digest(given, key)
        return ok

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        if self.allowed(header):
            await self.app(scope, receive, send)
            return
        message = ("no API key: send Authorization: Bearer <key>" if header is None
                   else "the API key is not one of this gateway's")
        body = json.dumps(unauthorized_body(scope["path"], message)).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
                                (b"www-authenticate", b'Bearer realm="stream-gateway"')]})
        await send({"type": "http.response.body", "body": body})
