"""The probes beside /metrics: liveness from the poll loop's turns and failure, readiness from the model, the
group, the brokers and stalled partitions; served over HTTP with /metrics on one port."""

from __future__ import annotations

import pytest

from stream.local.broker import free_port
from stream.ops.health import LIVENESS_S, Health, serve
from stream.ops.metrics import StreamMetrics
from tests.probes import get


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def ready_health(clock: Clock) -> Health:
    health = Health(clock)
    health.model_loaded = health.joined = True
    return health


def test_liveness_needs_the_poll_loop_to_keep_turning_once_it_runs_and_no_failure() -> None:
    clock = Clock()
    health = Health(clock)
    clock.now += 10 * LIVENESS_S
    assert health.live() == [], "before the loop runs (waiting for brokers at start-up) it is alive"
    health.polling = True
    assert health.live() == [f"poll loop has not gone round for {10 * LIVENESS_S:.0f}s"]
    health.tick()
    assert health.live() == []
    clock.now += LIVENESS_S - 1
    assert health.live() == []
    health.failed = "PublishError: boom"
    assert health.live() == ["failed: PublishError: boom"]


def test_readiness_needs_the_model_the_group_reachable_brokers_and_no_stalled_partition() -> None:
    clock = Clock()
    health = Health(clock)
    assert health.ready() == ["model not loaded", "not in the consumer group yet (no assignment)"]
    health = ready_health(clock)
    assert health.ready() == []
    health.unreachable = lambda: True
    assert health.ready() == ["Kafka brokers unreachable"]
    health.unreachable = lambda: False
    health.stalled = lambda: 2
    assert health.ready() == ["2 partitions stalled"]
    health.stalled = lambda: 0
    health.warming = "3 of 66 batches"
    assert health.ready() == ["warming the model: 3 of 66 batches"] and health.live() == []
    health.warming = None
    health.polling = True
    clock.now += LIVENESS_S + 1
    assert health.ready() == [f"poll loop has not gone round for {LIVENESS_S + 1:.0f}s"], "not alive: not ready"


def test_metrics_and_probes_are_served_on_one_port_and_stop() -> None:
    metrics = StreamMetrics()
    metrics.consumed.inc(3)
    clock = Clock()
    health = Health(clock)
    port = free_port()
    server = serve(metrics.registry, health, port, "127.0.0.1")
    try:
        status, body = get(port, "/metrics")
        assert status == 200 and "stream_records_consumed_total 3.0" in body
        assert get(port, "/healthz") == (200, "ok\n")
        assert get(port, "/readyz") == (503, "model not loaded\nnot in the consumer group yet (no assignment)\n")
        health.model_loaded = health.joined = True
        assert get(port, "/readyz") == (200, "ok\n")
        health.unreachable = lambda: True
        assert get(port, "/readyz") == (503, "Kafka brokers unreachable\n")
        assert get(port, "/healthz") == (200, "ok\n"), "waiting for brokers is not a reason to restart"
        for typo in ("/", "/readz", "/heathz", "/metrics/", "/metricsx", "/healthz/extra"):
            status, body = get(port, typo)
            assert status == 404 and "serves /metrics, /healthz and /readyz" in body, typo
    finally:
        server.shutdown()
        server.server_close()


def test_a_range_of_ports_takes_the_first_free_one_and_a_full_range_fails_clearly() -> None:
    """Replicas on one host's network (the compose override) share --metrics-port 9100-9107."""
    import errno
    import socket

    metrics = StreamMetrics()
    health = ready_health(Clock())
    # Three consecutive free ports (free_port() vouches for one only: a neighbour taken by another process made
    # this fail in CI): bound together, then the two the servers are to take are let go.
    for _ in range(50):
        first = free_port()
        trio = [socket.socket() for _ in range(3)]
        try:
            for offset, sock in enumerate(trio):
                sock.bind(("127.0.0.1", first + offset))
            break
        except OSError:
            for sock in trio:
                sock.close()
    else:
        pytest.fail("no three consecutive free ports on 127.0.0.1 in 50 tries")
    held = trio[0]
    trio[1].close()
    trio[2].close()
    try:
        held.listen()
        servers = [serve(metrics.registry, health, first, "127.0.0.1", first + 2) for _ in range(2)]
        try:
            assert sorted(s.server_port for s in servers) == [first + 1, first + 2]
            assert get(first + 2, "/healthz")[0] == 200
            with pytest.raises(OSError) as full:
                serve(metrics.registry, health, first, "127.0.0.1", first + 2)
            assert full.value.errno == errno.EADDRINUSE
        finally:
            for s in servers:
                s.shutdown()
                s.server_close()
    finally:
        held.close()


def test_clients_that_connect_and_send_nothing_neither_grow_the_threads_nor_keep_a_probe_out(
        monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """The port is a thread a connection. A client that opened connections and sent half a request kept a thread
    each, for ever (3,000 of them: 3,000 threads). Now at most MAX_CONNECTIONS are served, the oldest closed past
    that, so a probe that comes after them is answered; a connection quiet for the read timeout is closed; a
    request line and headers over the budget get a 431 saying so; none of it prints a traceback."""
    import socket
    import threading
    import time

    from stream.ops import health as module

    cap = 8  # MAX_CONNECTIONS, small: the port accepts a few hundred connections a second on a loaded machine
    monkeypatch.setattr(module, "MAX_CONNECTIONS", cap)
    server = serve(StreamMetrics().registry, ready_health(Clock()), 0, "127.0.0.1")
    port = server.server_port
    before = threading.active_count()
    idle = []
    try:
        for _ in range(3 * cap):
            sock = socket.create_connection(("127.0.0.1", port))
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never ends its headers
            idle.append(sock)
        started = time.monotonic()
        assert get(port, "/healthz") == (200, "ok\n")
        assert time.monotonic() - started < 2.0
        assert server.evicted >= 2 * cap  # type: ignore[attr-defined]
        # The threads of the connections closed end as their reads return: on a loaded machine, not at once.
        deadline = time.monotonic() + 10.0
        while threading.active_count() - before > cap and time.monotonic() < deadline:
            time.sleep(0.05)
        assert threading.active_count() - before <= cap, threading.enumerate()
        idle[0].settimeout(5)
        assert idle[0].recv(100) == b"", "the oldest connections were closed by the server"

        monkeypatch.setattr(module._Quiet, "timeout", 1.0)
        quiet = socket.create_connection(("127.0.0.1", port))
        quiet.settimeout(5)
        started = time.monotonic()
        assert quiet.recv(100) == b"", "a connection that sends nothing is closed after the read timeout"
        assert 0.5 < time.monotonic() - started < 4.0
        quiet.close()

        big = socket.create_connection(("127.0.0.1", port))
        big.settimeout(5)
        # Exactly the budget, the headers not ended: the server reads all of it, so its close is not a reset that
        # could beat its answer to this client.
        request = b"GET /metrics HTTP/1.1\r\n"
        while len(request) < module.MAX_REQUEST_BYTES:
            request += b"X-Filler: " + b"a" * min(1000, module.MAX_REQUEST_BYTES - len(request) - 12) + b"\r\n"
        assert len(request) == module.MAX_REQUEST_BYTES
        big.sendall(request)
        reply = b""
        while chunk := big.recv(65536):
            reply += chunk
        big.close()
        assert reply.startswith(b"HTTP/1.0 431 ") and str(module.MAX_REQUEST_BYTES).encode() in reply, reply[:300]
        assert get(port, "/readyz") == (200, "ok\n")
    finally:
        for sock in idle:
            sock.close()
        server.shutdown()
        server.server_close()
    assert "Traceback" not in capfd.readouterr().err
