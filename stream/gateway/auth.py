"""Who may call the gateway: API keys, checked as ``Authorization: Bearer <key>`` on every route but the health
probes, compared in constant time, refused with 401 in the error shape of the protocol the route speaks.

Keys come from ``--api-key`` flags, ``STREAM_GATEWAY_API_KEYS`` (comma-separated) and ``--api-key-file`` files
(one a line; blank lines and ``#`` comments skipped). A source that is given but holds no key stops the start (a
missing secret must not open the door), as does a short key or a key file that others may write; one that others
may read is served with a WARNING (any user of the host or container could read the keys: ``chmod 600``, or a
Kubernetes secret's ``defaultMode: 0400``). Key files are read again when they change (checked at most once a
second, on the requests' path), so a key rotates without a restart; a file that cannot be read meanwhile (a
secret being swapped) keeps the keys it had.

An ASGI middleware of its own (not Starlette's ``BaseHTTPMiddleware``, which wraps every response in a task and a
stream): a request with a good key passes through untouched."""

from __future__ import annotations

import hmac
import json
import logging
import stat
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, MutableMapping
from pathlib import Path
from typing import Any

from stream.errors import ConfigError
from stream.gateway.http import error_for_path

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger(__name__)
MIN_KEY_CHARS = 16
CHECK_EVERY_S = 1.0


def _check_key(key: str, where: str) -> str:
    if len(key) < MIN_KEY_CHARS or any(c.isspace() for c in key):
        raise ConfigError(f"{where}: an API key must be at least {MIN_KEY_CHARS} characters without spaces (one is "
                          f"{len(key)} long); make one with `python3 -c 'import secrets; "
                          "print(secrets.token_hex(32))'`")
    return key


def read_key_file(path: Path) -> list[str]:
    """The keys in ``path``; ConfigError for a file others may write, an unreadable or empty one, a short key."""
    try:
        mode = path.stat().st_mode
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"--api-key-file {path}: {exc.strerror or exc}") from None
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(f"--api-key-file {path}: others may write it (mode {stat.S_IMODE(mode):o}), and so add a "
                          "key of their own: chmod 600 it")
    if mode & stat.S_IROTH:
        log.warning("--api-key-file %s: any user may read it (mode %o): chmod 600 it, or give the Kubernetes secret "
                    "defaultMode 0400", path, stat.S_IMODE(mode))
    keys = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
    if not keys:
        raise ConfigError(f"--api-key-file {path}: no key in it (one a line)")
    return [_check_key(k, f"--api-key-file {path}") for k in keys]


class KeySource:
    """The keys in force: the fixed ones and the files', the files read again when they change."""

    def __init__(self, fixed: Iterable[str], files: Iterable[Path], clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self._fixed = [_check_key(k.strip(), "--api-key") for k in fixed]
        self._files = [Path(f) for f in files]
        self._clock = clock
        self._stamps: dict[Path, tuple[int, int, int]] = {}
        self._from_files: dict[Path, list[str]] = {}
        for path in self._files:
            self._from_files[path] = read_key_file(path)
            self._stamps[path] = self._stamp(path)
        self._checked = clock()
        self._keys = self._join()

    @staticmethod
    def _stamp(path: Path) -> tuple[int, int, int]:
        st = path.stat()
        return st.st_ino, st.st_mtime_ns, st.st_size

    def _join(self) -> list[bytes]:
        keys = [*self._fixed, *(k for path in self._files for k in self._from_files[path])]
        return [k.encode() for k in dict.fromkeys(keys)]

    def __len__(self) -> int:
        return len(self._keys)

    def current(self) -> list[bytes]:
        now = self._clock()
        if self._files and now - self._checked >= CHECK_EVERY_S:
            self._checked = now
            self._reload()
        return self._keys

    def _reload(self) -> None:
        changed = False
        for path in self._files:
            try:
                stamp = self._stamp(path)
                if stamp == self._stamps.get(path):
                    continue
                self._from_files[path] = read_key_file(path)
                self._stamps[path] = stamp
                changed = True
            except (OSError, ConfigError) as exc:
                log.warning("--api-key-file %s could not be read again (its keys stay as they were): %s", path, exc)
        if changed:
            self._keys = self._join()
            log.info("API keys read again: %d in force", len(self._keys))


def load_keys(given: Iterable[str], files: Iterable[Path]) -> KeySource | None:
    """The keys of the flags and variables (``given``) and of the key files; None when there are none."""
    source = KeySource(given, files)
    return source if len(source) else None


class ApiKeys:
    """The middleware: ``app`` behind a check of the keys (bytes compared with ``hmac.compare_digest`` against
    every key, so the time taken says nothing about which one nearly matched); ``open_paths`` pass unchecked."""

    def __init__(self, app: App, keys: KeySource, open_paths: Collection[str]) -> None:
        if not len(keys):
            raise ValueError("no API keys")
        self.app = app
        self.source = keys
        self.open_paths = frozenset(open_paths)

    def allowed(self, header: bytes | None) -> bool:
        if header is None or header[:7].lower() != b"bearer ":
            return False
        given = header[7:].strip()
        ok = False
        for key in self.source.current():
            ok |= hmac.compare_digest(given, key)
        return ok

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        if self.allowed(header):
            await self.app(scope, receive, send)
            return
        message = ("no API key: send Authorization: Bearer <key>" if header is None
                   else "the API key is not one of this gateway's")
        body = json.dumps(error_for_path(scope["path"], message,
                                         "unauthorized" if scope["path"] == "/embed" else "invalid_api_key")).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
                                (b"www-authenticate", b'Bearer realm="stream-gateway"')]})
        await send({"type": "http.response.body", "body": body})
