"""What a model declares without being loaded: the schema it reads by default (a handler's ``input_schema``),
its name, its inputs, and the size of its one vector output when it has one. For the gateway, which takes the same
default input schema as the worker (`stream.pipeline.schemas`), checks each event against the model's inputs
(`stream.pipeline.contract`), serves the model's name and checks an embedding request's ``dimensions`` before any
text reaches the topic, and runs without torch for the built-in models. The built-in models are answered from a
table here (`tests/unit/models/test_declared.py` holds it to the handlers); a ``package.module:Class`` handler is
imported (its class attributes read, nothing constructed)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from stream.errors import ConfigError
from stream.models.demo_names import EVENT_SCHEMA, PREDICTION_SCHEMA
from stream.models.spec import InputSpec


@dataclass(frozen=True)
class Declared:
    input_schema: str | None = None  # a record name in the schema folder; None: the model names none
    name: str | None = None  # the handler's name (what predictions carry as model_name)
    vector_size: int | None = None  # the size of its one array<float> output (an embedding), if it has one
    output_schema: str | None = None  # the prediction schema it writes by default (a handler's output_schema)
    inputs: tuple[InputSpec, ...] | None = None  # what it takes; None: ask the handler (`stream.pipeline.contract`)
    pooling: str | None = None  # an embedding model's pooling of its token states (TEI's /info), if known
    max_tokens: int | None = None  # the tokens a text is cut to by default (the worker's --max-tokens may lower it)


BUILT_IN = {
    "demo": Declared(EVENT_SCHEMA, "demo-fraud-mlp", None, PREDICTION_SCHEMA,
                     (InputSpec("features", "float32", (32,)),)),
    "minilm": Declared(None, "all-MiniLM-L6-v2", 384,
                       inputs=(InputSpec("text", "string", nonempty=True, text_buffer=True),),
                       pooling="mean", max_tokens=256),
}


def declared(model: str) -> Declared:
    """What ``--model`` declares (nothing for ``export:`` and ``torchscript:`` files)."""
    if model in BUILT_IN:
        return BUILT_IN[model]
    if model.split(":", 1)[0] in ("export", "torchscript"):
        return Declared()
    module_name, sep, cls_name = model.partition(":")
    if not sep:
        raise ConfigError(f"--model {model!r}: unknown model (built-in: demo, minilm; export:PATH.pt2, "
                          "torchscript:PATH.pt, or package.module:ClassName)")
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"--model {model}: cannot import {cls_name} from {module_name} ({exc}); or pass "
                          "--input-schema") from exc
    schemas = [getattr(cls, attr, None) for attr in ("input_schema", "output_schema")]
    given = [s if isinstance(s, str) and s else None for s in schemas]
    return Declared(given[0], output_schema=given[1])


def declared_input_schema(model: str) -> str | None:
    """The input schema that ``--model`` reads when none is given; None when it declares none (``minilm``,
    ``export:``, ``torchscript:``)."""
    return declared(model).input_schema
