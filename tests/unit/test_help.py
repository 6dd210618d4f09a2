"""Every command's ``--help`` is written for its users: it runs, says what the command does in a line, gives every
flag a help text, and carries no internal notes (reStructuredText markup, notes to the code's readers)."""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from stream.bench import summarize
from stream.cli import build_parser

INTERNAL = ("``", "Thin:", "TODO", "XXX", "internal:")


def commands(parser: argparse.ArgumentParser, name: str = "python -m stream"
             ) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, command in action.choices.items():
                yield from commands(command, f"{name} {sub}")


COMMANDS = dict(commands(build_parser()))


def test_every_command_is_listed() -> None:
    assert {"python -m stream worker", "python -m stream gateway", "python -m stream read",
            "python -m stream topics list", "python -m stream topics describe", "python -m stream topics delete",
            "python -m stream broker", "python -m stream bench"} <= set(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_describes_the_command_and_every_flag(name: str) -> None:
    parser = COMMANDS[name]
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        parser.parse_args(["--help"])
    assert done.value.code == 0
    text = out.getvalue()
    assert parser.description and len(parser.description) > 20, f"{name}: no description"
    unhelped = [a.option_strings[0] if a.option_strings else a.dest for a in parser._actions
                if a.dest != "help" and not isinstance(a, argparse._SubParsersAction) and not a.help]
    assert unhelped == [], f"{name}: no help for {unhelped}"
    assert not [n for n in INTERNAL if n in text], f"{name}: internal notes in its help:\n{text}"


def test_the_worker_says_which_flags_it_needs() -> None:
    text = COMMANDS["python -m stream worker"].format_help()
    for flag in ("--input-topic", "--output-topic", "--group-id"):
        line = text[text.index(f"  {flag} "):].split("\n  --")[0]
        assert "required" in line, line


def test_summarize_takes_help_and_names_a_folder_without_a_report(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        summarize.main(["--help"])
    assert done.value.code == 0 and "RESULTS_DIR" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        summarize.main([str(tmp_path)])
    assert done.value.code == 2 and "no bench.json there" in capsys.readouterr().err
