"""The packages are layers: a module imports only from its own package and the layers below it (every import
statement counts, those inside functions and under TYPE_CHECKING too). The order is the one each package's
docstring states and docs/internals.md's module map shows."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import stream

ROOT = Path(stream.__file__).resolve().parent
# Lowest first. "stream" is the base: stream/errors.py and stream/config.py.
LAYERS = ["stream", "models", "kafka", "codec", "ops", "pipeline", "local", "gateway", "top"]
TOP_MODULES = {"cli", "__main__"}  # stream/cli.py and stream/__main__.py: the commands, above every layer


def layer_of(module: str) -> str:
    """``stream.kafka.intake`` -> ``kafka``; ``stream.errors`` -> ``stream``; ``stream.cli``, ``stream.bench.x``
    -> ``top``."""
    parts = module.split(".")
    if len(parts) == 1:
        return "stream"
    if parts[1] in TOP_MODULES or parts[1] == "bench":
        return "top"
    if (ROOT / parts[1]).is_dir():
        return parts[1]
    return "stream"


def imports_of(path: Path, module: str) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "stream"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "stream":
                continue
            # `from stream import x` / `from stream.kafka import native`: the names may be modules
            for a in node.names:
                name = f"{base}.{a.name}"
                sub = ROOT.joinpath(*name.split(".")[1:])
                found.append((node.lineno, name if sub.is_dir() or sub.with_suffix(".py").exists() else base))
    return found


def all_modules() -> list[tuple[Path, str]]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        out.append((path, ".".join(parts)))
    return out


def violations() -> list[str]:
    rank = {name: i for i, name in enumerate(LAYERS)}
    bad = []
    for path, module in all_modules():
        mine = layer_of(module)
        for line, target in imports_of(path, module):
            theirs = layer_of(target)
            if rank[theirs] > rank[mine]:
                bad.append(f"{path.relative_to(ROOT.parent)}:{line}: {mine} imports {target} ({theirs}, a higher "
                           "layer)")
    return bad


def test_imports_point_down_the_layers() -> None:
    assert violations() == []


def test_every_package_is_a_layer_and_says_what_it_may_import() -> None:
    for child in sorted(ROOT.iterdir()):
        if child.is_dir() and (child / "__init__.py").exists() and child.name != "bench":
            assert child.name in LAYERS, f"stream/{child.name}/ is in no layer: add it to LAYERS and the docs"
            doc = ast.get_docstring(ast.parse((child / "__init__.py").read_text())) or ""
            assert "Layer:" in doc, f"stream/{child.name}/__init__.py does not say its layer"


def test_the_check_finds_an_upward_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kafka module importing the pipeline, and a base module importing ops, are both reported."""
    fake = tmp_path / "stream"
    for package, source in [("kafka", "from stream.pipeline import worker\n"), ("pipeline", ""), ("ops", "")]:
        (fake / package).mkdir(parents=True)
        (fake / package / "__init__.py").write_text('"""Layer: x."""\n')
        (fake / package / "mod.py").write_text(source)
    (fake / "__init__.py").write_text("")
    (fake / "pipeline" / "worker.py").write_text("")
    (fake / "errors.py").write_text("def f():\n    from stream.ops import mod\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["ROOT"]), "ROOT", fake)
    found = violations()
    assert len(found) == 2
    assert any("stream/kafka/mod.py:1: kafka imports stream.pipeline.worker" in v for v in found)
    assert any("stream/errors.py:2: stream imports stream.ops.mod" in v for v in found)
