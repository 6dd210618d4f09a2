"""The worker's spans are bounded: a producer that puts a sampled traceparent on every record gets at most
``--max-traced-per-s`` records a second traced (`stream.ops.tracing.BatchTraces`); the rest are carried only."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from stream.ops.tracing import BatchTraces, Tracing


def test_records_over_the_budget_are_not_traced_and_the_budget_refills() -> None:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    tracing = Tracing(provider.get_tracer("test"), provider, TraceContextTextMapPropagator())
    now = [100.0]
    traces = BatchTraces(tracing, "in", "m", max_per_s=3, clock=lambda: now[0])
    traced = {row: [("traceparent", b"00-%032x-%016x-01" % (row + 1, row + 1))] for row in range(10)}

    def batch() -> int:
        started = traces.start(traced, {}, [0] * 10, list(range(10)), batch_size=10, closed_ns=1_000,
                               submitted_ns=2_000, inferred_ns=3_000, dead={})
        traces.published(list(started.values()))
        return len(started)

    assert batch() == 3 and traces.skipped == 7  # a burst: one second's budget
    now[0] += 0.5
    assert batch() == 1  # half a second later: 1.5 records' worth
    now[0] += 10
    assert batch() == 3  # refilled, never past one second's worth
    names = [s.name for s in spans.get_finished_spans()]
    assert names.count("process in") == 7 and names.count("device") == 7 and names.count("inference batch") == 3
