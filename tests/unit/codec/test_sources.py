"""Where schemas come from, without a registry process: subject names, client settings from the environment, the
schema folder as a source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stream.codec.registry import (
    FolderRegistry,
    full_name,
    open_source,
    reader_schema,
    registry_env_config,
    subject_name,
)
from stream.errors import ConfigError


def test_subject_names_follow_confluents_strategies() -> None:
    assert subject_name("topic", "scores", "acme.Score") == "scores-value"
    assert subject_name("topic", "scores", "acme.Score", key=True) == "scores-key"
    assert subject_name("record", "scores", "acme.Score") == "acme.Score"
    assert subject_name("topic-record", "scores", "acme.Score") == "scores-acme.Score"
    assert full_name({"name": "Score", "namespace": "acme"}) == "acme.Score"
    assert full_name({"name": "x.Score", "namespace": "acme"}) == "x.Score"


def test_client_settings_pass_through_from_schema_registry_variables() -> None:
    env = {"SCHEMA_REGISTRY_URL": "http://r:8081", "SCHEMA_REGISTRY_BASIC_AUTH_USER_INFO": "u:p",
           "SCHEMA_REGISTRY_SSL_CA_LOCATION": "/ca.pem", "SCHEMA_REGISTRY_TIMEOUT": "5", "KAFKA_X": "1"}
    assert registry_env_config(env) == {"basic.auth.user.info": "u:p", "ssl.ca.location": "/ca.pem", "timeout": 5}


def test_the_folder_is_a_source_that_finds_but_never_registers(tmp_path: Path) -> None:
    source = open_source(None, None, {})
    assert isinstance(source, FolderRegistry)
    event = source.latest("stream.demo.FraudEvent")
    assert event.schema_id == 1 and source.latest("FraudPrediction").schema_id == 3
    assert source.register("anything-value", event.raw).schema_id == 1, "found, not registered"
    with pytest.raises(ConfigError, match="is not in the schema folder"):
        source.register("x-value", {"type": "record", "name": "New", "fields": []})
    assert source.by_id(999) is None
    path = tmp_path / "mine.avsc"
    path.write_text(json.dumps({"type": "record", "name": "Mine", "fields": [{"name": "a", "type": "int"}]}))
    mine = reader_schema(source, str(path), None)
    assert mine.name == "Mine" and mine.schema_id == -1
    with pytest.raises(ConfigError, match="no input schema"):
        reader_schema(source, None, None)
