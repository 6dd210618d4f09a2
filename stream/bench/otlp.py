"""An OTLP/HTTP trace receiver in this process: what the tracing benchmark and tests point
``OTEL_EXPORTER_OTLP_ENDPOINT`` at. It answers ``POST /v1/traces`` (protobuf, gzip or not) as a collector does,
decodes each request with OpenTelemetry's own protobuf classes (the ``otel`` extra) and keeps the spans it got
(their count only, with ``keep=False``)."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_REQUEST_BYTES = 64 << 20


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str  # hex
    span_id: str
    parent_id: str  # "" for a root span
    kind: int  # OTLP's Span.SpanKind: 2 server, 5 consumer, 1 internal
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...]  # (trace id, span id)
    status: int  # 0 unset, 1 ok, 2 error


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind in ("string_value", "int_value", "double_value", "bool_value") else str(v)


@dataclass
class OtlpReceiver:
    keep: bool = True
    spans: list[ReceivedSpan] = field(default_factory=list)
    count: int = 0
    requests: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    def start(self) -> str:
        """Listen on a free port of 127.0.0.1; returns the endpoint to give ``OTEL_EXPORTER_OTLP_ENDPOINT``."""
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length") or 0)
                if self.path != "/v1/traces" or not 0 < size <= MAX_REQUEST_BYTES:
                    self.send_error(404 if self.path != "/v1/traces" else 400)
                    return
                body = self.rfile.read(size)
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver._add(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_port}"

    def _add(self, request: Any) -> None:
        got: list[ReceivedSpan] = []
        n = 0
        for resource_spans in request.resource_spans:
            service = next((_value(a.value) for a in resource_spans.resource.attributes if a.key == "service.name"),
                           "")
            for scope_spans in resource_spans.scope_spans:
                n += len(scope_spans.spans)
                if not self.keep:
                    continue
                for s in scope_spans.spans:
                    got.append(ReceivedSpan(
                        service, s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(), s.kind,
                        s.start_time_unix_nano, s.end_time_unix_nano, {a.key: _value(a.value) for a in s.attributes},
                        tuple((link.trace_id.hex(), link.span_id.hex()) for link in s.links), s.status.code))
        with self._lock:
            self.requests += 1
            self.count += n
            self.spans += got

    def snapshot(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> OtlpReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
