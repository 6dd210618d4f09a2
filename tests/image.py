"""The Dockerfile read without a container engine: its stages and instructions, for `tests/unit/test_image.py`
(every `make test`); `make image-test` builds and runs it with one (`tests/integration/test_image.py`)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Stage:
    name: str
    base: str  # an image, or an earlier stage's name
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (INSTRUCTION, its arguments)

    def args_of(self, instruction: str) -> list[str]:
        return [a for i, a in self.instructions if i == instruction]


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        word, _, rest = whole.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def stages(path: Path = ROOT / "Dockerfile") -> list[Stage]:
    found: list[Stage] = []
    args: dict[str, str] = {}
    for word, rest in instructions(path.read_text()):
        if word == "ARG" and not found:
            name, _, default = rest.partition("=")
            args[name] = default
        elif word == "FROM":
            parts = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), parts[0])
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else str(len(found))
            found.append(Stage(name, base))
        else:
            assert found, f"{word} before the first FROM"
            found[-1].instructions.append((word, rest))
    return found


def copy_sources(rest: str) -> tuple[str | None, list[str]]:
    """(the --from stage or None, the sources) of a COPY instruction's arguments."""
    words = shlex.split(rest)
    source_stage = next((w.split("=", 1)[1] for w in words if w.startswith("--from=")), None)
    paths = [w for w in words if not w.startswith("--")]
    return source_stage, paths[:-1]


def chain(all_stages: list[Stage], name: str) -> list[Stage]:
    """The stage and the stages it is built FROM, down to the base image."""
    by_name = {s.name: s for s in all_stages}
    out = [by_name[name]]
    while out[-1].base in by_name:
        out.append(by_name[out[-1].base])
    return out
