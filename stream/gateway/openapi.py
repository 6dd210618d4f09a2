"""The gateway's OpenAPI document (3.1), made from the same operation table as its routes
(`stream.gateway.http.Operation`): every route of every protocol, its request body's schema (typed models, and the
input schema's events as JSON Schema), and every status it answers with its body's schema. Served at
``/openapi.json``; the tests fuzz the gateway against it (tests/unit/gateway/test_fuzz.py)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pydantic

from stream.gateway.http import Operation

_PARAM = re.compile(r"\{(\w+)(?::\w+)?\}")


def schema_of(model: type[pydantic.BaseModel] | Any, components: dict[str, Any]) -> dict[str, Any]:
    """``model``'s JSON Schema, its nested models moved to ``components`` (a pydantic model or a TypeAdapter's
    type)."""
    adapter = pydantic.TypeAdapter(model)
    schema = adapter.json_schema(ref_template="#/components/schemas/{model}", mode="serialization")
    components.update(schema.pop("$defs", {}))
    return schema


def document(operations: Sequence[Operation], components: dict[str, Any], *, title: str, version: str,
             description: str, secured: bool) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        path = _PARAM.sub(r"{\1}", op.path)
        entry: dict[str, Any] = {
            "summary": op.summary, "tags": [op.tag],
            "operationId": f"{op.method.lower()}{re.sub(r'[^A-Za-z0-9]+', '_', path)}".rstrip("_"),
            "responses": {str(status): {"description": said,
                                        **({"content": {m: {"schema": s} for m, s in content.items()}}
                                           if content else {})}
                          for status, (said, content) in sorted(op.responses.items())}}
        parameters = [{"name": name, "in": "path", "required": True,
                       "schema": op.path_params.get(name, {"type": "string", "minLength": 1})}
                      for name in _PARAM.findall(op.path)]
        if parameters:
            entry["parameters"] = parameters
        if op.request is not None:
            entry["requestBody"] = {"required": True, "content": {op.request_media: {"schema": op.request}}}
        if secured and op.open:
            entry["security"] = []
        paths.setdefault(path, {})[op.method.lower()] = entry
    doc: dict[str, Any] = {"openapi": "3.1.0", "info": {"title": title, "version": version,
                                                        "description": description},
                           "paths": paths, "components": {"schemas": components}}
    if secured:
        doc["components"]["securitySchemes"] = {"apiKey": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"apiKey": []}]
    return doc
