"""Command-line flags made from a pydantic settings model: one flag per field, named after it, its help and
default from the field (one source for both), in groups. A flag left out is None, so that the environment and
then the field's default fill it (`stream.config.load_settings`, `stream.gateway.settings.load_gateway_settings`)."""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Container, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import SecretStr


def add_setting_flags(parser: argparse.ArgumentParser, fields: Mapping[str, Any],
                      groups: Mapping[str, Sequence[str]] | None = None, switches: Container[str] = ()) -> None:
    """A flag per field of ``fields`` (a model's ``model_fields``). ``groups``: title -> field names, in the order
    shown (every field must be in one); without it, each field's ``json_schema_extra["group"]``. ``switches``:
    booleans given as a bare ``--flag`` (the others get ``--flag`` / ``--no-flag``)."""
    if groups is None:
        groups = {}
        for name, field in fields.items():
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            groups.setdefault(str(extra.get("group", "other")), []).append(name)  # type: ignore[attr-defined]
    placed = [name for names in groups.values() for name in names]
    if sorted(placed) != sorted(fields):
        raise ValueError(f"flag groups do not hold each setting once: {sorted(set(fields) ^ set(placed))}")
    for title, names in groups.items():
        group = parser.add_argument_group(title)
        for name in names:
            group.add_argument("--" + name.replace("_", "-"), **_flag(name, fields[name], switches))


def _flag(name: str, field: Any, switches: Container[str]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"dest": name, "default": None, "help": _help(field)}
    annotation = field.annotation
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    base = args[0] if typing.get_origin(annotation) in (typing.Union, types.UnionType) and args else annotation
    if base is bool:
        kwargs["action"] = "store_true" if name in switches else argparse.BooleanOptionalAction
    elif typing.get_origin(base) is list:
        kwargs["action"] = "append"
        item = typing.get_args(base)[0]
        kwargs["metavar"] = "PATH" if item is Path else "KEY" if item is SecretStr else "NAME=VALUE"
    elif typing.get_origin(base) is Literal:
        kwargs["choices"] = list(typing.get_args(base))
    elif base in (int, float, Path):
        kwargs["type"] = base
    return kwargs


def _help(field: Any) -> str:
    """The field's description, and its default in brackets unless it says it or has none to show."""
    text = str(field.description or "")
    default = field.default
    if (field.is_required() or field.default_factory is not None or default is None or default is False
            or default in ("", []) or "default" in text):
        return text
    shown = "on" if default is True else (f"{default:,}" if isinstance(default, int) and default >= 10_000
                                          else str(default))
    return f"{text} ({shown})"
