"""A model's declared input schema, read without loading it (the gateway's default, `stream.models.declared`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from stream.errors import ConfigError
from stream.models.declared import BUILT_IN, declared, declared_input_schema
from stream.models.demo import DemoFraudHandler
from stream.models.minilm import DEFAULT_MAX_TOKENS, MiniLMHandler


def test_each_model_declares_what_its_handler_reads_by_default() -> None:
    assert declared_input_schema("demo") == DemoFraudHandler.input_schema
    assert declared_input_schema("minilm") is getattr(MiniLMHandler, "input_schema", None) is None
    assert declared_input_schema("tests.handlers:PoisonHandler") == DemoFraudHandler.input_schema  # its base's
    assert declared_input_schema("export:/no/such.pt2") is None and declared_input_schema("torchscript:x.pt") is None
    with pytest.raises(ConfigError, match="unknown model"):
        declared_input_schema("resnet")
    with pytest.raises(ConfigError, match=r"cannot import Nope from tests\.handlers.*--input-schema"):
        declared_input_schema("tests.handlers:Nope")


def test_the_built_in_table_says_what_the_handlers_say() -> None:
    demo, minilm = DemoFraudHandler(None), MiniLMHandler(None)
    assert BUILT_IN["demo"].name == demo.name and BUILT_IN["minilm"].name == minilm.name
    assert BUILT_IN["demo"].inputs == demo.inputs and BUILT_IN["minilm"].inputs == minilm.inputs
    assert declared("demo").vector_size is None and declared("demo").output_schema == demo.output_schema
    assert declared("tests.handlers:PoisonHandler").output_schema == demo.output_schema
    [embedding] = minilm.outputs
    assert embedding.type == "array<float>" and declared("minilm").vector_size == embedding.size
    assert declared("minilm").max_tokens == DEFAULT_MAX_TOKENS == minilm.max_tokens


def test_the_built_in_answers_need_no_torch() -> None:
    code = ("import sys; from stream.models.declared import declared_input_schema as d; d('demo'); d('minilm'); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
