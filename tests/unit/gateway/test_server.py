"""What one caller can hold of the gateway's server before authentication (`stream.gateway.server`): header bytes,
read times, buffered bodies, connections; the gateway's app served by uvicorn in a thread with small limits, sockets
on 127.0.0.1 (the gateway process under the same attacks, with its memory measured:
tests/integration/test_gateway_limits.py)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn
from uvicorn._compat import asyncio_run

from stream.gateway.server import protocol_class, with_tls_handshake_timeout
from stream.local.broker import free_port
from tests.unit.gateway.fakes import gateway

pytestmark = pytest.mark.timeout(60)
EVENT = (b'{"event_id": "e", "key": "k", "ts_ms": 1700000000000, "features": [' + b"0.1, " * 31 + b"0.1]}")


class Served:
    def __init__(self, **limits: Any) -> None:
        http, self.queue = gateway(**limits)
        app = http.app
        self.port = free_port()
        self.sockets: list[socket.socket] = []
        settings_limits = app_limits(limits)
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off",
                                http=protocol_class(settings_limits), timeout_keep_alive=2)
        self.server = uvicorn.Server(config)
        factory = with_tls_handshake_timeout(config.get_loop_factory() or _loop, 5)
        self.thread = threading.Thread(target=lambda: asyncio_run(self.server.serve(), loop_factory=factory),
                                       daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.01)

    def connect(self) -> socket.socket:
        conn = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        self.sockets.append(conn)
        return conn

    def stop(self) -> None:
        for conn in self.sockets:
            conn.close()
        self.server.should_exit = True
        self.thread.join(10)


def _loop() -> Any:
    import asyncio

    return asyncio.new_event_loop()


def app_limits(given: dict[str, Any]) -> Any:
    from stream.gateway.server import Limits

    names = set(Limits.__dataclass_fields__)
    return Limits(**{k: v for k, v in given.items() if k in names})


@pytest.fixture
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    server = Served(**getattr(request, "param", {}))
    yield server
    server.stop()


def answer(conn: socket.socket, timeout_s: float = 5.0) -> bytes:
    conn.settimeout(timeout_s)
    data = b""
    try:
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
            if b"\r\n\r\n" in data and data.split(b"\r\n\r\n", 1)[0].startswith(b"HTTP/1.1 ") and (
                    b"content-length" not in data.lower() or len(data.split(b"\r\n\r\n", 1)[1]) >= int(
                        data.lower().split(b"content-length: ")[1].split(b"\r\n")[0])):
                break
    except (TimeoutError, ConnectionResetError):
        pass
    return data


def post(body: bytes, length: int | None = None) -> bytes:
    return (b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (len(body) if length is None else length)) + body


@pytest.mark.parametrize("served", [{"max_header_bytes": 4096}], indirect=True)
def test_headers_over_the_limit_get_431_and_the_connection_closes(served: Served) -> None:
    conn = served.connect()
    conn.sendall(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\n")
    with pytest.raises(OSError):
        for _ in range(10_000):  # 80 MB of header lines, unless the server stops reading
            conn.sendall(b"X-Filler: " + b"a" * 8000 + b"\r\n")
    assert answer(conn).startswith(b"HTTP/1.1 431 ")
    fine = served.connect()
    fine.sendall(post(EVENT))
    assert answer(fine).startswith(b"HTTP/1.1 200 "), "the next caller is served"


@pytest.mark.parametrize("served", [{"header_timeout_s": 1.0}], indirect=True)
def test_a_silent_or_half_sent_request_is_closed_with_408_after_the_header_timeout(served: Served) -> None:
    silent, half = served.connect(), served.connect()
    half.sendall(b"POST /v1/predict HTTP/1.1\r\nHo")
    started = time.monotonic()
    assert answer(silent, 5).startswith(b"HTTP/1.1 408 ") and answer(half, 5).startswith(b"HTTP/1.1 408 ")
    assert time.monotonic() - started < 3
    # A keep-alive connection that went quiet after a request: the keep-alive bound (2 s here) closes it.
    kept = served.connect()
    kept.sendall(post(EVENT))
    assert answer(kept).startswith(b"HTTP/1.1 200 ")
    assert answer(kept, 5) == b""


@pytest.mark.parametrize("served", [{"body_timeout_s": 1.0}], indirect=True)
def test_a_body_shorter_than_its_content_length_gets_408_at_the_body_timeout(served: Served) -> None:
    conn = served.connect()
    started = time.monotonic()
    conn.sendall(post(EVENT, length=len(EVENT) + 100))
    got = answer(conn, 5)
    assert got.startswith(b"HTTP/1.1 408 ") and b"--body-timeout-s" in got, got
    assert time.monotonic() - started < 3
    assert served.queue.sent == []


@pytest.mark.parametrize("served", [{"max_body_bytes": 100_000, "max_buffered_bytes": 280_000}], indirect=True)
def test_bodies_held_at_once_are_bounded_with_503_and_one_over_its_own_limit_is_413(served: Served) -> None:
    big = served.connect()
    big.sendall(post(b"[" + b" " * 10, length=200_000))
    assert answer(big).startswith(b"HTTP/1.1 413 ")
    held = []
    for _ in range(4):  # 4 bodies of 90 KB, each stopped 10 bytes short: 3 fit under 280 KB
        conn = served.connect()
        conn.sendall(post(b"[" + b" " * 89_989, length=90_000))
        held.append(conn)
    time.sleep(0.5)
    answers = []
    for conn in held:
        conn.settimeout(0.2)
        try:
            answers.append(conn.recv(100)[:12])
        except TimeoutError:
            answers.append(b"")
    assert answers.count(b"HTTP/1.1 503") == 1 and answers.count(b"") == 3, answers


@pytest.mark.parametrize("served", [{"max_connections": 5}], indirect=True)
def test_connections_past_the_cap_are_refused_with_503_at_once(served: Served) -> None:
    held = [served.connect() for _ in range(5)]
    time.sleep(0.2)
    extra = served.connect()
    assert answer(extra, 2).startswith(b"HTTP/1.1 503 ")
    for conn in held:
        conn.close()
    time.sleep(0.2)
    again = served.connect()
    again.sendall(post(EVENT))
    assert answer(again).startswith(b"HTTP/1.1 200 ")


@pytest.mark.parametrize("served", [{"body_timeout_s": 1.0}], indirect=True)
def test_a_caller_that_stops_taking_its_answers_is_dropped_after_the_body_timeout(served: Served) -> None:
    conn = served.connect()
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    # Pipelined requests for the 30 KB document, none of the answers read: the server's writes stop.
    conn.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: x\r\n\r\n" * 600)
    started = time.monotonic()
    while not served.server.server_state.connections:
        assert time.monotonic() - started < 5, "never accepted"
        time.sleep(0.01)
    [protocol] = served.server.server_state.connections
    while not protocol.transport.is_closing():
        assert time.monotonic() - started < 8, "the connection is still held"
        time.sleep(0.1)
    assert time.monotonic() - started > 1.0, "dropped after the timeout, not before"


@pytest.mark.parametrize("served", [{"max_header_bytes": 4096}], indirect=True)
def test_pipelined_requests_longer_together_than_the_header_limit_are_each_answered(served: Served) -> None:
    conn = served.connect()
    conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 300)  # 10 KB of heads, 35 bytes each
    got = b""
    conn.settimeout(10)
    while got.count(b"HTTP/1.1 200 ") < 300:
        chunk = conn.recv(65536)
        assert chunk, f"closed after {got.count(b'HTTP/1.1 200 ')} answers: {got[-200:]!r}"
        got += chunk
    assert b" 431 " not in got
