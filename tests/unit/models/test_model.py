from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from producers.events import generate_events
from stream.errors import ConfigError, ModelError, UnrecoverableModelError
from stream.models.demo import DemoFraudHandler
from stream.models.train_demo import roc_auc
from stream.pipeline.inference import InferenceEngine, ModelHandler, create_handler, select_device

CPU = torch.device("cpu")


def test_demo_handler_implements_protocol_and_shapes(model_dir: Path) -> None:
    handler = DemoFraudHandler(model_dir)
    assert isinstance(handler, ModelHandler)
    engine = InferenceEngine(handler, CPU)
    for n in (1, 7, 256):
        out = engine.run(np.random.default_rng(n).standard_normal((n, 32)).astype(np.float32)).outputs
        assert out["fraud_score"].shape == (n,) and out["fraud_score"].dtype == np.float32
        assert out["is_fraud"].dtype == np.bool_
        assert np.all((out["fraud_score"] >= 0) & (out["fraud_score"] <= 1))
        np.testing.assert_array_equal(out["is_fraud"], out["fraud_score"] >= handler.threshold)


def test_batched_equals_one_by_one(model_dir: Path) -> None:
    engine = InferenceEngine(DemoFraudHandler(model_dir), CPU)
    x = generate_events(64, seed=5).features
    whole = engine.run(x).outputs["fraud_score"]
    single = np.concatenate([engine.run(x[i : i + 1]).outputs["fraud_score"] for i in range(64)])
    np.testing.assert_allclose(whole, single, rtol=1e-5, atol=1e-6)


def test_demo_model_auc_on_fresh_held_out_events(model_dir: Path) -> None:
    engine = InferenceEngine(DemoFraudHandler(model_dir), CPU)
    held_out = generate_events(20_000, seed=987_654)  # never seen in training
    scores = engine.run(held_out.features).outputs["fraud_score"]
    auc = roc_auc(held_out.labels, scores)
    assert auc >= 0.95, f"ROC AUC {auc:.4f} < 0.95"
    assert 0.02 < held_out.labels.mean() < 0.5  # the task is neither trivial nor degenerate


def test_roc_auc_reference_values() -> None:
    assert roc_auc(np.array([0, 0, 1, 1]), np.array([0.1, 0.2, 0.3, 0.4])) == 1.0
    assert roc_auc(np.array([0, 0, 1, 1]), np.array([0.4, 0.3, 0.2, 0.1])) == 0.0
    assert roc_auc(np.array([0, 1]), np.array([0.5, 0.5])) == 0.5


def test_missing_model_is_unrecoverable_with_a_hint(tmp_path: Path) -> None:
    with pytest.raises(UnrecoverableModelError, match="train-model"):
        InferenceEngine(DemoFraudHandler(tmp_path), CPU)


def test_an_unreadable_model_file_is_named_as_unreadable_not_missing(
        model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An image's model written by root with mode 0600 and read as another user: safetensors reported "No such file
    or directory". (Root reads any file, so the refusal is the operating system's error, raised where it would be;
    the image test runs the real one as uid 10001.)"""
    weights = model_dir / "model.safetensors"
    read_bytes = Path.read_bytes

    def refuse(self: Path) -> bytes:
        if self == weights:
            raise PermissionError(13, "Permission denied", str(self))
        return read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", refuse)
    with pytest.raises(UnrecoverableModelError, match=r"^model file "
                       rf"{weights} is not readable by this process \(uid \d+ gid \d+; owner uid \d+ gid \d+, "
                       r"mode -rw.*\): make it readable \(chmod a\+r\), or run as its owner"):
        InferenceEngine(DemoFraudHandler(model_dir), CPU)


def test_wrong_feature_count_is_a_model_error(model_dir: Path) -> None:
    engine = InferenceEngine(DemoFraudHandler(model_dir), CPU)
    with pytest.raises(ModelError):
        engine.run(np.zeros((4, 31), dtype=np.float32))


class ShortHandler(DemoFraudHandler):
    def postprocess(self, raw: torch.Tensor) -> dict[str, np.ndarray]:
        out = super().postprocess(raw)
        return {k: v[:-1] for k, v in out.items()}


def test_handler_returning_wrong_row_count_is_caught(model_dir: Path) -> None:
    engine = InferenceEngine(ShortHandler(model_dir), CPU)
    with pytest.raises(ModelError, match="expected 5 rows"):
        engine.run(np.zeros((5, 32), dtype=np.float32))


def test_handler_lookup() -> None:
    assert isinstance(create_handler("demo", None), DemoFraudHandler)
    assert isinstance(create_handler("stream.models.demo:DemoFraudHandler", None), DemoFraudHandler)
    with pytest.raises(ConfigError, match="unknown model"):
        create_handler("resnet", None)
    with pytest.raises(ConfigError, match="cannot import"):
        create_handler("stream.models.demo:Nope", None)


def test_device_selection() -> None:
    assert select_device("cpu") == CPU
    assert select_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA"):
            select_device("cuda")


def test_training_runs_on_one_thread_and_gives_the_caller_its_threads_back(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from stream.models import train_demo

    before = torch.get_num_threads()
    seen: list[int] = []
    original = train_demo._train

    def watched(*args: Any) -> dict[str, float]:
        seen.append(torch.get_num_threads())
        return original(*args)

    monkeypatch.setattr(train_demo, "_train", watched)
    result = train_demo.train(tmp_path, n_train=2_000, epochs=1)
    assert seen == [1] and torch.get_num_threads() == before
    assert 0.0 < result["positive_rate"] < 1.0 and (tmp_path / "config.json").is_file()
