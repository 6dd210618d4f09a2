"""Events as callers send them (JSON objects of the input schema's fields) to records of the input topic: checked
against the schema (each problem named by its field; a field the schema does not have is one), encoded in the wire
format the workers read (magic byte, schema id, Avro), and refused when larger than ``--max-input-bytes``.

`json_schema` turns the Avro schema into the JSON Schema of such an event, for the gateway's OpenAPI document.
"""

from __future__ import annotations

from collections.abc import Mapping
from io import BytesIO
from typing import Any

from fastavro import parse_schema, schemaless_writer
from fastavro.validation import ValidationError, validate

from stream.codec import MAGIC, strip_logical_types
from stream.codec.registry import WriterSchema
from stream.errors import ConfigError, StreamError
from stream.gateway.errors import Oversized, Refused
from stream.gateway.texts import kind_of

_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)


def _problems(exc: ValidationError) -> list[str]:
    """fastavro's validation errors, one line each: the field's path and why."""
    out = []
    for err in exc.errors:
        path = getattr(err, "field", None) or "the event"
        datum = getattr(err, "datum", None)
        schema = getattr(err, "schema", None)
        expected = schema.get("type") if isinstance(schema, dict) else schema
        out.append(f"{path}: {datum!r:.80} is not {expected}" if expected is not None else str(err))
    return out or [str(exc)]


class EventEncoder:
    """The input schema's events to framed records (see the module's docstring)."""

    def __init__(self, schema: WriterSchema, max_input_bytes: int, key_field: str | None = None) -> None:
        """``key_field``: the string field whose value is each event's Kafka record key (`key_of`); None: ``key``
        where the schema has a string field of that name, else no key; "": no key."""
        if schema.schema_id < 0:
            raise StreamError("the input schema must be registered (it has no id to put in the wire format)")
        self.schema_name = schema.name
        self.max_input_bytes = max_input_bytes
        raw = schema.normalized
        self._parsed: Any = parse_schema(strip_logical_types(raw))
        fields = ({f["name"]: f for f in raw["fields"]} if isinstance(raw, dict) and raw.get("type") == "record"
                  else None)
        self._fields = set(fields) if fields is not None else None
        self.key_field = _key_field(schema.name, fields or {}, key_field)
        self._header = bytes([MAGIC]) + schema.schema_id.to_bytes(4, "big")
        self.json_schema = json_schema(raw)

    def key_of(self, event: Mapping[str, Any]) -> bytes | None:
        """The event's Kafka record key: its ``key_field`` (UTF-8), none when that is null or there is none."""
        if self.key_field is None:
            return None
        value = event.get(self.key_field)
        return value.encode() if isinstance(value, str) else None

    def encode(self, event: Any) -> bytes:
        """The event framed for the input topic; `Refused` (which fields, why) or `Oversized`."""
        if not isinstance(event, Mapping):
            raise Refused("an event is a JSON object of its fields", problems=[f"got {type(event).__name__}"])
        if self._fields is not None:
            unknown = sorted(str(k) for k in event if k not in self._fields)
            if unknown:
                raise Refused(f"the event does not match the input schema {self.schema_name}",
                              problems=[f"{name}: no such field in {self.schema_name}" for name in unknown[:20]])
        record = dict(event)
        try:
            validate(record, self._parsed, raise_errors=True)
        except ValidationError as exc:
            raise Refused(f"the event does not match the input schema {self.schema_name}",
                          problems=_problems(exc)) from None
        out = BytesIO()
        out.write(self._header)
        try:
            schemaless_writer(out, self._parsed, record)
        except (ValueError, TypeError, OverflowError, UnicodeEncodeError) as exc:  # what validate lets through
            raise Refused(f"the event does not match the input schema {self.schema_name}",
                          problems=[f"the event: {exc}"]) from None
        value = out.getvalue()
        if len(value) > self.max_input_bytes:
            raise Oversized(f"the event is {len(value)} bytes encoded, over --max-input-bytes {self.max_input_bytes}")
        return value


def json_schema(avro: Any, names: dict[str, Any] | None = None, depth: int = 0) -> dict[str, Any]:
    """The JSON Schema of the JSON form of a value of ``avro`` (bytes and fixed as strings, timestamps as
    integers; a named type used again is inlined, to a bounded depth)."""
    names = {} if names is None else names
    if depth > 16:
        return {}
    if isinstance(avro, list):
        return {"anyOf": [json_schema(branch, names, depth + 1) for branch in avro]}
    if isinstance(avro, str):
        if avro in names:
            return json_schema(names[avro], names, depth + 1)
        return _primitive(avro)
    if not isinstance(avro, dict):
        return {}
    kind = avro.get("type")
    doc = {"description": avro["doc"]} if isinstance(avro.get("doc"), str) else {}
    if kind == "record":
        names[str(avro.get("name"))] = avro
        fields = avro.get("fields", [])
        return {"type": "object", **doc, "additionalProperties": False,
                "properties": {f["name"]: {**json_schema(f["type"], names, depth + 1),
                                           **({"description": f["doc"]} if isinstance(f.get("doc"), str) else {})}
                               for f in fields},
                "required": [f["name"] for f in fields if "default" not in f]}
    if kind == "array":
        return {"type": "array", "items": json_schema(avro.get("items"), names, depth + 1)}
    if kind == "map":
        return {"type": "object", "additionalProperties": json_schema(avro.get("values"), names, depth + 1)}
    if kind == "enum":
        names[str(avro.get("name"))] = avro
        return {"enum": list(avro.get("symbols", []))}
    if kind == "fixed":
        names[str(avro.get("name"))] = avro
        return {"type": "string"}
    return {**_primitive(kind), **doc} if isinstance(kind, str) else {}


def _primitive(name: str) -> dict[str, Any]:
    if name == "int":
        return {"type": "integer", "minimum": _INT32[0], "maximum": _INT32[1]}
    if name == "long":
        return {"type": "integer", "minimum": _INT64[0], "maximum": _INT64[1]}
    if name in ("float", "double"):
        return {"type": "number"}
    if name in ("string", "bytes"):
        return {"type": "string"}
    if name in ("boolean", "null"):
        return {"type": name}
    return {}


def _key_field(schema_name: str, fields: Mapping[str, Any], given: str | None) -> str | None:
    if given == "":
        return None
    name = given or "key"
    field = fields.get(name)
    is_string = field is not None and kind_of(field["type"]) == "string"
    if given and not is_string:
        raise ConfigError(f"--key-field {given}: the input schema {schema_name} "
                          + ("has no such field" if field is None else f"has it as a {kind_of(field['type'])}, "
                             "not a string"))
    return name if is_string else None
