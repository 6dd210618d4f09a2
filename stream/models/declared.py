"""What a model declares about its input without being loaded: the schema it reads by default (a handler's
``input_schema``), for the gateway, which takes the same default as the worker (`stream.pipeline.schemas`) and
runs without torch. The built-in models are answered from their names' modules; a ``package.module:Class`` handler
is imported (its class attribute read, nothing constructed)."""

from __future__ import annotations

import importlib

from stream.errors import ConfigError
from stream.models.demo_names import EVENT_SCHEMA


def declared_input_schema(model: str) -> str | None:
    """The input schema (a record name in the schema folder) that ``--model`` reads when none is given; None when
    it declares none (``minilm``, ``export:``, ``torchscript:``)."""
    if model == "demo":
        return EVENT_SCHEMA
    if model == "minilm" or model.split(":", 1)[0] in ("export", "torchscript"):
        return None
    module_name, sep, cls_name = model.partition(":")
    if not sep:
        raise ConfigError(f"--model {model!r}: unknown model (built-in: demo, minilm; export:PATH.pt2, "
                          "torchscript:PATH.pt, or package.module:ClassName)")
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"--model {model}: cannot import {cls_name} from {module_name} ({exc}); or pass "
                          "--input-schema") from exc
    schema = getattr(cls, "input_schema", None)
    return schema if isinstance(schema, str) and schema else None
