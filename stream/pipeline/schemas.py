"""The worker's two schemas, checked against its model at start-up: what it reads (the input side) and what it
writes (the prediction schema, registered under the output subject)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from stream.codec.columns import ColumnSpec
from stream.codec.decoder import ColumnDecoder
from stream.codec.encoder import OutputEncoder, derive_schema, parse_copy_fields
from stream.codec.registry import (
    FolderRegistry,
    RegistryUnavailable,
    SchemaSource,
    WriterSchema,
    full_name,
    open_source,
    reader_schema,
    subject_name,
)
from stream.config import WorkerSettings
from stream.errors import ConfigError
from stream.pipeline.inference import ModelHandler
from stream.pipeline.inputs import InputBinder, input_side, parse_input_map

log = logging.getLogger(__name__)


def build_codecs(settings: WorkerSettings, handler: ModelHandler,
                 ) -> tuple[ColumnDecoder, InputBinder, OutputEncoder, str | None]:
    """Both schemas, checked against the model at start-up (ConfigError, one line per mismatch; a registry that
    cannot be reached, too): the input decoder and binder, the prediction encoder (its schema registered under the
    output subject), and the input field holding each event's time (the one copied as ``event_ts_ms``), if any."""
    source = open_source(settings.schema_registry_url, settings.schemas_dir)
    try:
        default = f"{settings.input_topic}-value" if settings.schema_registry_url else getattr(
            handler, "input_schema", None)
        reader = reader_schema(source, settings.input_schema, default)
        copies = (parse_copy_fields(settings.copy_fields) if settings.copy_fields is not None
                  else list(getattr(handler, "copy_fields", ())))
        decoder, binder = input_side(handler.inputs, source, reader, parse_input_map(settings.input_map), copies)
        by_path = {c.path: c for c in decoder.columns}
        copied = [(name, by_path[path]) for name, path in copies]
        writer = _output_schema(settings, handler, source, copied)
    except RegistryUnavailable as exc:
        raise ConfigError(f"the schema registry cannot be reached at start-up: {exc}") from None
    encoder = OutputEncoder(writer, copied, handler.outputs)
    log.info("writing predictions as %s (id %d) to %s", writer.name, writer.schema_id, settings.output_topic)
    return decoder, binder, encoder, dict(copies).get("event_ts_ms")


def _output_schema(settings: WorkerSettings, handler: ModelHandler, source: SchemaSource,
                   copied: list[tuple[str, ColumnSpec]]) -> WriterSchema:
    given = settings.output_schema
    if given and not given.endswith(".avsc"):
        return source.latest(given)  # registered already: a subject, or a record name in the folder
    if given:
        try:
            raw = json.loads(Path(given).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--output-schema {given}: {exc}") from exc
    elif getattr(handler, "output_schema", None):  # the model's own, from the schema folder
        raw = FolderRegistry.from_dir(settings.schemas_dir).latest(handler.output_schema).raw  # type: ignore[attr-defined]
    else:
        raw = derive_schema(f"{handler.name}_prediction", "stream.predictions", copied, handler.outputs)
    subject = subject_name(settings.subject_name_strategy, settings.output_topic, full_name(raw))
    return source.register(subject, raw)
