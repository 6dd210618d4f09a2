"""A Kubernetes control plane's binaries, built from the Go module proxy into the cache (once, like Kafka's jars):
kube-apiserver, kube-controller-manager, kube-scheduler and kubectl from ``k8s.io/kubernetes``, etcd, kwok (nodes
and pods simulated: nothing runs in them) and KEDA's operator and metrics adapter. No image registry, no download
site: only ``go`` and the module proxy.

``k8s.io/kubernetes`` is not meant to be a dependency (its ``go.mod`` points its ``k8s.io/*`` modules at
``./staging``, absent from the published module): a small module of our own requires it and replaces each staging
module with the published ``v0.X.Y`` of the same release, then builds the commands by package path. etcd's server
module is built the same way; kwok and KEDA are built in their own module (KEDA's ``go.mod`` has a replace, so
``go install`` refuses it).

``python -m tests.kube_build [--keda]`` builds them (about 4 minutes on 2 cores the first time, 9 with KEDA) and
prints where.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from stream.local.cache import cache_dir, fill_once
from tests.go_modules import KEDA, module_dir

KUBERNETES = "v1.34.4"
STAGING = "v0.34.4"  # the staging modules' release that goes with KUBERNETES
ETCD = "v3.6.8"
KWOK = "v0.7.0"
COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
BUILD_TIMEOUT_S = 3600


class BuildError(RuntimeError):
    pass


def go_env() -> dict[str, str]:
    return {**os.environ, "GOMODCACHE": str(cache_dir() / "gomod"), "GOFLAGS": "-modcacherw -mod=mod",
            "GO111MODULE": "on", "GOTOOLCHAIN": "local", "CGO_ENABLED": "0"}


def _go(args: list[str], cwd: Path, what: str) -> None:
    go = shutil.which("go")
    if go is None:
        raise BuildError("the control plane's binaries are built from the Go module proxy: `go` must be on PATH")
    started = time.monotonic()
    print(f"kube_build: {what}: go {' '.join(args)}", file=sys.stderr, flush=True)
    proc = subprocess.run([go, *args], cwd=cwd, env=go_env(), capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        raise BuildError(f"{what}: go {' '.join(args)} failed (exit {proc.returncode}):\n"
                         f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    print(f"kube_build: {what} built in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)


def _wrapper(folder: Path, name: str, requires: dict[str, str], replaces: dict[str, str]) -> None:
    """A module of our own at ``folder`` that requires (and replaces) the given modules."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f"module stream.local/{name}", "", "go 1.24.0", "", "require ("]
    lines += [f"\t{m} {v}" for m, v in requires.items()]
    lines += [")", ""]
    if replaces:
        lines += ["replace ("] + [f"\t{m} => {m} {v}" for m, v in replaces.items()] + [")", ""]
    (folder / "go.mod").write_text("\n".join(lines))


def _version_flags() -> str:
    """What `kubectl version` and the API server's /version say (else v0.0.0-master, which clients distrust)."""
    minor = KUBERNETES.split(".")[1]
    flags = []
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {package}.gitVersion={KUBERNETES}", f"-X {package}.gitMajor=1",
                  f"-X {package}.gitMinor={minor}", f"-X {package}.gitTreeState=clean",
                  f"-X {package}.buildDate=1970-01-01T00:00:00Z"]
    return " ".join(["-s", "-w", *flags])


def _build_kubernetes(out: Path, work: Path) -> str:
    source = module_dir(("k8s.io/kubernetes", KUBERNETES))
    staging = re.findall(r"^\s*(k8s\.io/[a-z-]+) => \./staging/", (source / "go.mod").read_text(), re.M)
    if not staging:
        raise BuildError(f"k8s.io/kubernetes@{KUBERNETES}: no ./staging replace lines in its go.mod")
    _wrapper(work, "kubernetes", {"k8s.io/kubernetes": KUBERNETES}, dict.fromkeys(staging, STAGING))
    _go(["build", "-trimpath", "-ldflags", _version_flags(), "-o", str(out) + "/",
         *[f"k8s.io/kubernetes/cmd/{c}" for c in COMMANDS]], work, f"kubernetes {KUBERNETES}")
    return f"k8s.io/kubernetes@{KUBERNETES} (staging {STAGING})"


def _build_etcd(out: Path, work: Path) -> str:
    modules = ("server", "api", "client/pkg", "client", "pkg")
    _wrapper(work, "etcd", {f"go.etcd.io/etcd/{m}/v3": ETCD for m in modules}, {})
    _go(["build", "-trimpath", "-ldflags", "-s -w", "-o", str(out / "etcd"), "go.etcd.io/etcd/server/v3"], work,
        f"etcd {ETCD}")
    return f"go.etcd.io/etcd/server/v3@{ETCD}"


def _build_in_module(out: Path, module: tuple[str, str], commands: dict[str, str]) -> str:
    path, version = module
    source = module_dir(module)
    for name, package in commands.items():
        # In its own module (replaces honoured), read-only: nothing there is written.
        args = ["build", "-mod=readonly", "-trimpath", "-ldflags", "-s -w", "-o", str(out / name), package]
        _go(args, source, f"{name} {version}")
    return f"{path}@{version}"


def _kwok(out: Path, work: Path) -> str:
    return _build_in_module(out, ("sigs.k8s.io/kwok", KWOK), {"kwok": "./cmd/kwok"})


def _keda(out: Path, work: Path) -> str:
    return _build_in_module(out, KEDA, {"keda-operator": "./cmd/operator", "keda-adapter": "./cmd/adapter"})


def ensure_binaries(*, keda: bool = False) -> Path:
    """The folder holding kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd and kwok, and
    with ``keda`` keda-operator and keda-adapter (built once, each group under its own cache entry: about 4
    minutes on 2 cores without KEDA, 9 with it)."""
    root = cache_dir() / "k8s"
    bins = root / "bin"
    entries: dict[str, Callable[[Path, Path], str]] = {
        f"kubernetes-{KUBERNETES}": _build_kubernetes, f"etcd-{ETCD}": _build_etcd, f"kwok-{KWOK}": _kwok,
        **({f"keda-{KEDA[1]}": _keda} if keda else {})}
    bins.mkdir(parents=True, exist_ok=True)
    for name, build in entries.items():
        entry = root / name

        def fill(entry: Path = entry, build: Callable[[Path, Path], str] = build) -> str:
            with tempfile.TemporaryDirectory(prefix="kube-build-") as work:
                return build(entry, Path(work) / "module")

        fill_once(entry, fill)
        for binary in entry.iterdir():
            if binary.is_file() and os.access(binary, os.X_OK):
                link = bins / binary.name
                if not link.exists():
                    link.symlink_to(binary)
    return bins


if __name__ == "__main__":
    print(ensure_binaries(keda="--keda" in sys.argv[1:]))
