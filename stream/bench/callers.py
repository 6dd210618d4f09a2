"""Callers of the gateway at a steady rate: a small HTTP/1.1 client on asyncio streams, for the gateway's
benchmark and tests.

Why not an HTTP library: on the 2-core machine the callers share the CPU with the broker, the worker and the
gateway they measure; a general client costs about a millisecond of CPU a request, this one (keep-alive
connections from a pool, one request each at a time, JSON bodies) a few tens of microseconds, so the figures are the
gateway's and not the callers'.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Answer:
    event: dict[str, Any]
    status: int
    body: Any
    seconds: float  # from the request's start to its answer
    sent_ms: float  # wall-clock time (ms) the request was started
    waited_s: float = 0.0  # time spent waiting for a free connection before it (0 unless the pool ran dry)


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def post(self, host: str, path: str, body: bytes) -> tuple[int, bytes]:
        self.writer.write(b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n%s" % (path.encode(), host.encode(), len(body), body))
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        length = next((int(line.split(b":", 1)[1]) for line in lines[1:]
                       if line.lower().startswith(b"content-length:")), 0)
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


class Callers:
    """Up to ``connections`` keep-alive connections to ``host:port``; ``post`` takes a free one (or opens one)."""

    def __init__(self, host: str, port: int, connections: int = 256) -> None:
        self.host, self.port = host, port
        self._free: list[_Connection] = []
        self._slots = asyncio.Semaphore(connections)
        self._all: list[_Connection] = []
        self.reconnects = 0  # requests sent again on a new connection (see post)

    async def post(self, path: str, payload: Any) -> tuple[int, Any, float]:
        """(status, the JSON body, seconds waited for a connection)."""
        body = json.dumps(payload).encode()
        started = time.perf_counter()
        async with self._slots:
            waited = time.perf_counter() - started
            conn = self._free.pop() if self._free else None
            reused = conn is not None
            while True:
                if conn is None:
                    reader, writer = await asyncio.open_connection(self.host, self.port)
                    conn = _Connection(reader, writer)
                    self._all.append(conn)
                try:
                    status, raw = await conn.post(f"{self.host}:{self.port}", path, body)
                    break
                except (asyncio.IncompleteReadError, ConnectionResetError) as exc:
                    conn.close()
                    self._all.remove(conn)
                    # A kept-alive connection the server closed while it idled (uvicorn: after 5 s) answers
                    # nothing: the request never reached it, so it goes again on a new connection, as any HTTP
                    # client does. Anything else is the server's failure.
                    if not reused or (isinstance(exc, asyncio.IncompleteReadError) and exc.partial):
                        raise
                    self.reconnects += 1
                    conn, reused = None, False
                except BaseException:
                    conn.close()
                    self._all.remove(conn)
                    raise
            self._free.append(conn)
        return status, json.loads(raw) if raw else None, waited

    def close(self) -> None:
        for conn in self._all:
            conn.close()
        self._all.clear()
        self._free.clear()


async def call_at_rate(host: str, port: int, events: list[dict[str, Any]], rate: float,
                       time_field: str | None = "ts_ms", connections: int = 256, path: str = "/v1/predict",
                       body: Callable[[dict[str, Any]], Any] | None = None) -> list[Answer]:
    """POST each event to ``path``, one every 1/rate seconds whatever the answers (an open loop, as
    independent callers), its ``time_field`` set to the time it is sent (ms); the answers in order. ``body``:
    what is sent for an event (default: the event itself)."""
    callers = Callers(host, port, connections)

    async def one(event: dict[str, Any]) -> Answer:
        sent_ms = time.time() * 1000.0
        if time_field is not None:
            event = {**event, time_field: int(sent_ms)}
        started = time.perf_counter()
        status, answer, waited = await callers.post(path, event if body is None else body(event))
        return Answer(event, status, answer, time.perf_counter() - started, sent_ms, waited)

    try:
        tasks = []
        begin = time.perf_counter()
        for i, event in enumerate(events):
            delay = begin + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(event)))
        return list(await asyncio.gather(*tasks))
    finally:
        callers.close()
