"""Another git revision of this repository, checked out and built beside this one, for before/after drains."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def checkout_revision(rev: str, into: Path) -> Path | None:
    """A git worktree of ``rev`` at ``into`` with its C extensions built in place (this interpreter and
    compiler), or None when this clone does not have ``rev`` (a shallow clone)."""
    known = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=ROOT,
                           capture_output=True, text=True, check=False)
    if known.returncode != 0:
        return None
    subprocess.run(["git", "worktree", "add", "--detach", str(into), rev], cwd=ROOT, capture_output=True, text=True,
                   check=True)
    built = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=into, capture_output=True,
                           text=True, check=False)
    if built.returncode != 0:
        remove_checkout(into)
        raise RuntimeError(f"building {rev}'s extensions failed:\n{built.stderr[-2000:]}")
    return into


def remove_checkout(tree: Path) -> None:
    subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False, capture_output=True)
    subprocess.run(["git", "worktree", "prune"], cwd=ROOT, check=False, capture_output=True)


def short_rev(rev: str) -> str:
    return subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
