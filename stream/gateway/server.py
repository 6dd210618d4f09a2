"""The gateway's HTTP server: uvicorn with httptools, every resource a caller can hold bounded before the request
reaches authentication or a route.

* Header bytes: a request line and headers over ``max_header_bytes`` (16 KiB) get 431 and the connection closes
  (httptools itself has no limit: it buffers a header line of any length).
* Timeouts: a connection that has not sent a request's complete headers within ``header_timeout_s`` of its start
  (or of the next request's first byte) gets 408 and is closed; a body not complete within ``body_timeout_s`` of
  its headers is answered 408 by the route reading it (`BodyBudget.read`) and the connection closed; a caller
  that stops taking its answer for ``body_timeout_s`` is dropped; a TLS handshake gets
  ``tls_handshake_timeout_s``; an idle keep-alive connection ``keep_alive_s``. One timer per server looks at
  every connection's deadlines twice a second.
* Bodies: each at most ``max_body_bytes`` (413 at once on its Content-Length, or as soon as it passes), and all
  the bodies being read or held by requests in flight together at most ``max_buffered_bytes`` (503 with
  ``Retry-After`` past it). Each connection also holds what uvicorn reads ahead of the route (at most one
  socket read, 256 KiB, past 64 KiB).
* Connections: at most ``max_connections`` open at once; one more gets 503 and is closed at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import ClientDisconnect, Request
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from stream.gateway.errors import BodyTimeout, Overloaded, Oversized

log = logging.getLogger(__name__)

BODY_COMPLETE = "stream.body_complete"  # set in a request's scope once its whole body has arrived


@dataclass(frozen=True)
class Limits:
    max_header_bytes: int = 16_384
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    tls_handshake_timeout_s: float = 10.0
    keep_alive_s: float = 5.0
    max_body_bytes: int = 1_048_576
    max_buffered_bytes: int = 64 * 1_048_576
    max_connections: int = 1000


def _raw_response(status: int, reason: str, message: str) -> bytes:
    body = (message + "\n").encode()
    return (b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
            b"connection: close\r\n%s\r\n%s" % (status, reason.encode(), len(body),
                                                 b"retry-after: 1\r\n" if status == 503 else b"", body))


SWEEP_S = 0.5  # how often a server looks at its connections' deadlines


class _Sweep:
    """One timer per server, every `SWEEP_S`, looking at each connection's deadlines (a timer per request and
    connection would be a few thousand armed and cancelled a second under load)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.protocols: set[GuardedProtocol] = set()
        self._handle: asyncio.TimerHandle | None = None

    def add(self, protocol: GuardedProtocol) -> None:
        self.protocols.add(protocol)
        if self._handle is None:
            self._handle = self.loop.call_later(SWEEP_S, self._run)

    def _run(self) -> None:
        self._handle = None
        now = self.loop.time()
        for protocol in list(self.protocols):
            protocol.check_deadlines(now)
        if self.protocols:
            self._handle = self.loop.call_later(SWEEP_S, self._run)


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the header, time and connection bounds of the module's docstring
    (``limits`` is set on a subclass made per server: `protocol_class`).

    A connection counts from its accept, when the loop makes its protocol (before a TLS handshake, which holds a
    read buffer of its own), until it is lost, or until its handshake's deadline passes without it being made."""

    limits = Limits()
    accepted = 0  # connections open now, counted from their accept (on the subclass: one per server)
    sweep: _Sweep | None = None  # on the subclass: one per server

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        cls = type(self)
        cls.accepted += 1
        self._counted = True
        self._refused = cls.accepted > self.limits.max_connections
        self._accepted_at = self.loop.time()
        self._made = False
        self._in_head = True  # reading a request line and headers (from the start, and after each request)
        self._head_seen = 0  # bytes of the head being read
        self._heads_done = 0
        self._head_since: float | None = None  # when the headers being read began to arrive
        self._body_since: float | None = None  # when the body being read began (its headers' end)
        self._stuck_since: float | None = None  # when the caller stopped taking the answer (writing paused)
        if cls.sweep is None:
            cls.sweep = _Sweep(self.loop)
        cls.sweep.add(self)

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            type(self).accepted -= 1
        if self.sweep is not None:
            self.sweep.protocols.discard(self)

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._made = True
        self._head_since = self.loop.time()
        if self._refused:
            self.transport = transport
            transport.write(_raw_response(503, "Service Unavailable",
                                          f"over {self.limits.max_connections} connections: try again shortly"))
            transport.close()
            return
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._uncount()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Feed httptools at most what is left of the header allowance while a head is being read (it buffers a
        header line of any length itself); a head still open when the allowance is used up is a 431. Bytes past a
        head (a body, pipelined requests) go through as they are."""
        if self._refused:
            return
        if not self._in_head:
            super().data_received(data)
            return
        if self._head_since is None:
            self._head_since = self.loop.time()
        room = self.limits.max_header_bytes - self._head_seen
        if len(data) <= room:  # the usual case: a whole request, or a part of one, within the allowance
            self._head_seen += len(data)
            super().data_received(data)
            return
        heads = self._heads_done
        self._head_seen += room
        super().data_received(data[:room])
        if self.transport.is_closing():
            return
        if self._heads_done == heads and self._in_head:
            self._reject(431, "Request Header Fields Too Large",
                         f"the request line and headers are over {self.limits.max_header_bytes} bytes")
            return
        self.data_received(data[room:])  # past a head that ended within the allowance: its next part

    # httptools' callbacks
    def on_headers_complete(self) -> None:
        self._in_head = False
        self._heads_done += 1
        self._head_seen = 0
        self._head_since = None
        # Past this, the route reading the body answers 408 at body_timeout_s; the sweep closes what no route reads.
        self._body_since = self.loop.time()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._body_since = None
        self._in_head = True  # the next bytes are the next request's (until they come, the keep-alive bound)
        self._head_seen = 0
        cycle = getattr(self, "cycle", None)
        if cycle is not None:
            cycle.scope[BODY_COMPLETE] = True  # `BodyBudget.read` needs no timer for a body already here
        super().on_message_complete()

    def pause_writing(self) -> None:
        if self._stuck_since is None:
            self._stuck_since = self.loop.time()
        super().pause_writing()

    def resume_writing(self) -> None:
        self._stuck_since = None
        super().resume_writing()

    # the bounds
    def check_deadlines(self, now: float) -> None:
        """Called by the sweep: a handshake, headers or a body past its bound."""
        limits = self.limits
        if not self._made:
            if now - self._accepted_at > limits.tls_handshake_timeout_s + 1.0:
                self._uncount()  # a TLS handshake that never ended: no connection_made, no connection_lost
            return
        if self._head_since is not None and now - self._head_since > limits.header_timeout_s:
            if self.cycle is None or self.cycle.response_complete:  # else pipelined: the request's bounds apply
                self._reject(408, "Request Timeout",
                             f"no complete request headers within {limits.header_timeout_s:g} s")
        elif self._body_since is not None and now - self._body_since > limits.body_timeout_s + 1.0:
            self._body_since = None
            if not self.transport.is_closing():
                self.transport.close()
        elif self._stuck_since is not None and now - self._stuck_since > limits.body_timeout_s:
            self._stuck_since = None  # a caller that does not read its answer: dropped, and the answer with it
            self.transport.abort()

    def _reject(self, status: int, reason: str, message: str) -> None:
        self._head_since = self._body_since = None
        if not self.transport.is_closing():
            if self.cycle is None or self.cycle.response_complete:
                self.transport.write(_raw_response(status, reason, message))
            self.transport.close()


def protocol_class(limits: Limits) -> type[GuardedProtocol]:
    return type("GatewayHttpProtocol", (GuardedProtocol,), {"limits": limits, "accepted": 0, "sweep": None})


class BodyBudget:
    """The bytes of bodies held by requests in flight, under ``limits.max_buffered_bytes`` together."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.held = 0

    async def read(self, request: Request) -> bytes:
        """The request's body, its bytes held against the budget until the request ends (`release`, called by
        the route's wrapper, `stream.gateway.http.endpoint`); `Oversized`, `Overloaded` or `BodyTimeout`."""
        limit = self.limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise Oversized(f"the request body is {declared} bytes, over --max-body-bytes ({limit})")
        held = request.scope.setdefault("stream.body_held", [0])
        chunks: list[bytes] = []
        try:
            if request.scope.get(BODY_COMPLETE):  # all of it arrived with its headers: nothing to wait for
                await self._take(request, held, chunks)
            else:
                async with asyncio.timeout(self.limits.body_timeout_s):
                    await self._take(request, held, chunks)
        except TimeoutError:
            raise BodyTimeout(f"the request body did not arrive within {self.limits.body_timeout_s:g} s "
                              "(--body-timeout-s)") from None
        except ClientDisconnect:
            raise BodyTimeout("the caller went away before its body arrived") from None
        return b"".join(chunks)

    async def _take(self, request: Request, held: list[int], chunks: list[bytes]) -> None:
        limit = self.limits.max_body_bytes
        async for chunk in request.stream():
            if not chunk:
                continue
            if held[0] + len(chunk) > limit:
                raise Oversized(f"the request body is over --max-body-bytes ({limit})")
            if self.held + len(chunk) > self.limits.max_buffered_bytes:
                raise Overloaded(f"the gateway holds {self.held} bytes of request bodies (--max-buffered-"
                                 f"bytes {self.limits.max_buffered_bytes}): try again shortly")
            self.held += len(chunk)
            held[0] += len(chunk)
            chunks.append(chunk)

    def release(self, request: Request) -> None:
        held = request.scope.get("stream.body_held")
        if held:
            self.held -= held[0]
            held[0] = 0


TLS_READ_BUFFER = 32 * 1024  # asyncio's own is 256 KiB, allocated for every connection from its accept


def shrink_tls_buffers() -> None:
    """asyncio's TLS connections each allocate a read buffer of ``SSLProtocol.max_size`` when accepted, before
    their handshake: 256 KiB, so that a few thousand silent connections cost a gigabyte. A TLS record holds at most
    16 KiB: 32 KiB reads them as fast (process-wide; the gateway's process serves nothing else)."""
    import asyncio.sslproto

    asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER


def with_tls_handshake_timeout(factory: Callable[[], asyncio.AbstractEventLoop], timeout_s: float
                               ) -> Callable[[], asyncio.AbstractEventLoop]:
    """A loop factory whose servers give a TLS handshake ``timeout_s`` (asyncio's and uvloop's own is 60 s, and
    uvicorn does not pass one)."""
    def make() -> asyncio.AbstractEventLoop:
        loop = factory()
        create_server = loop.create_server

        async def create(*args: Any, **kwargs: Any) -> asyncio.Server:
            if kwargs.get("ssl") is not None:
                kwargs.setdefault("ssl_handshake_timeout", timeout_s)
            return await create_server(*args, **kwargs)

        loop.create_server = create  # type: ignore[method-assign]
        return loop

    return make
