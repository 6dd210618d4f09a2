"""Models that need no Python from their owner: a ``torch.export`` program (``--model export:PATH.pt2``) or a
TorchScript module (``--model torchscript:PATH.pt``).

What the model takes and gives comes from a ``stream.json`` stored in the file (``torch.export.save(...,
extra_files={"stream.json": ...})`` or ``torch.jit.save(..., _extra_files=...)``) or beside it (``PATH.json``)::

    {"name": "order-scorer", "version": "3",
     "inputs": [{"name": "amount", "dtype": "float32"}, {"name": "history", "dtype": "float32", "shape": [16]}],
     "outputs": [{"name": "score", "type": "float"}, {"name": "embedding", "type": "array<float>"}]}

For an exported program every part may be left out: the inputs are the program's own (names, dtypes and per-row
shapes, the first dimension being the batch, exported dynamic), the outputs ``output`` (or ``output_0``,
``output_1``, ...) typed from their shapes, the name the file's stem, the version the first 12 hex digits of the
file's SHA-256. A TorchScript module keeps no shapes: its ``stream.json`` must give inputs and outputs.

Nothing is unpickled: before ``torch.export.load`` reads a program, its archive is checked to hold only plain
tensors (no pickled weight or constant, no custom or opaque object, no legacy ``.pt`` weights) and sample inputs
that ``torch.load(weights_only=True)`` reads; a program that needs more is refused.
"""

from __future__ import annotations

import hashlib
import io
import json
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from stream.errors import ConfigError, UnrecoverableModelError
from stream.models.files import read_model_file
from stream.models.spec import NUMERIC_DTYPES, InputSpec, OutputSpec

METADATA = "stream.json"
_TORCH_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.int32: "int32", torch.int64: "int64",
                 torch.bool: "bool"}


class ExportedHandler:
    """A ``torch.export`` program or a TorchScript module as a model handler."""

    def __init__(self, kind: str, path: Path) -> None:
        if kind not in ("export", "torchscript"):
            raise ConfigError(f"unknown model file kind {kind!r} (export or torchscript)")
        self.kind = kind
        self.path = Path(path)
        if not self.path.is_file():
            raise ConfigError(f"--model {kind}:{path}: no such file")
        self.name = self.path.stem
        self.version = "unloaded"
        self.inputs: tuple[InputSpec, ...] = ()
        self.outputs: tuple[OutputSpec, ...] = ()
        self._module: Any = None
        self._device = torch.device("cpu")
        self._metadata = self._sidecar()
        if kind == "torchscript" or self._metadata:
            self._declare(self._metadata, None)  # known before load: the worker checks them against the schemas

    def _sidecar(self) -> dict[str, Any]:
        side = self.path.with_name(self.path.name + ".json")
        if side.is_file():
            return _parse_metadata(side.read_text(), str(side))
        return {}

    def _declare(self, meta: Mapping[str, Any], program: Any) -> None:
        self.name = str(meta.get("name", self.name))
        if "inputs" in meta:
            self.inputs = tuple(InputSpec(str(i["name"]), str(i.get("dtype", "float32")),
                                          tuple(int(k) for k in i.get("shape", ()))) for i in meta["inputs"])
        elif program is not None:
            self.inputs = _program_inputs(program)
        if "outputs" in meta:
            self.outputs = tuple(OutputSpec(str(o["name"]), str(o.get("type", "float"))) for o in meta["outputs"])
        elif program is not None:
            self.outputs = _program_outputs(program)
        if self.kind == "torchscript" and (not self.inputs or not self.outputs):
            raise ConfigError(f"--model torchscript:{self.path}: a TorchScript module keeps no input or output "
                              f"types; give them in {self.path.name}.json or an embedded {METADATA} (see "
                              "stream/models/exported.py)")

    def load(self, device: torch.device) -> None:
        digest = hashlib.sha256(read_model_file(self.path)).hexdigest()[:12]
        try:
            if self.kind == "export":
                check_pt2_archive(self.path)
                extra = {METADATA: ""}
                program = torch.export.load(str(self.path), extra_files=extra)
                if not self._metadata and extra[METADATA]:
                    self._metadata = _parse_metadata(extra[METADATA], f"{self.path}:{METADATA}")
                self._declare(self._metadata, program)
                self._module = program.module().to(device)
            else:
                extra = {METADATA: ""}
                with warnings.catch_warnings():  # deprecated since torch 2.13 in favour of torch.export; still read
                    warnings.simplefilter("ignore", DeprecationWarning)
                    self._module = torch.jit.load(  # type: ignore[no-untyped-call]
                        str(self.path), map_location=device, _extra_files=extra)
                self._module.eval()
                if not self._metadata and extra[METADATA]:
                    self._metadata = _parse_metadata(extra[METADATA], f"{self.path}:{METADATA}")
                    self._declare(self._metadata, None)
        except ConfigError as exc:
            raise UnrecoverableModelError(str(exc)) from exc
        except Exception as exc:
            raise UnrecoverableModelError(f"--model {self.kind}:{self.path} cannot load: {exc}") from exc
        self.version = str(self._metadata.get("version", digest))
        self._device = device

    def collate(self, inputs: Mapping[str, Any], device: torch.device) -> tuple[torch.Tensor, ...]:
        pinned = device.type == "cuda"
        return tuple(torch.from_numpy(np.ascontiguousarray(inputs[i.name])).to(device, non_blocking=pinned)
                     for i in self.inputs)

    def predict(self, inputs: tuple[torch.Tensor, ...]) -> Any:
        assert self._module is not None, "load() first"
        return self._module(*inputs)

    def postprocess(self, raw: Any) -> dict[str, np.ndarray]:
        values = list(raw.values()) if isinstance(raw, Mapping) else list(raw) if isinstance(raw, (list, tuple)) \
            else [raw]
        if len(values) != len(self.outputs):
            raise ValueError(f"the model returned {len(values)} outputs, {len(self.outputs)} declared")
        out = {}
        for spec, value in zip(self.outputs, values, strict=True):
            array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
            if spec.type == "boolean":
                array = array.astype(bool)
            elif not spec.type.startswith("array<") and array.ndim == 2 and array.shape[1] == 1:
                array = array[:, 0]  # (n, 1) -> one value per row
            out[spec.name] = array
        return out


def _parse_metadata(text: str, where: str) -> dict[str, Any]:
    try:
        meta = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{where}: not JSON: {exc}") from exc
    if not isinstance(meta, dict):
        raise ConfigError(f"{where}: expected an object with name, version, inputs, outputs")
    return meta


def _placeholder_vals(program: Any) -> dict[str, Any]:
    return {n.name: n.meta.get("val") for n in program.graph.nodes if n.op == "placeholder"}


def _program_inputs(program: Any) -> tuple[InputSpec, ...]:
    vals = _placeholder_vals(program)
    specs = []
    for name in program.graph_signature.user_inputs:
        val = vals.get(name)
        dtype = _TORCH_DTYPES.get(getattr(val, "dtype", None))  # type: ignore[arg-type]
        if val is None or dtype is None or val.dim() < 1 or val.dim() > 2:
            raise ConfigError(f"exported input {name}: only tensors of {', '.join(NUMERIC_DTYPES)} with a batch "
                              f"dimension and at most one more are supported (got {val})")
        shape = tuple(val.shape[1:])
        if any(not isinstance(k, int) for k in shape):
            raise ConfigError(f"exported input {name}: only the first (batch) dimension may be dynamic")
        specs.append(InputSpec(name, dtype, tuple(int(k) for k in shape)))
    return tuple(specs)


def _program_outputs(program: Any) -> tuple[OutputSpec, ...]:
    node = next(n for n in program.graph.nodes if n.op == "output")
    vals = [a.meta.get("val") for a in node.args[0]]
    names = ["output"] if len(vals) == 1 else [f"output_{i}" for i in range(len(vals))]
    specs = []
    for name, val in zip(names, vals, strict=True):
        kind = {torch.float32: "float", torch.float64: "double", torch.int32: "int", torch.int64: "long",
                torch.bool: "boolean"}.get(getattr(val, "dtype", None))  # type: ignore[arg-type]
        if kind is None or val.dim() not in (1, 2):
            raise ConfigError(f"exported output {name}: a tensor of one value or one vector per row is needed "
                              f"(got {val}); name and type the outputs in {METADATA}")
        specs.append(OutputSpec(name, kind if val.dim() == 1 or val.shape[1] == 1 else f"array<{kind}>"))
    return tuple(specs)


def check_pt2_archive(path: Path) -> None:
    """Refuse a ``torch.export`` archive whose loading would unpickle anything (see the module's docstring)."""
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"{path}: not a torch.export archive: {exc}") from exc
    with archive:
        for name in archive.namelist():
            parts = name.split("/")
            if len(parts) < 3 or parts[1] != "data":
                continue
            area, leaf = parts[2], parts[-1]
            if area in ("weights", "constants") and leaf.endswith(".pt"):
                raise ConfigError(f"{path}: {name} is a pickled (legacy) {area} file; save the program again with "
                                  "torch.export.save")
            if area in ("weights", "constants") and leaf.endswith("_config.json"):
                config = json.loads(archive.read(name)).get("config", {})
                for fqn, meta in config.items():
                    if meta.get("use_pickle") or not str(meta.get("path_name", "")).startswith(("weight", "tensor")):
                        raise ConfigError(f"{path}: {area} {fqn!r} is stored pickled ({meta.get('path_name')}); "
                                          "only plain tensors are loaded")
            if area == "sample_inputs":
                try:
                    torch.load(io.BytesIO(archive.read(name)), weights_only=True)
                except Exception as exc:
                    raise ConfigError(f"{path}: {name} needs unpickling beyond plain tensors: {exc}") from exc
