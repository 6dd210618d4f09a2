"""Files of published Go modules (the compose specification's JSON schema, KEDA's CRDs and Kafka scaler), fetched
with the Go toolchain's own client from the module proxy into the cache, for the deployment files' validation."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from stream.local.cache import cache_dir

COMPOSE_GO = ("github.com/compose-spec/compose-go/v2", "v2.16.2")  # schema/compose-spec.json
KEDA = ("github.com/kedacore/keda/v2", "v2.21.0")  # config/crd/bases/, pkg/scalers/kafka_scaler.go


def module_dir(module: tuple[str, str]) -> Path:
    """The unpacked module ``(path, version)``: ``go mod download`` once into ``<cache>/gomod``."""
    path, version = module
    go = shutil.which("go")
    if go is None:
        raise RuntimeError("the deployment files' schemas come from the Go module proxy: `go` must be on PATH")
    env = {**os.environ, "GOMODCACHE": str(cache_dir() / "gomod"), "GOFLAGS": "-modcacherw", "GO111MODULE": "on"}
    proc = subprocess.run([go, "mod", "download", "-json", f"{path}@{version}"], capture_output=True, text=True,
                          env=env, timeout=600, check=False, cwd=cache_dir() if cache_dir().is_dir() else None)
    if proc.returncode != 0:
        raise RuntimeError(f"go mod download {path}@{version} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return Path(json.loads(proc.stdout)["Dir"])
