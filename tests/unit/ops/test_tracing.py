"""When OpenTelemetry tracing is on, and the configurations it refuses (`stream.ops.tracing.tracing_from_env`)."""

from __future__ import annotations

import sys

import pytest

from stream.errors import ConfigError
from stream.ops.tracing import tracing_from_env

ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}


@pytest.mark.parametrize("env", [{}, {**ENDPOINT, "OTEL_SDK_DISABLED": "true"},
                                 {**ENDPOINT, "OTEL_TRACES_EXPORTER": "none"}, {"OTEL_EXPORTER_OTLP_ENDPOINT": " "}])
def test_without_an_endpoint_or_when_disabled_nothing_is_set_up(env: dict[str, str]) -> None:
    assert tracing_from_env("svc", env) is None


def test_an_endpoint_sets_up_an_exporting_tracer_named_by_the_service(monkeypatch: pytest.MonkeyPatch) -> None:
    for env, name in ((ENDPOINT, "svc"), ({**ENDPOINT, "OTEL_SERVICE_NAME": "mine"}, "mine"),
                      ({**ENDPOINT, "OTEL_RESOURCE_ATTRIBUTES": "team=a,service.name=theirs"}, "theirs"),
                      ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, "svc")):
        for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
                  "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
            monkeypatch.delenv(k, raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)  # the SDK reads the process's environment itself
        tracing = tracing_from_env("svc")
        assert tracing is not None
        try:
            assert tracing.provider.resource.attributes["service.name"] == name
            span = tracing.tracer.start_span("x", context=tracing.context_of(
                {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}))
            assert f"{span.get_span_context().trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
            assert dict(tracing.headers_of(span))["traceparent"].startswith(b"00-0af7651916cd43dd8448eb211c80319c-")
        finally:
            tracing.shutdown()


@pytest.mark.parametrize(("env", "message"), [
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "127.0.0.1:4317"}, "an http:// or https:// URL is needed"),
    ({**ENDPOINT, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "http/protobuf only"),
    ({**ENDPOINT, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, "http/protobuf only"),
])
def test_a_configuration_it_cannot_serve_is_refused_naming_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        tracing_from_env("svc", env)


def test_an_endpoint_without_the_sdk_installed_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry.sdk.trace", None)  # import fails as if not installed
    with pytest.raises(ConfigError, match=r"pip install 'kafka-microbatch-inference\[otel\]'"):
        tracing_from_env("svc", ENDPOINT)
