"""Texts to events of a user's input schema (`stream.gateway.texts`)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from stream.errors import ConfigError
from stream.gateway.texts import NoTextField, TextEvents, parse_field_values


def schema(*fields: dict[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": "Doc", "namespace": "team.search", "fields": list(fields)}


def test_each_field_gets_the_text_a_value_the_time_a_fresh_id_or_its_default() -> None:
    s = schema({"name": "body", "type": "string"}, {"name": "doc_id", "type": "string"},
               {"name": "tenant", "type": "string"}, {"name": "priority", "type": "int"},
               {"name": "at", "type": ["null", {"type": "long", "logicalType": "timestamp-micros"}]},
               {"name": "lang", "type": "string", "default": "en"}, {"name": "score", "type": ["null", "double"],
                                                                      "default": None})
    texts = TextEvents(s, "body", parse_field_values(["tenant=acme", "priority=3"]))
    before = time.time() * 1e6
    a, b = texts.event("hello"), texts.event("world")
    assert a["body"] == "hello" and a["tenant"] == "acme" and a["priority"] == 3
    assert a["lang"] == "en" and a["score"] is None
    assert before <= a["at"] <= time.time() * 1e6
    assert len(a["doc_id"]) == 32 and a["doc_id"] != b["doc_id"]


def test_what_a_text_cannot_fill_is_refused_at_start_up_naming_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"required fields a text cannot fill: priority \(int\).*--text-event-field"):
        TextEvents(schema({"name": "text", "type": "string"}, {"name": "priority", "type": "int"}), None, {})
    with pytest.raises(NoTextField, match=r"has no field 'text'.*--text-field names another"):
        TextEvents(schema({"name": "body", "type": "string"}), None, {})  # the gateway turns the routes off
    with pytest.raises(ConfigError, match="has no field 'body'") as named:
        TextEvents(schema({"name": "text", "type": "string"}), "body", {})
    assert not isinstance(named.value, NoTextField), "a --text-field that is not there stops the start"
    with pytest.raises(ConfigError, match="--text-field n: a int field"):
        TextEvents(schema({"name": "n", "type": "int"}), "n", {})
    with pytest.raises(ConfigError, match="--text-event-field nope: no such field"):
        TextEvents(schema({"name": "text", "type": "string"}), None, {"nope": "1"})
    with pytest.raises(ConfigError, match="the field is int"):
        TextEvents(schema({"name": "text", "type": "string"}, {"name": "n", "type": "int"}), None, {"n": "x"})
    for bad in (["novalue"], ["a=1", "a=2"]):
        with pytest.raises(ConfigError, match="--text-event-field"):
            parse_field_values(bad)
