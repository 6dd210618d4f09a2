"""OpenTelemetry spans, configured by OpenTelemetry's own environment variables: ``OTEL_EXPORTER_OTLP_ENDPOINT``
(or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) turns them on, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``,
``OTEL_TRACES_SAMPLER`` and ``OTEL_BSP_*`` mean what they mean to any OpenTelemetry SDK; ``OTEL_SDK_DISABLED=true``
or ``OTEL_TRACES_EXPORTER=none`` turn them off. Spans go out over OTLP/HTTP (protobuf) from a background thread
with a bounded queue (``OTEL_BSP_MAX_QUEUE_SIZE``, 2,048: a collector that is down costs dropped spans, not memory).
Without an endpoint the SDK is not even imported; with one and without the SDK (the ``otel`` extra), the process
refuses to start, naming the extra.

What is traced:

* the gateway: one SERVER span per HTTP request, a child of the caller's ``traceparent`` when it sends one; the
  events it produces carry this span's context, so that the worker's spans join the caller's trace;
* the worker: each record that arrives with a ``traceparent`` (and only those: an untraced stream pays one dict
  check per batch) gets a CONSUMER span ``process <topic>``, from the record's Kafka timestamp until its prediction
  or dead letter is acknowledged, with four children: ``kafka`` (timestamp to taken by the consumer), ``batch``
  (taken to on the device), ``device`` (the forward pass, a record the decode stage refused has none) and
  ``publish`` (to acknowledged); each batch that carried traced records gets an ``inference batch`` span, from its
  close to the end of its forward pass, linked to those records' spans.

The SDK's default sampler follows the caller: a ``traceparent`` whose sampled flag is off gets no span (and costs
next to nothing). Each span costs the worker tens of µs of CPU (made, then encoded for export): tracing every
record of a fast stream slows it many times (docs/gateway.md has the figures), so sample upstream; at most
``--max-traced-per-s`` records a second get spans (`BatchTraces`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from stream.errors import ConfigError

log = logging.getLogger(__name__)

EXTRA = "otel"  # the package extra that brings the SDK and its OTLP/HTTP exporter


def _endpoint(env: Mapping[str, str]) -> str | None:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return None
    return (env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "").strip() \
        or None


@dataclass
class Tracing:
    """A tracer and the provider whose background thread exports its spans."""

    tracer: Any
    provider: Any
    _propagator: Any = field(default=None, repr=False)
    # the sampler follows a remote parent's sampled flag (OTEL_TRACES_SAMPLER parentbased_*, the default): a
    # record whose traceparent has it off is skipped before any SDK call
    follows_parent: bool = True

    def context_of(self, headers: Mapping[str, str]) -> Any:
        """The OpenTelemetry context of a W3C ``traceparent`` (and ``tracestate``) in ``headers``; an invalid one
        gives a context without a parent (W3C: restart the trace)."""
        return self._propagator.extract(headers)

    def headers_of(self, span: Any) -> list[tuple[str, bytes]]:
        """``span``'s context as W3C trace-context headers."""
        from opentelemetry.trace import set_span_in_context

        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=set_span_in_context(span))
        return [(k, v.encode()) for k, v in carrier.items()]

    def shutdown(self) -> None:
        """Export what is queued (bounded by the exporter's timeout) and stop the background thread."""
        self.provider.shutdown()


def tracing_from_env(service_name: str, env: Mapping[str, str] | None = None) -> Tracing | None:
    """The process's tracing when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the traces one) is set, else None;
    ConfigError for an endpoint that is not an http(s) URL, a protocol other than http/protobuf, or a missing SDK.
    ``service_name``: ``service.name`` unless ``OTEL_SERVICE_NAME`` names one."""
    env = os.environ if env is None else env
    endpoint = _endpoint(env)
    if endpoint is None:
        return None
    where = urlsplit(endpoint)
    if where.scheme not in ("http", "https") or not where.hostname:
        raise ConfigError(f"OTEL_EXPORTER_OTLP_ENDPOINT {endpoint!r}: an http:// or https:// URL is needed (OTLP "
                          "over HTTP, e.g. http://127.0.0.1:4318)")
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "http/protobuf").strip()
    if protocol != "http/protobuf":
        raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL {protocol!r}: spans go out as http/protobuf only (a "
                          "collector's OTLP/HTTP receiver, port 4318 by default); unset it or set http/protobuf")
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError as exc:
        raise ConfigError(f"OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is not installed ({exc}): "
                          f"pip install 'kafka-microbatch-inference[{EXTRA}]' (the image has it), or unset it"
                          ) from None
    # Resource.create reads OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME; the attributes given here win, so
    # service.name is given only when the operator named none.
    named = env.get("OTEL_SERVICE_NAME") or "service.name=" in env.get("OTEL_RESOURCE_ATTRIBUTES", "")
    provider = TracerProvider(resource=Resource.create({} if named else {"service.name": service_name}),
                              shutdown_on_exit=False)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    from opentelemetry.sdk.trace.sampling import ParentBased

    from stream import __version__

    log.info("tracing: spans of records and requests with a trace context go to %s (OTLP/HTTP)", endpoint)
    return Tracing(provider.get_tracer("stream", __version__), provider, TraceContextTextMapPropagator(),
                   isinstance(provider.sampler, ParentBased))


@dataclass
class RecordTrace:
    """One traced record's span, open until its prediction (or dead letter) is acknowledged."""

    span: Any
    inferred_ns: int  # the end of its batch's forward pass (or its close, when it never reached the model)


def _sampled(traceparent: str) -> bool:
    """A W3C traceparent's sampled flag (False for one too short to have it)."""
    flags = traceparent.strip()[53:55]
    try:
        return len(flags) == 2 and bool(int(flags, 16) & 1)
    except ValueError:
        return False


def _ms_to_ns(ms: int) -> int:
    return ms * 1_000_000


class BatchTraces:
    """The worker's side: the spans of a batch's traced records (see the module's docstring)."""

    def __init__(self, tracing: Tracing, topic: str, model: str, max_per_s: float = 200.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``max_per_s``: the most records traced a second (a token bucket of one second's worth): a sampled
        record costs the worker about half a millisecond, so a producer that put a sampled ``traceparent`` on
        every record could otherwise slow it a hundredfold; the records over it are carried, not traced."""
        self._tracing = tracing
        self._topic = topic
        self._model = model
        self._name = f"process {topic}"
        self._rate = max_per_s
        self._tokens = max_per_s
        self._clock = clock
        self._refilled = clock()
        self.skipped = 0  # sampled records left untraced by the budget

    def _allow(self) -> bool:
        now = self._clock()
        self._tokens = min(self._rate, self._tokens + (now - self._refilled) * self._rate)
        self._refilled = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.skipped += 1
        if self.skipped in (1, 1000) or self.skipped % 100_000 == 0:
            log.warning("tracing: %d sampled records left untraced, over --max-traced-per-s %g", self.skipped,
                        self._rate)
        return False

    def start(self, traced: Mapping[int, Sequence[tuple[str, Any]]], times: Mapping[int, tuple[int | None, int | None]],
              partitions: Sequence[int], offsets: Sequence[int], *, batch_size: int, closed_ns: int,
              submitted_ns: int | None, inferred_ns: int, dead: Mapping[int, str]) -> dict[int, RecordTrace]:
        """{row: its open span} of the rows of ``traced`` (row: its carried headers) whose ``traceparent`` is
        valid. ``times``: row -> (Kafka timestamp ms, taken ns); ``submitted_ns``: when the batch went to the
        model (None: it did not); ``dead``: row -> the stage that dead-lettered it. The batch span is ended here."""
        from opentelemetry.trace import Link, SpanKind, Status, StatusCode, get_current_span, set_span_in_context

        tracer = self._tracing.tracer
        follows = self._tracing.follows_parent
        out: dict[int, RecordTrace] = {}
        for row, headers in traced.items():
            carrier = {k: v.decode("latin-1") if isinstance(v, bytes) else str(v) for k, v in headers
                       if k in ("traceparent", "tracestate")}
            if "traceparent" not in carrier or (follows and not _sampled(carrier["traceparent"])):
                continue
            if not self._allow():
                continue
            parent = self._tracing.context_of(carrier)
            if not get_current_span(parent).get_span_context().is_valid:
                continue
            ts_ms, taken_ns = times.get(row, (None, None))
            taken = min(taken_ns or closed_ns, closed_ns)
            start = min(_ms_to_ns(ts_ms), taken) if ts_ms is not None else taken
            span = tracer.start_span(self._name, context=parent, kind=SpanKind.CONSUMER, start_time=start,
                                     attributes={"messaging.system": "kafka", "messaging.operation.type": "process",
                                                 "messaging.destination.name": self._topic,
                                                 "messaging.destination.partition.id": str(partitions[row]),
                                                 "messaging.kafka.offset": int(offsets[row]),
                                                 "messaging.batch.message_count": batch_size})
            if not span.is_recording():  # not sampled (by default: the caller's traceparent says so)
                continue
            inside = set_span_in_context(span)
            stage = dead.get(row)
            on_device = submitted_ns if submitted_ns is not None and stage in (None, "model") else None
            steps = [("kafka", start, taken), ("batch", taken, closed_ns if on_device is None else on_device)]
            if on_device is not None:
                steps.append(("device", on_device, inferred_ns))
            for name, begin, end in steps:
                tracer.start_span(name, context=inside, start_time=begin).end(end_time=max(begin, end))
            if stage is not None:
                span.set_attribute("stream.dead_letter.stage", stage)
                span.set_status(Status(StatusCode.ERROR, f"dead-lettered at the {stage} stage"))
            out[row] = RecordTrace(span, closed_ns if on_device is None else inferred_ns)
        if out:
            links = [Link(t.span.get_span_context()) for t in out.values()]
            batch = tracer.start_span("inference batch", links=links, start_time=closed_ns,
                                      attributes={"stream.batch.size": batch_size, "stream.model": self._model,
                                                  "stream.batch.traced": len(out)})
            batch.end(end_time=max(closed_ns, inferred_ns))
        return out

    def published(self, traces: Sequence[RecordTrace]) -> None:
        """Their predictions (or dead letters) are acknowledged: each record's ``publish`` step, and its end."""
        from opentelemetry.trace import set_span_in_context

        now = time.time_ns()
        tracer = self._tracing.tracer
        for t in traces:
            begin = min(t.inferred_ns, now)
            tracer.start_span("publish", context=set_span_in_context(t.span), start_time=begin).end(end_time=now)
            t.span.end(end_time=now)


_serving: Tracing | None = None  # the gateway's, once `RequestSpans` wraps its app


def request_trace_headers() -> list[tuple[str, bytes]] | None:
    """The gateway's side: the trace-context headers of the request span now current (the events of a request
    carry them), or None when the gateway does not trace."""
    if _serving is None:
        return None
    from opentelemetry.trace import get_current_span

    span = get_current_span()
    return _serving.headers_of(span) if span.get_span_context().is_valid else None


# Probes and scrapes (every few seconds from a kubelet or Prometheus) get no span.
UNTRACED_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/v2/health/live", "/v2/health/ready"})


class RequestSpans:
    """ASGI middleware: one SERVER span per HTTP request but probes and scrapes (`UNTRACED_PATHS`), a child of
    the caller's ``traceparent`` (when valid), named by its method and path (the method alone for a path no route
    serves, so that callers cannot fill a tracing backend with names), current while the request is served."""

    def __init__(self, app: Any, tracing: Tracing) -> None:
        global _serving
        self.app = app
        self._tracing = tracing
        _serving = tracing

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("path") in UNTRACED_PATHS:
            await self.app(scope, receive, send)
            return
        from opentelemetry import context
        from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

        carrier = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ())
                   if k in (b"traceparent", b"tracestate")}
        parent = self._tracing.context_of(carrier) if "traceparent" in carrier else None
        method = str(scope.get("method", "GET"))[:20]
        path = str(scope.get("path", ""))[:200]
        span = self._tracing.tracer.start_span(f"{method} {path}", context=parent, kind=SpanKind.SERVER,
                                               attributes={"http.request.method": method, "url.path": path})
        status = 0

        async def sending(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        token = context.attach(set_span_in_context(span))
        try:
            await self.app(scope, receive, sending)
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            context.detach(token)
            if status:
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
                if status in (404, 405):
                    span.update_name(method)
            span.end()
