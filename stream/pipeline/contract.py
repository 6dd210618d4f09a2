"""The model's contract, checked by one function on both sides of the queue.

`DecodeStage.run` is the worker's decode stage: framed Avro values to the model's inputs, and the values it
dead-letters with why (the header, the writer schema, the size, bytes that do not follow their schema, a string
that is not UTF-8: `stream.codec.decoder`; a null where the model needs a value, a vector of the wrong length, NaN or
infinity, an empty text: `stream.pipeline.inputs`). The worker runs it on every batch (`stream.pipeline.processing`);
the gateway runs the same function on the events it is about to send (`stream.gateway.door`) and answers 422 for
any it would dead-letter, so an event that reaches the topic through the gateway cannot be dead-lettered for its
shape or values, and the two sides cannot drift apart.

What the model takes (its `InputSpec`s) is read without loading it where it can be: the built-in models from a
table (`stream.models.declared`, no torch), a ``package.module:Class`` handler and a model file with its
``stream.json`` from the handler made but not loaded; only a ``torch.export`` program without one is loaded (on
the CPU) to read its inputs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stream.codec.columns import Columns
from stream.codec.decoder import ColumnDecoder
from stream.codec.registry import SchemaSource, WriterSchema
from stream.errors import DecodeError
from stream.kafka.records import Records
from stream.models.declared import declared
from stream.models.spec import InputSpec
from stream.pipeline.inputs import InputBinder, input_side

log = logging.getLogger(__name__)


@dataclass
class Decoded:
    """A batch through the decode stage: the rows the model takes (``columns.index``: their positions in the
    batch), their inputs, and [(position, error)] for the rest, in position order."""

    columns: Columns
    inputs: dict[str, Any]
    errors: list[tuple[int, DecodeError]]


class DecodeStage:
    """Decode, then bind to the model's inputs (see the module's docstring)."""

    def __init__(self, decoder: ColumnDecoder, binder: InputBinder, max_input_bytes: int | None) -> None:
        self.decoder = decoder
        self.binder = binder
        self.max_input_bytes = max_input_bytes

    def run(self, values: Sequence[bytes | None] | Records) -> Decoded:
        """RegistryUnavailable when a writer schema must be fetched and the registry cannot be reached."""
        decoded, errors = self.decoder.decode_batch(values, self.max_input_bytes)
        inputs, good, bad = self.binder.bind(decoded)
        if bad:
            errors = sorted(errors + [(int(decoded.index[row]), err) for row, err in bad], key=lambda e: e[0])
            decoded = decoded.take(good)
        return Decoded(decoded, inputs, errors)


def decode_stage(inputs: Sequence[InputSpec], source: SchemaSource, reader: WriterSchema,
                 input_map: Mapping[str, str] | None, max_input_bytes: int | None,
                 copies: Sequence[tuple[str, str]] = ()) -> DecodeStage:
    """The decode stage of a model taking ``inputs`` from ``reader`` (ConfigError, one line per mismatch)."""
    decoder, binder = input_side(inputs, source, reader, input_map, copies)
    return DecodeStage(decoder, binder, max_input_bytes)


def model_inputs(model: str, model_dir: Path | None = None) -> tuple[InputSpec, ...]:
    """What ``--model`` takes, read without loading it where it can be (see the module's docstring)."""
    known = declared(model).inputs
    if known is not None:
        return known
    from stream.pipeline.inference import create_handler  # imports torch

    handler: Any = create_handler(model, model_dir)
    if not handler.inputs:  # a torch.export program that keeps its inputs only in the program itself
        import torch

        log.info("--model %s: loading it on the CPU to read its inputs", model)
        handler.load(torch.device("cpu"))
    inputs: tuple[InputSpec, ...] = tuple(handler.inputs)
    return inputs
