"""What a model takes and gives: the handler protocol's types (`stream.models` exports them).

A handler declares its inputs (`InputSpec`: a name, a dtype, a per-row shape) and outputs (`OutputSpec`: an Avro
type, or a vector such as an embedding); the pipeline binds the inputs to the reader schema's columns
(`stream.pipeline.inputs`) and the outputs to the output schema's fields (`stream.codec.encoder`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stream.errors import ConfigError

NUMERIC_DTYPES = ("float32", "float64", "int32", "int64", "bool")
INPUT_DTYPES = (*NUMERIC_DTYPES, "string", "bytes")
OUTPUT_TYPES = ("boolean", "int", "long", "float", "double", "string", "bytes")


@dataclass(frozen=True)
class InputSpec:
    """One model input: ``dtype`` per value, ``shape`` per row (``()`` one value, ``(k,)`` a vector of k)."""

    name: str
    dtype: str = "float32"
    shape: tuple[int, ...] = ()
    nonempty: bool = False  # strings and bytes: an empty value (a string of whitespace only, too) is refused
    # strings: the handler gets a `stream.models.text_buffer.TextBuffer` (the batch's UTF-8 bytes in one buffer, a
    # sequence of str decoded when read) instead of a list of str
    text_buffer: bool = False

    def __post_init__(self) -> None:
        if self.dtype not in INPUT_DTYPES:
            raise ConfigError(f"input {self.name}: dtype {self.dtype!r} is not one of {', '.join(INPUT_DTYPES)}")
        if len(self.shape) > 1 or any(k < 1 for k in self.shape):
            raise ConfigError(f"input {self.name}: shape {self.shape} must be () or (k,) with k >= 1")
        if self.shape and self.dtype not in NUMERIC_DTYPES:
            raise ConfigError(f"input {self.name}: a vector of {self.dtype} is not supported")
        if self.nonempty and self.dtype not in ("string", "bytes"):
            raise ConfigError(f"input {self.name}: nonempty applies to string and bytes inputs")
        if self.text_buffer and self.dtype != "string":
            raise ConfigError(f"input {self.name}: text_buffer applies to string inputs")

    def describe(self) -> str:
        return f"{self.dtype}[{self.shape[0]}]" if self.shape else self.dtype


@dataclass(frozen=True)
class OutputSpec:
    """One model output, one value per row: an Avro type (``float``, ``boolean``, ``string``, ...), or a vector
    (``array<float>``) of ``size`` values (an embedding)."""

    name: str
    type: str = "float"
    size: int = 0  # arrays: values per row (0: any)

    def __post_init__(self) -> None:
        inner = self.type[6:-1] if self.type.startswith("array<") and self.type.endswith(">") else self.type
        if inner not in OUTPUT_TYPES or (inner != self.type and inner not in ("float", "double", "int", "long")):
            raise ConfigError(f"output {self.name}: type {self.type!r} is not one of {', '.join(OUTPUT_TYPES)} "
                              "or array<float|double|int|long>")

    @property
    def avro(self) -> Any:
        if self.type.startswith("array<"):
            return {"type": "array", "items": self.type[6:-1]}
        return self.type
