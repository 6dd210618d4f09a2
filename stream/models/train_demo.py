"""Trains the demo fraud MLP on the demo events (`stream.models.demo_events`) and saves safetensors + config.json."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save

from stream.models.demo import CONFIG_FILE, DEFAULT_MODEL_DIR, WEIGHTS_FILE, FraudMLP
from stream.models.demo_events import N_FEATURES, generate_events

log = logging.getLogger(__name__)
HIDDEN = (64, 32)
TRAIN_SEED = 7_000_001  # disjoint from the seeds the demo and tests publish


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve by the rank-sum (Mann-Whitney) formula, ties averaged."""
    labels = np.asarray(labels, dtype=bool)
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = np.asarray(scores)[order]
    ranks = np.empty(len(scores), dtype=np.float64)
    i = 0
    while i < len(scores):
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    n_pos = int(labels.sum())
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        raise ValueError("AUC needs both classes")
    return float((ranks[labels].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def train(out_dir: Path = DEFAULT_MODEL_DIR, *, n_train: int = 200_000, epochs: int = 8,
          seed: int = TRAIN_SEED) -> dict[str, float]:
    """Train, evaluate on a fresh held-out block, save; returns {"auc": ..., "positive_rate": ...}. On one torch
    thread: this MLP's batches are too small to gain from more on idle cores, and beside other busy processes (an
    image's build beside tests, the tests' own workers) threads that spin waiting for each other took several times
    as long. The weights are the same either way."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(out_dir, n_train, epochs, seed)
    finally:
        torch.set_num_threads(threads)


def _train(out_dir: Path, n_train: int, epochs: int, seed: int) -> dict[str, float]:
    torch.manual_seed(seed)
    data = generate_events(n_train, seed=seed)
    x = torch.from_numpy(data.features)
    y = torch.from_numpy(data.labels.astype(np.float32))
    model = FraudMLP(N_FEATURES, HIDDEN)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    batch = 512
    for epoch in range(epochs):
        perm = torch.randperm(n_train)
        for start in range(0, n_train, batch):
            idx = perm[start : start + batch]
            optimizer.zero_grad()
            loss = loss_fn(model(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
        log.info("epoch %d loss %.4f", epoch, float(loss.detach()))
    held_out = generate_events(50_000, seed=seed + 1)
    with torch.inference_mode():
        scores = torch.sigmoid(model(torch.from_numpy(held_out.features))).numpy()
    auc = roc_auc(held_out.labels, scores)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Written by Python (mode 0666 less the umask, as any file), not by safetensors' save_file (0600: an image's
    # model trained as root was unreadable to the image's user)
    (out_dir / WEIGHTS_FILE).write_bytes(save({k: v.contiguous() for k, v in model.state_dict().items()}))
    config = {
        "name": "demo-fraud-mlp",
        "version": "1",
        "n_features": N_FEATURES,
        "hidden": list(HIDDEN),
        "threshold": 0.5,
        "train_seed": seed,
        "held_out_auc": round(auc, 4),
    }
    (out_dir / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return {"auc": auc, "positive_rate": float(data.labels.mean())}


def ensure_trained(out_dir: Path = DEFAULT_MODEL_DIR) -> Path:
    """Train the demo model into ``out_dir`` unless it is already there."""
    if not (out_dir / WEIGHTS_FILE).is_file() or not (out_dir / CONFIG_FILE).is_file():
        log.info("training the demo model into %s", out_dir)
        train(out_dir)
    return out_dir
