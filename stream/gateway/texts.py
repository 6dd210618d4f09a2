"""Texts to events: how the gateway's text routes (OpenAI's ``/v1/embeddings``, TEI's ``/embed``) turn one input
text into one event of the input schema, so that the workers batch it with everything else on the topic.

For each top-level field of the input schema, decided once at start-up:

* the text field (``--text-field``; default the field named ``text``) gets the text;
* a field named in ``--text-event-field NAME=VALUE`` gets that value (converted to the field's type);
* a ``timestamp-millis`` / ``timestamp-micros`` field gets the time of the request;
* any other string field without a default (an event id, a business key) gets a fresh id (a UUID4's hex);
* a field with a default gets it;
* anything else is refused at start-up, naming the fields and the flag that fills them.

The demo's ``stream.demo.TextEvent`` works as is: ``text`` the text, ``event_id`` and ``key`` fresh ids,
``ts_ms`` the time."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stream.errors import ConfigError

_NUMBERS = {"int": int, "long": int, "float": float, "double": float}
_TIMESTAMPS = {"timestamp-millis": 1_000, "timestamp-micros": 1_000_000}


def _branches(avro_type: Any) -> list[Any]:
    return list(avro_type) if isinstance(avro_type, list) else [avro_type]


def kind_of(avro_type: Any) -> str:
    """A field's type reduced to what matters here: its primitive name or logical type, of its non-null branch
    when it is a union with null ('record', 'array', ... for the rest)."""
    rest = [b for b in _branches(avro_type) if b != "null"]
    if len(rest) != 1:
        return "union"
    t = rest[0]
    if isinstance(t, dict):
        return str(t.get("logicalType") or t.get("type"))
    return str(t)


def _convert(kind: str, name: str, value: str) -> Any:
    if kind == "string":
        return value
    if kind in _NUMBERS:
        try:
            return _NUMBERS[kind](value)
        except ValueError:
            raise ConfigError(f"--text-event-field {name}={value}: the field is {kind}") from None
    if kind == "boolean" and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ConfigError(f"--text-event-field {name}={value}: a {kind} field cannot be given as text")


class NoTextField(ConfigError):
    """The input schema has no field for a text (no ``--text-field`` named one): the text routes are off."""


def parse_field_values(items: Sequence[str]) -> dict[str, str]:
    """``NAME=VALUE`` flags as a dict (ConfigError for a malformed or repeated one)."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"--text-event-field {item!r}: expected NAME=VALUE")
        if name in out:
            raise ConfigError(f"--text-event-field {name} given twice")
        out[name] = value
    return out


@dataclass(frozen=True)
class Fill:
    """How a field of an event made by the gateway (not given by its caller) gets its value."""

    name: str
    how: str  # text, value, time, id, default
    value: Any = None

    def make(self, now: float) -> Any:
        if self.how == "time":
            return int(now * self.value)
        if self.how == "id":
            return uuid.uuid4().hex
        return self.value


def auto_fill(field: Mapping[str, Any]) -> Fill | None:
    """What the gateway puts in a field its caller left out: the time in a timestamp, a fresh id in a string
    without a default, its default; None when none of these fits."""
    kind = kind_of(field["type"])
    if kind in _TIMESTAMPS:
        return Fill(field["name"], "time", _TIMESTAMPS[kind])
    if kind == "string" and "default" not in field:
        return Fill(field["name"], "id")
    if "default" in field:
        return Fill(field["name"], "default", field["default"])
    return None


class TextEvents:
    """One event per text, by the rules in the module's docstring (``schema``: the input schema as JSON)."""

    def __init__(self, schema: Mapping[str, Any], text_field: str | None, values: Mapping[str, str]) -> None:
        if schema.get("type") != "record":
            raise ConfigError(f"the input schema {schema.get('name')} is not a record: texts cannot be put in it")
        fields = {f["name"]: f for f in schema["fields"]}
        self.text_field = text_field or "text"
        if self.text_field not in fields:
            error = ConfigError if text_field else NoTextField
            raise error(f"the input schema {schema.get('name')} has no field {self.text_field!r} for the "
                        f"text{'' if text_field else ' (--text-field names another)'}; it has {', '.join(fields)}")
        if kind_of(fields[self.text_field]["type"]) != "string":
            raise ConfigError(f"--text-field {self.text_field}: a {kind_of(fields[self.text_field]['type'])} field, "
                              "not a string")
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise ConfigError(f"--text-event-field {', '.join(unknown)}: no such field in {schema.get('name')}")
        fills: list[Fill] = []
        unfilled: list[str] = []
        for name, f in fields.items():
            kind = kind_of(f["type"])
            auto = auto_fill(f)
            if name == self.text_field:
                fills.append(Fill(name, "text"))
            elif name in values:
                fills.append(Fill(name, "value", _convert(kind, name, values[name])))
            elif auto is not None:
                fills.append(auto)
            else:
                unfilled.append(f"{name} ({kind})")
        if unfilled:
            raise ConfigError(f"the input schema {schema.get('name')} has required fields a text cannot fill: "
                              f"{', '.join(unfilled)}; give each a value with --text-event-field NAME=VALUE")
        self._fills = fills

    def event(self, text: str) -> dict[str, Any]:
        now = time.time()
        return {f.name: text if f.how == "text" else f.make(now) for f in self._fills}
