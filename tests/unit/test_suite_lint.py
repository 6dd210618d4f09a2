"""The suite's own lint: every test checks something. A test function whose body (with the helpers of its module
it calls) holds no ``assert``, no ``pytest.raises`` / ``pytest.warns`` / ``pytest.fail``, calls no ``assert_*`` /
``wait_*`` / ``check_*`` / ``*validate*`` helper and runs no ``check=True`` subprocess passes whatever the code does,
so it is refused here."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
CHECKS = ("raises", "warns", "fail", "approx")


def _checks(node: ast.AST, helpers: dict[str, ast.FunctionDef], seen: set[str]) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Assert):
            return True
        if isinstance(sub, ast.Call):
            func = sub.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if any(k.arg == "check" and isinstance(k.value, ast.Constant) and k.value.value is True
                   for k in sub.keywords):
                return True  # subprocess.run(..., check=True): the child's exit status is the check
            if name.startswith(("assert_", "wait_", "expect_", "check_")) or "validate" in name or (
                    isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                    and func.value.id == "pytest" and name in CHECKS):
                return True
            if name in helpers and name not in seen:  # a helper of the same module that checks
                seen.add(name)
                if _checks(helpers[name], helpers, seen):
                    return True
    return False


def _helpers(tree: ast.AST) -> dict[str, ast.FunctionDef]:
    """A module's functions by name (a test's helpers among them)."""
    return {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def unchecked_tests() -> list[str]:
    found = []
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        helpers = _helpers(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")
                    and not _checks(node, helpers, {node.name})):
                found.append(f"{path.relative_to(TESTS.parent)}::{node.name}")
    return found


def test_every_test_checks_something() -> None:
    assert unchecked_tests() == []


def test_the_lint_finds_a_test_that_checks_nothing(tmp_path: Path) -> None:
    tree = ast.parse("def helper():\n    return 1\n\ndef test_nothing():\n    helper()\n\n"
                     "def test_something():\n    assert helper() == 1\n")
    helpers = _helpers(tree)
    verdicts = {n.name: _checks(n, helpers, {n.name}) for n in tree.body
                if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}
    assert verdicts == {"test_nothing": False, "test_something": True}
