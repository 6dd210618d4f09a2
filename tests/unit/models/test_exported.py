"""Model files that need no Python: torch.export programs and TorchScript modules, their declared inputs and
outputs, and archives that would need unpickling refused."""

from __future__ import annotations

import io
import json
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from stream.errors import ConfigError, UnrecoverableModelError
from stream.models import InputSpec, OutputSpec
from stream.models.exported import check_pt2_archive
from stream.pipeline.inference import InferenceEngine, create_handler

CPU = torch.device("cpu")


class Scorer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, amount: torch.Tensor, qty: torch.Tensor, history: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([amount[:, None], qty[:, None].float(), history], dim=1)
        embedding = self.linear(x)
        return torch.sigmoid(embedding.sum(dim=1)), embedding


def export(path: Path, metadata: dict[str, object] | None = None) -> torch.nn.Module:
    torch.manual_seed(0)
    model = Scorer().eval()
    batch = torch.export.Dim("batch")
    program = torch.export.export(model, (torch.randn(4), torch.ones(4, dtype=torch.int64), torch.randn(4, 2)),
                                  dynamic_shapes={"amount": {0: batch}, "qty": {0: batch}, "history": {0: batch}})
    extra = {"stream.json": json.dumps(metadata)} if metadata is not None else None
    torch.export.save(program, str(path), extra_files=extra)
    return model


def batch(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(n)
    return {"amount": rng.standard_normal(n).astype(np.float32), "qty": rng.integers(0, 9, n),
            "history": rng.standard_normal((n, 2)).astype(np.float32)}


def test_an_exported_program_declares_its_own_inputs_and_outputs_and_runs_any_batch_size(tmp_path: Path) -> None:
    model = export(tmp_path / "scorer.pt2")
    handler = create_handler(f"export:{tmp_path / 'scorer.pt2'}", None)
    engine = InferenceEngine(handler, CPU)
    assert handler.inputs == (InputSpec("amount", "float32"), InputSpec("qty", "int64"),
                              InputSpec("history", "float32", (2,)))
    assert handler.outputs == (OutputSpec("output_0", "float"), OutputSpec("output_1", "array<float>"))
    assert handler.name == "scorer" and len(handler.version) == 12
    for n in (1, 7, 300):
        inputs = batch(n)
        out = engine.run(inputs).outputs
        want_score, _ = model(*(torch.from_numpy(inputs[k]) for k in ("amount", "qty", "history")))
        np.testing.assert_allclose(out["output_0"], want_score.detach().numpy(), rtol=1e-6)
        assert out["output_1"].shape == (n, 3)


def test_names_and_types_from_the_embedded_metadata(tmp_path: Path) -> None:
    export(tmp_path / "m.pt2", {"name": "order-scorer", "version": "3",
                                "outputs": [{"name": "score", "type": "float"},
                                            {"name": "embedding", "type": "array<float>"}]})
    handler = create_handler(f"export:{tmp_path / 'm.pt2'}", None)
    InferenceEngine(handler, CPU)
    assert (handler.name, handler.version) == ("order-scorer", "3")
    assert [o.name for o in handler.outputs] == ["score", "embedding"]


def test_a_torchscript_module_needs_its_metadata(tmp_path: Path) -> None:
    with warnings.catch_warnings():  # deprecated in torch 2.13, still what older exports hold
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(Scorer().eval())
        torch.jit.save(scripted, str(tmp_path / "m.pt"))
    with pytest.raises(ConfigError, match="keeps no input or output types"):
        create_handler(f"torchscript:{tmp_path / 'm.pt'}", None)
    (tmp_path / "m.pt.json").write_text(json.dumps({
        "inputs": [{"name": "amount"}, {"name": "qty", "dtype": "int64"}, {"name": "history", "shape": [2]}],
        "outputs": [{"name": "score"}, {"name": "embedding", "type": "array<float>"}]}))
    handler = create_handler(f"torchscript:{tmp_path / 'm.pt'}", None)
    out = InferenceEngine(handler, CPU).run(batch(5)).outputs
    assert out["score"].shape == (5,) and out["embedding"].shape == (5, 3)


def rewrite(src: Path, dst: Path, replace: dict[str, bytes]) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            for suffix, new in replace.items():
                if item.filename.endswith(suffix):
                    data = new
            zout.writestr(item, data)


class NotATensor:
    pass


def test_archives_that_would_unpickle_are_refused(tmp_path: Path) -> None:
    export(tmp_path / "ok.pt2")
    check_pt2_archive(tmp_path / "ok.pt2")
    buf = io.BytesIO()
    torch.save(((NotATensor(),), {}), buf)
    rewrite(tmp_path / "ok.pt2", tmp_path / "bad-inputs.pt2", {"sample_inputs/model.pt": buf.getvalue()})
    with pytest.raises(ConfigError, match="needs unpickling"):
        check_pt2_archive(tmp_path / "bad-inputs.pt2")
    config = {"config": {"linear.weight": {"path_name": "weight_0", "use_pickle": True}}}
    rewrite(tmp_path / "ok.pt2", tmp_path / "bad-weights.pt2",
            {"weights/model_weights_config.json": json.dumps(config).encode()})
    handler = create_handler(f"export:{tmp_path / 'bad-weights.pt2'}", None)
    with pytest.raises(UnrecoverableModelError, match="stored pickled"):
        InferenceEngine(handler, CPU)
