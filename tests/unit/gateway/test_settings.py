"""The gateway's settings (`stream.gateway.settings`): one source for flags, variables, defaults and help."""

from __future__ import annotations

import argparse

import pytest
from pydantic import ValidationError

from stream.cli import build_parser
from stream.errors import ConfigError
from stream.gateway.settings import GatewaySettings, load_gateway_settings

BASE = {"input_topic": "in"}


def test_flags_win_over_variables_which_win_over_the_aliases_and_the_defaults() -> None:
    env = {"KAFKA_BOOTSTRAP_SERVERS": "alias:9092", "STREAM_GATEWAY_MAX_PENDING": "50", "STREAM_MODEL": "minilm",
           "STREAM_GATEWAY_TEXT_EVENT_FIELD": "key=a, ts_ms=1", "SCHEMA_REGISTRY_URL": "http://r"}
    settings = load_gateway_settings({**BASE, "max_pending": None, "timeout_ms": 900.0}, env)
    assert settings.bootstrap_servers == "alias:9092" and settings.max_pending == 50 and settings.timeout_ms == 900
    assert settings.model == "minilm" and settings.text_event_field == ["key=a", "ts_ms=1"]
    assert settings.schema_registry_url == "http://r" and settings.max_body_bytes == 1_048_576
    settings = load_gateway_settings({**BASE, "bootstrap_servers": "flag:1", "max_pending": 7},
                                     {**env, "STREAM_GATEWAY_BOOTSTRAP_SERVERS": "var:1"})
    assert settings.bootstrap_servers == "flag:1" and settings.max_pending == 7
    with pytest.raises(ValidationError, match="frozen"):
        settings.max_pending = 3  # type: ignore[misc]


@pytest.mark.parametrize(("given", "env", "says"), [
    ({}, {"KAFKA_BOOTSTRAP_SERVERS": "b"}, "--input-topic (STREAM_GATEWAY_INPUT_TOPIC): Field required"),
    (BASE, {}, "no brokers"),
    ({**BASE, "max_pending": 0}, {"KAFKA_BOOTSTRAP_SERVERS": "b"}, "--max-pending"),
    ({**BASE, "reply_partition": 4}, {"KAFKA_BOOTSTRAP_SERVERS": "b"}, "--reply-partition 4 is not one of"),
    ({**BASE, "ssl_certfile": "c.pem"}, {"KAFKA_BOOTSTRAP_SERVERS": "b"}, "both --ssl-certfile and --ssl-keyfile"),
    ({**BASE, "max_buffered_bytes": 2048, "max_body_bytes": 4096}, {"KAFKA_BOOTSTRAP_SERVERS": "b"},
     "cannot hold one body"),
    (BASE, {"KAFKA_BOOTSTRAP_SERVERS": "b", "STREAM_GATEWAY_MAX_PENDNG": "5"}, "STREAM_GATEWAY_MAX_PENDNG"),
    (BASE, {"KAFKA_BOOTSTRAP_SERVERS": "b", "STREAM_GATEWAY_PORT": "http"}, "--port (STREAM_GATEWAY_PORT)"),
])
def test_a_bad_setting_stops_the_start_naming_its_flag_and_variable(given: dict[str, object], env: dict[str, str],
                                                                    says: str) -> None:
    with pytest.raises(ConfigError, match=says.replace("(", r"\(").replace(")", r"\)")):
        load_gateway_settings(given, env)


def test_every_setting_is_a_flag_with_help_and_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    gateway = next(a for a in parser._subparsers._group_actions  # type: ignore[union-attr]
                   if isinstance(a, argparse._SubParsersAction)).choices["gateway"]
    flags = {a.dest: a for a in gateway._actions if a.dest != "help"}
    assert set(flags) == set(GatewaySettings.model_fields)
    for name, action in flags.items():
        assert action.help and action.default is None, name
    assert "(4096)" in flags["max_pending"].help and "(16,384)" in flags["max_header_bytes"].help
    with pytest.raises(SystemExit):
        parser.parse_args(["gateway", "--help"])
    shown = capsys.readouterr().out
    for group in ("Kafka:", "requests:", "schemas and model:", "serving:", "limits:"):
        assert group in shown
    args = parser.parse_args(["gateway", "--input-topic", "t", "--api-key", "a" * 20, "--api-key", "b" * 20])
    assert args.api_key == ["a" * 20, "b" * 20] and args.max_pending is None


def test_the_gateway_s_default_event_size_is_what_the_worker_takes_by_default() -> None:
    from stream.config import WorkerSettings
    from stream.gateway import WORKER_MAX_INPUT_BYTES

    assert WorkerSettings.model_fields["max_input_bytes"].default == WORKER_MAX_INPUT_BYTES


def test_the_event_size_is_what_the_producer_and_the_topic_take(monkeypatch: pytest.MonkeyPatch) -> None:
    import stream.gateway as gateway_module

    topic: list[int | None] = [None]
    monkeypatch.setattr(gateway_module, "_topic_max_message_bytes", lambda settings, admin: topic[0])
    settings = load_gateway_settings({**BASE, "bootstrap_servers": "b"}, {})
    assert gateway_module._max_input_bytes(settings, {}, {}) == 1_000_000 - 1024
    assert gateway_module._max_input_bytes(settings, {"message.max.bytes": "500000"}, {}) == 500_000 - 1024
    assert gateway_module._max_input_bytes(settings, {"message.max.bytes": "9000000"}, {}) == 1_048_576
    topic[0] = 100_000
    assert gateway_module._max_input_bytes(settings, {}, {}) == 100_000 - 1024
    too_big = load_gateway_settings({**BASE, "bootstrap_servers": "b", "max_input_bytes": 200_000}, {})
    with pytest.raises(ConfigError, match=r"more than the broker takes.*max\.message\.bytes 100,000"):
        gateway_module._max_input_bytes(too_big, {}, {})
