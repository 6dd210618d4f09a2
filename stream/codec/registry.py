"""Where schemas come from: a Confluent-compatible schema registry over HTTP, or the local ``schemas/`` folder.

Both answer the same three questions: the writer schema of an id (cached; None for an id nobody registered), the
latest schema of a subject, and the id of a schema registered under a subject. A registry that cannot be
reached raises `RegistryUnavailable` (the caller retries; it never takes the record for bad).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Any, Literal, Protocol

from fastavro import parse_schema, schemaless_reader

from stream.codec import MAGIC, strip_logical_types
from stream.codec.columns import normalize
from stream.errors import ConfigError, StreamError

log = logging.getLogger(__name__)
SubjectNameStrategy = Literal["topic", "record", "topic-record"]


class RegistryUnavailable(StreamError):
    """The schema registry did not answer (network, timeout, 5xx): try again later."""


@dataclass(frozen=True)
class WriterSchema:
    """A schema as a registry holds it: its id, its JSON, and the same normalised (named types expanded)."""

    schema_id: int
    raw: Any
    normalized: Any

    @property
    def name(self) -> str:
        return str(self.normalized.get("name", "")) if isinstance(self.normalized, Mapping) else ""


class SchemaSource(Protocol):
    description: str

    def close(self) -> None:
        """Release connections."""

    def by_id(self, schema_id: int) -> WriterSchema | None:
        """The schema registered under ``schema_id``, None when there is none; RegistryUnavailable."""

    def latest(self, subject: str) -> WriterSchema:
        """The subject's latest version; ConfigError when there is no such subject; RegistryUnavailable."""

    def register(self, subject: str, schema: Mapping[str, Any]) -> WriterSchema:
        """Register ``schema`` under ``subject`` (or find it there); ConfigError when the registry's
        compatibility check refuses it; RegistryUnavailable."""


def subject_name(strategy: SubjectNameStrategy, topic: str, record_name: str, *, key: bool = False) -> str:
    """Confluent's subject name strategies: TopicNameStrategy ``<topic>-value``, RecordNameStrategy
    ``<record full name>``, TopicRecordNameStrategy ``<topic>-<record full name>``."""
    if strategy == "topic":
        return f"{topic}-{'key' if key else 'value'}"
    if strategy == "record":
        return record_name
    if strategy == "topic-record":
        return f"{topic}-{record_name}"
    raise ConfigError(f"unknown subject name strategy {strategy!r} (topic, record, topic-record)")


def full_name(schema: Mapping[str, Any]) -> str:
    name = str(schema["name"])
    namespace = schema.get("namespace")
    return name if "." in name or not namespace else f"{namespace}.{name}"


class HttpRegistry:
    """A Confluent-compatible schema registry (Confluent's, Apicurio's ``/apis/ccompat/v7``, Redpanda's, ...)
    through ``confluent_kafka.schema_registry``. Writer schemas are cached by id for the life of the process
    (an id's schema never changes); ``conf`` takes the client's settings (``basic.auth.user.info``,
    ``ssl.ca.location``, ``timeout``, ...)."""

    def __init__(self, url: str, conf: Mapping[str, Any] | None = None) -> None:
        try:
            from confluent_kafka.schema_registry import SchemaRegistryClient
        except ImportError as exc:  # the schemaregistry extra's packages
            raise ConfigError(f"--schema-registry-url needs confluent-kafka's schema registry client: {exc}") from exc
        settings = {"timeout": 10, **(conf or {}), "url": url}
        try:
            self._client = SchemaRegistryClient(settings)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"schema registry settings: {exc}") from exc
        self.description = url
        self._by_id: dict[int, WriterSchema] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> HttpRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            return fn(*args)
        except SchemaRegistryError as exc:
            if exc.http_status_code >= 500 or exc.http_status_code in (408, 429):
                raise RegistryUnavailable(f"schema registry {self.description}: {what}: {exc}") from None
            raise
        except Exception as exc:  # httpx2 transport errors, timeouts
            raise RegistryUnavailable(f"schema registry {self.description}: {what}: {type(exc).__name__}: "
                                      f"{exc}") from None

    def _parsed(self, schema_id: int, schema: Any) -> WriterSchema:
        if schema.schema_type not in (None, "AVRO"):
            raise ConfigError(f"schema id {schema_id} is a {schema.schema_type} schema, not Avro")
        named: dict[str, Any] = {}
        for ref in schema.references or []:  # referenced schemas define named types first
            referenced = self._call(f"reference {ref.subject} v{ref.version}", self._client.get_version, ref.subject,
                                    ref.version)
            normalize(json.loads(referenced.schema.schema_str), named)
        raw = json.loads(schema.schema_str)
        return WriterSchema(schema_id, raw, normalize(raw, named))

    def by_id(self, schema_id: int) -> WriterSchema | None:
        cached = self._by_id.get(schema_id)
        if cached is not None:
            return cached
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            schema = self._call(f"schema id {schema_id}", self._client.get_schema, schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                return None
            raise RegistryUnavailable(f"schema registry {self.description}: schema id {schema_id}: {exc}") from None
        try:
            found = self._parsed(schema_id, schema)
        except ConfigError as exc:
            log.warning("schema id %d cannot be read: %s", schema_id, exc)
            return None
        with self._lock:
            self._by_id[schema_id] = found
        return found

    def latest(self, subject: str) -> WriterSchema:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            registered = self._call(f"subject {subject}", self._client.get_latest_version, subject)
        except SchemaRegistryError as exc:
            raise ConfigError(f"schema registry {self.description}: subject {subject!r}: {exc}") from None
        return self._parsed(registered.schema_id, registered.schema)

    def register(self, subject: str, schema: Mapping[str, Any]) -> WriterSchema:
        from confluent_kafka.schema_registry import Schema
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        text = json.dumps(schema)
        try:
            schema_id = self._call(f"register under {subject}", self._client.register_schema, subject,
                                   Schema(text, "AVRO"))
        except SchemaRegistryError as exc:
            raise ConfigError(f"schema registry {self.description} refused the schema under {subject!r}: "
                              f"{exc}") from None
        return WriterSchema(int(schema_id), schema, normalize(schema))


class FolderRegistry:
    """The local ``schemas/`` folder (``registry.json``: id -> ``.avsc`` file): a subject is a record's full
    name, its latest version the highest id of that name; nothing can be registered at run time."""

    def __init__(self, schemas: Mapping[int, Any], description: str) -> None:
        self.description = description
        self._by_id = {i: WriterSchema(i, raw, normalize(raw)) for i, raw in schemas.items()}

    @classmethod
    def from_dir(cls, path: Path | None = None) -> FolderRegistry:
        from stream.codec import read_schema_folder

        folder, schemas = read_schema_folder(path)
        return cls(dict(schemas), f"the schema folder {folder}")

    def by_id(self, schema_id: int) -> WriterSchema | None:
        return self._by_id.get(schema_id)

    def close(self) -> None:
        pass

    def latest(self, subject: str) -> WriterSchema:
        found = [s for s in self._by_id.values() if subject in (s.name, s.name.rpartition(".")[2])]
        if not found:
            raise ConfigError(f"schema {subject!r} is not in {self.description}")
        return max(found, key=lambda s: s.schema_id)

    def register(self, subject: str, schema: Mapping[str, Any]) -> WriterSchema:
        wanted = normalize(schema)
        for found in sorted(self._by_id.values(), key=lambda s: -s.schema_id):
            if found.normalized == wanted:
                return found
        raise ConfigError(f"schema {full_name(schema)} is not in {self.description}: add it there with an id, or "
                          "use --schema-registry-url")


def registry_env_config(environ: Mapping[str, str]) -> dict[str, Any]:
    """The schema registry client's settings from ``SCHEMA_REGISTRY_*`` variables (the ``KAFKA_*`` naming rule:
    ``SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO`` -> ``basic.auth.user.info``); ``SCHEMA_REGISTRY_URL`` is the URL."""
    from stream.kafka_env import env_to_librdkafka_key

    prefix = "SCHEMA_REGISTRY_"
    return {env_to_librdkafka_key(k[len(prefix):]): _number_or_text(v) for k, v in environ.items()
            if k.startswith(prefix) and k != "SCHEMA_REGISTRY_URL"}


def _number_or_text(value: str) -> Any:
    """The client checks types: ``timeout``, ``max.retries``, ``cache.capacity``, ... are numbers."""
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def open_source(url: str | None, folder: Path | None, environ: Mapping[str, str] | None = None) -> SchemaSource:
    """The registry at ``url`` (client settings from ``SCHEMA_REGISTRY_*``), else the schema folder."""
    if url:
        return HttpRegistry(url, registry_env_config(os.environ if environ is None else environ))
    return FolderRegistry.from_dir(folder)


def reader_schema(source: SchemaSource, given: str | None, default_subject: str | None) -> WriterSchema:
    """The schema the worker reads: ``given`` (an ``.avsc`` file, or a subject / record name in ``source``), else
    ``default_subject``'s latest version. RegistryUnavailable when the registry cannot be reached."""
    if given and given.endswith(".avsc"):
        path = Path(given)
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--input-schema {given}: {exc}") from exc
        return WriterSchema(-1, raw, normalize(raw))
    subject = given or default_subject
    if not subject:
        raise ConfigError("no input schema: pass --input-schema (an .avsc file, or a subject or record name)")
    return source.latest(subject)


class WireDecoder:
    """Confluent wire-format records -> dicts, each by its writer schema from ``source`` (parsed once per id);
    for the readers of whole records (the gateway's replies, ``stream compare``), not the worker's batches."""

    def __init__(self, source: SchemaSource) -> None:
        self.source = source
        self._parsed: dict[int, Any] = {}

    def __call__(self, value: bytes) -> dict[str, Any]:
        if len(value) < 5 or value[0] != MAGIC:
            raise StreamError("a record is not in the Confluent wire format")
        schema_id = int.from_bytes(value[1:5], "big")
        parsed = self._parsed.get(schema_id)
        if parsed is None:
            found = self.source.by_id(schema_id)
            if found is None:
                raise StreamError(f"schema id {schema_id} is unknown to {self.source.description}")
            parsed = self._parsed[schema_id] = parse_schema(strip_logical_types(found.normalized))
        record = schemaless_reader(BytesIO(value[5:]), parsed, None)
        if not isinstance(record, dict):
            raise StreamError(f"a record of schema id {schema_id} is not an Avro record")
        return record
