"""The gateway's settings: frozen and validated, from flags > ``STREAM_GATEWAY_*`` variables > defaults, with one
source for each setting's default and help (the flags are made from the fields: `add_arguments`).

``KAFKA_BOOTSTRAP_SERVERS``, ``SCHEMA_REGISTRY_URL`` and ``STREAM_MODEL`` fill their settings when neither the
flag nor the ``STREAM_GATEWAY_*`` variable does; ``STREAM_GATEWAY_API_KEYS`` is a comma-separated list of keys; a
list setting's variable is comma-separated. Any other ``STREAM_GATEWAY_*`` variable is an error (a typo fails
loudly).
"""

from __future__ import annotations

import argparse
import os
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from stream.config import format_validation_error
from stream.errors import ConfigError
from stream.flags import add_setting_flags

ENV_PREFIX = "STREAM_GATEWAY_"
_ALIASES = {"bootstrap_servers": "KAFKA_BOOTSTRAP_SERVERS", "schema_registry_url": "SCHEMA_REGISTRY_URL",
            "model": "STREAM_MODEL"}
_ENV_NAMES = {"STREAM_GATEWAY_API_KEYS": "api_key"}  # variables named otherwise than their setting


def _field(default: Any, group: str, help: str, **more: Any) -> Any:
    return Field(default, description=help, json_schema_extra={"group": group}, **more)


class GatewaySettings(BaseModel):
    """Everything ``python -m stream gateway`` needs; invalid combinations fail before anything connects."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Kafka and the workers
    bootstrap_servers: str = _field("", "Kafka", "Kafka brokers, host:port,... (KAFKA_BOOTSTRAP_SERVERS; other "
                                                 "KAFKA_* variables as for the worker)")
    input_topic: str = _field(..., "Kafka", "the workers' input topic (required)", min_length=1, max_length=249)
    reply_topic: str | None = _field(None, "Kafka", "where workers send replies (default <input-topic>.replies, "
                                                    "the workers' default --reply-topics); created if missing",
                                     min_length=1, max_length=249)
    reply_partition: int = _field(0, "Kafka", "the partition of the reply topic this gateway reads: one per "
                                              "gateway replica", ge=0)
    reply_partitions: int = _field(4, "Kafka", "partitions of the reply topic when it is created here (room for "
                                               "as many replicas)", ge=1, le=10_000)
    worker_group: str | None = _field(None, "Kafka", "the workers' --group-id: readiness asks whether a member of "
                                                     "it holds the input topic's partitions (default: any group)",
                                      min_length=1)
    # Requests
    timeout_ms: float = _field(5000.0, "requests", "answer 504 when no prediction came within this long", gt=0,
                               le=3_600_000)
    max_pending: int = _field(4096, "requests", "answer 503 (429 on OpenAI's route) while this many events wait "
                                                "for their predictions; also the most events in one request",
                              ge=1, le=1_000_000)
    max_input_bytes: int | None = _field(None, "requests", "answer 413 for an event over this size encoded "
                                                           "(default: what the producer can send, its "
                                                           "message.max.bytes less 1 KiB for the key and headers, "
                                                           "at most the workers' default 1 MiB; give the workers' "
                                                           "--max-input-bytes if you changed theirs)", ge=16)
    key_field: str | None = _field(None, "requests", "the event's string field sent as its Kafka record key (each "
                                                     "key's events to one partition, in order; default: key, where "
                                                     "the input schema has it; \"\" for none)")
    max_texts: int = _field(2048, "requests", "/v1/embeddings and /embed: the most texts in one request (OpenAI's "
                                              "own limit; at most --max-pending)", ge=1)
    # Schemas and the model
    schema_registry_url: str | None = _field(None, "schemas and model", "a Confluent-compatible schema registry "
                                                                        "(SCHEMA_REGISTRY_URL); without it, "
                                                                        "--schemas-dir", min_length=1)
    schemas_dir: Path | None = _field(None, "schemas and model", "the schema folder (default: the repository's "
                                                                 "schemas/)")
    input_schema: str | None = _field(None, "schemas and model",
                                      "the events' schema: an .avsc file (registered under <input-topic>-value), or "
                                      "a subject (registry) / record name (folder); default as the worker's: with "
                                      "a registry <input-topic>-value, else the --model's own", min_length=1)
    model: str = _field("demo", "schemas and model",
                        "the workers' --model (STREAM_MODEL): what each event is checked against before it is sent, "
                        "and whose input schema is the default without a registry", min_length=1)
    model_dir: Path | None = _field(None, "schemas and model", "the workers' --model-dir")
    input_map: str | None = _field(None, "schemas and model", "the workers' --input-map (INPUT=FIELD,...)")
    output_schema: str | None = _field(None, "schemas and model",
                                       "the workers' prediction schema (a record name in the schema folder, or a "
                                       "subject), for the v2 model metadata's outputs; default: the --model's own, "
                                       "else none listed", min_length=1)
    served_model_name: str | None = _field(None, "schemas and model",
                                           "the model name OpenAI's API and the v2 protocol serve (/v1/models, "
                                           "/v2/models/NAME; a request naming another gets 404); default: the "
                                           "--model's own name (minilm: all-MiniLM-L6-v2), else --model",
                                           min_length=1)
    text_field: str | None = _field(None, "schemas and model",
                                    "/v1/embeddings and /embed: the input schema's field that gets each text "
                                    "(default: text); the other fields get fresh ids (strings), the time "
                                    "(timestamps) or their defaults", min_length=1)
    text_event_field: list[str] = _field([], "schemas and model", "NAME=VALUE: a value for another field of each "
                                                                  "text's event (repeatable)")
    embedding_field: str = _field("embedding", "schemas and model", "/v1/embeddings: the prediction's "
                                                                    "float-vector field", min_length=1)
    # Serving
    host: str = _field("127.0.0.1", "serving", "address to listen on (0.0.0.0: every interface)", min_length=1)
    port: int = _field(8080, "serving", "port to listen on", ge=1, le=65535)
    api_key: list[SecretStr] = _field([], "serving",
                                      "a key callers send as Authorization: Bearer KEY (repeatable; also "
                                      "STREAM_GATEWAY_API_KEYS, comma-separated); every route but the health "
                                      "probes needs one; without any key, anyone who can reach the port may call")
    api_key_file: list[Path] = _field([], "serving", "a file of keys, one a line (# comments), e.g. a mounted "
                                                     "Kubernetes secret; read again when it changes")
    ssl_certfile: Path | None = _field(None, "serving", "serve HTTPS with this certificate (PEM; with "
                                                        "--ssl-keyfile)")
    ssl_keyfile: Path | None = _field(None, "serving", "the certificate's private key (PEM)")
    loop: Literal["auto", "uvloop", "asyncio"] = _field(
        "auto", "serving", "the event loop: asyncio's own, or uvloop (install it yourself: it measured no faster "
                           "here, docs/gateway.md); auto: uvloop when installed, except with HTTPS (its TLS holds "
                           "more memory per connection)")
    shutdown_timeout_s: float = _field(30.0, "serving", "on SIGTERM, how long to wait for the requests in flight",
                                       gt=0, le=3600)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = _field("INFO", "serving", "the log's level")
    # Limits on what one caller can hold (before authentication)
    max_body_bytes: int = _field(1_048_576, "limits", "answer 413 for a body over this size", ge=1024,
                                 le=1_073_741_824)
    max_buffered_bytes: int = _field(64 * 1_048_576, "limits",
                                     "answer 503 while the bodies of the requests in flight hold this many bytes",
                                     ge=1024, le=68_719_476_736)
    max_header_bytes: int = _field(16_384, "limits", "answer 431 for a request line and headers over this size",
                                   ge=1024, le=1_048_576)
    max_connections: int = _field(1000, "limits", "close connections past this many at once, with a 503", ge=1,
                                  le=1_000_000)
    header_timeout_s: float = _field(10.0, "limits", "close a connection that sent no complete request headers "
                                                     "for this long (408)", gt=0, le=3600)
    body_timeout_s: float = _field(30.0, "limits", "answer 408 to a request whose body did not arrive within this "
                                                   "long after its headers", gt=0, le=3600)
    tls_handshake_timeout_s: float = _field(10.0, "limits", "close a connection whose TLS handshake takes longer",
                                            gt=0, le=3600)
    keep_alive_s: float = _field(5.0, "limits", "close an idle keep-alive connection after this long", gt=0,
                                 le=3600)

    @model_validator(mode="after")
    def _check(self) -> GatewaySettings:
        if not self.bootstrap_servers:
            raise ValueError("no brokers: pass --bootstrap-servers or set KAFKA_BOOTSTRAP_SERVERS")
        if self.reply_partition >= self.reply_partitions:
            raise ValueError(f"--reply-partition {self.reply_partition} is not one of the reply topic's "
                             f"{self.reply_partitions} partitions (--reply-partitions)")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("HTTPS needs both --ssl-certfile and --ssl-keyfile")
        if self.max_buffered_bytes < self.max_body_bytes:
            raise ValueError(f"--max-buffered-bytes {self.max_buffered_bytes} cannot hold one body of "
                             f"--max-body-bytes {self.max_body_bytes}")
        return self


def load_gateway_settings(given: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> GatewaySettings:
    """Settings from flags (``given``; None and empty lists: not given), then ``STREAM_GATEWAY_*``, then the
    aliases, then defaults; ConfigError with one line per bad setting."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    unknown = []
    for name, raw in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        setting = _ENV_NAMES.get(name, name[len(ENV_PREFIX):].lower())
        if setting not in GatewaySettings.model_fields:
            unknown.append(name)
            continue
        values[setting] = [v.strip() for v in raw.split(",") if v.strip()] if _is_list(setting) else raw
    if unknown:
        raise ConfigError(f"unknown gateway setting(s) {', '.join(sorted(unknown))}: the STREAM_GATEWAY_* "
                          "variables are the flags' names (python -m stream gateway --help)")
    if "api_key" in values and not values["api_key"]:
        raise ConfigError("STREAM_GATEWAY_API_KEYS is set but holds no key (a missing secret?): refusing to start a "
                          "gateway anyone may call; unset it to mean that")
    for setting, variable in _ALIASES.items():
        if setting not in values and env.get(variable):
            values[setting] = env[variable]
    values.update({k: v for k, v in given.items() if v is not None and v != []})
    try:
        return GatewaySettings.model_validate(values)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, "gateway", ENV_PREFIX)) from None


def _is_list(setting: str) -> bool:
    return typing.get_origin(GatewaySettings.model_fields[setting].annotation) is list


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """A flag per setting, grouped by the field's group, its help and default from the field (defaults are
    applied by `load_gateway_settings`: a flag left out is None here)."""
    add_setting_flags(parser, GatewaySettings.model_fields)
